"""A tiny model, datasets and a recording hook to run real Runners fast."""
import random

import numpy as np
import torch
from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset, IterableDataset


class ToyDataset(Dataset):
    """23 samples whose 'augmentation' draws from all three global RNGs."""

    def __len__(self):
        return 23

    def __getitem__(self, index):
        draws = [random.random(), np.random.rand(), torch.rand(1).item()]
        return dict(inputs=torch.tensor(draws), index=int(index))


class ToyIterable(IterableDataset):

    def __len__(self):
        return 10_000

    def __iter__(self):
        for index in range(10_000):
            yield dict(inputs=torch.full((3, ), float(index)), index=index)


class ToyModel(BaseModel):
    """Draws from torch's global generator in its training step, like
    dropout."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)
        self.last_noise = None

    def forward(self, inputs, index=None, mode='tensor'):
        x = torch.stack(inputs)
        if mode == 'loss':
            self.last_noise = torch.rand(len(x), device=x.device)
            return dict(loss=(self.linear(x).squeeze(1) +
                              self.last_noise).pow(2).mean())
        return [dict(index=i) for i in index]


class ToyMetric(BaseMetric):

    def process(self, data_batch, data_samples):
        self.results.append(len(data_samples))

    def compute_metrics(self, results):
        return dict(toy=float(sum(results)))


class Recorder(Hook):
    """Records hook events and what each training iteration saw."""
    priority = 'VERY_LOW'
    EVENTS = ('before_train', 'before_train_epoch', 'before_train_iter',
              'after_train_iter', 'after_train_epoch', 'before_val',
              'after_val', 'after_train')

    def __init__(self, stop_at=None):
        self.events = []
        self.iterations = []
        self.stop_at = stop_at
        for event in self.EVENTS:
            setattr(self, event, self._recorder(event))

    def _recorder(self, event):

        def record(runner, batch_idx=None, data_batch=None, outputs=None,
                   **kwargs):
            self.events.append((event, runner.iter, batch_idx))
            if event == 'after_train_iter':
                self.iterations.append(
                    dict(
                        iter=runner.iter,
                        batch_idx=batch_idx,
                        index=list(data_batch['index']),
                        inputs=torch.stack(data_batch['inputs']).tolist(),
                        noise=runner.model.last_noise.tolist(),
                        loss=outputs['loss'].item()))
                if runner.iter + 1 == self.stop_at:
                    runner.train_loop.stop_training = True

        return record


def make_runner(work_dir,
                train_cfg,
                sampler='InfiniteSampler',
                dataset=None,
                num_workers=0,
                checkpoint_interval=4,
                checkpoint_by_epoch=False,
                resume_from=None,
                seed=0,
                val_interval=None,
                recorder=None):
    """A Runner over the toy pieces; ``resume_from`` resumes a checkpoint."""
    by_epoch = 'Epoch' in train_cfg['type']
    val = {}
    if val_interval is not None:
        val = dict(
            val_dataloader=dict(
                dataset=ToyDataset(),
                sampler=dict(type='DefaultSampler', shuffle=False),
                batch_size=8),
            val_cfg=dict(),
            val_evaluator=Evaluator(ToyMetric()))
    dataloader = dict(
        dataset=dataset if dataset is not None else ToyDataset(),
        batch_size=4,
        num_workers=num_workers,
        # A sampler type, or a whole sampler config.
        sampler=sampler and (dict(type=sampler, shuffle=True) if isinstance(
            sampler, str) else sampler))
    return Runner(
        model=ToyModel(),
        work_dir=str(work_dir),
        experiment_name=f'{work_dir.parent.name}-{work_dir.name}',
        train_dataloader=dataloader,
        train_cfg=train_cfg,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        default_hooks=dict(
            checkpoint=dict(
                type='CheckpointHook',
                interval=checkpoint_interval,
                by_epoch=checkpoint_by_epoch),
            logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[recorder or Recorder()],
        log_processor=dict(by_epoch=by_epoch),
        randomness=dict(seed=seed),
        resume=resume_from is not None,
        load_from=resume_from,
        **val)


def recorder_of(runner):
    return next(hook for hook in runner.hooks if isinstance(hook, Recorder))
