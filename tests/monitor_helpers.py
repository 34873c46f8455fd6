"""A data pipeline with known stage costs, for the data-monitor tests.

Each stage sleeps a set time: file reads through a registered mmengine
fileio backend (``sleepy://``), two transforms, the collate function, and
the model step. Module-level and picklable, so spawn workers (which import
this module) get the same pipeline.
"""
import hashlib
import itertools
import os
import time

import cv2
import numpy as np
import torch
from mmengine.dataset import BaseDataset, pseudo_collate
from mmengine.evaluator import BaseMetric
from mmengine.fileio import BaseStorageBackend, register_backend
from mmengine.model import BaseModel
from mmengine.runner import IterBasedTrainLoop
from mmengine.runner.base_loop import BaseLoop
from mmengine.runner.utils import calc_dynamic_intervals

import mmdata_plugin  # noqa: F401  (registers transforms, the hook)
from mmdata_plugin.sample_order import SampleIndex
from mmdata_plugin.utils.torch_internals import (held_iterator,
                                                 set_held_iterator,
                                                 shutdown_workers,
                                                 started_iterator)

IMAGE_SIDE = 16


def _png(seed: int) -> bytes:
    img = np.random.default_rng(seed).integers(
        0, 255, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
    return cv2.imencode('.png', img)[1].tobytes()


_IMAGES = [_png(i) for i in range(8)]


class SleepyBackend(BaseStorageBackend):
    """``sleepy://<ms>/<n>.png``: sleeps ``ms`` then returns a PNG."""

    def get(self, filepath):
        ms, name = str(filepath)[len('sleepy://'):].split('/')
        time.sleep(float(ms) / 1e3)
        return _IMAGES[int(name.split('.')[0]) % len(_IMAGES)]

    def get_text(self, filepath, encoding='utf-8'):
        raise OSError(f'{filepath}: sleepy:// holds images only')


register_backend('sleepy', SleepyBackend, prefixes='sleepy', force=True)


class Sleep:
    """A transform that takes ``ms`` milliseconds."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, results):
        time.sleep(self.ms / 1e3)
        return results


class SlowSample:
    """A transform that takes ``ms`` milliseconds for sample ``index`` only:
    its batch is ready after batches asked for later."""

    def __init__(self, index: int, ms: float) -> None:
        self.index, self.ms = index, ms

    def __call__(self, results):
        if results['sample_idx'] == self.index:
            time.sleep(self.ms / 1e3)
        return results


class DropEvery:
    """Returns None for every ``n``-th call (the dataset re-fetches)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __call__(self, results):
        self.calls += 1
        return None if self.calls % self.n == 0 else results


class SleepyCollate:
    """``pseudo_collate`` that takes ``ms`` milliseconds."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, samples):
        time.sleep(self.ms / 1e3)
        return pseudo_collate(samples)


class TupleCollate:
    """Collates to a ``(images, labels)`` tuple, not a dict."""

    def __call__(self, samples):
        inputs = torch.stack([s['inputs'] for s in samples])
        labels = torch.cat([s['data_samples'].gt_label for s in samples])
        return inputs, labels


class SleepyDataset(BaseDataset):
    """``num`` samples read from ``sleepy://<io_ms>/``.

    Args:
        num (int): Number of samples.
        io_ms (float): Read time per sample.
        **kwargs: ``BaseDataset`` arguments (``pipeline`` ...).
    """

    def __init__(self, num: int = 64, io_ms: float = 0.0, **kwargs) -> None:
        self.num, self.io_ms = num, io_ms
        super().__init__(**kwargs)

    def load_data_list(self):
        return [
            dict(img_path=f'sleepy://{self.io_ms}/{i}.png', gt_label=i % 3)
            for i in range(self.num)
        ]

    def get_cat_ids(self, idx):
        return [self.get_data_info(idx)['gt_label']]


class CrashingDataset(SleepyDataset):
    """:class:`SleepyDataset` whose sample ``crash_at`` ends any process
    that loads it but ``spared_pid``: a sample that crashes its worker.

    Args:
        crash_at (int): The sample.
        spared_pid (int): The process that loads it normally.
        **kwargs: :class:`SleepyDataset` arguments.
    """

    def __init__(self, crash_at: int, spared_pid: int, **kwargs) -> None:
        self.crash_at, self.spared_pid = crash_at, spared_pid
        super().__init__(**kwargs)

    def prepare_data(self, idx):
        if idx == self.crash_at and os.getpid() != self.spared_pid:
            os._exit(13)
        return super().prepare_data(idx)


def sleepy_pipeline(transform_ms=(1.0, 5.0), crop=None):
    """Load (read + decode), sleeping transforms, optional random crop,
    pack."""
    pipeline = [dict(type='LoadImageFromFile')]
    pipeline += [Sleep(ms) for ms in transform_ms]
    if crop:
        pipeline.append(dict(type='RandomImageCrop', crop_size=crop))
    pipeline.append(dict(type='PackImageLabelInputs'))
    return pipeline


def batch_digest(batch) -> str:
    """A hash of a collated batch (inputs, labels, sample indices)."""
    digest = hashlib.sha1()
    if isinstance(batch, dict):
        for tensor in batch['inputs']:
            digest.update(tensor.cpu().numpy().tobytes())
        for sample in batch['data_samples']:
            digest.update(str(sample.sample_idx).encode())
            digest.update(sample.gt_label.cpu().numpy().tobytes())
    else:
        for tensor in batch:
            digest.update(tensor.cpu().numpy().tobytes())
    return digest.hexdigest()


class SleepyModel(BaseModel):
    """Sleeps ``step_ms`` per training step and records what it was fed.

    ``seen`` lists, per step, the digest of the batch ``train_step`` got and
    whether it held anything but the pipeline's output.
    """

    def __init__(self, step_ms: float = 0.0) -> None:
        super().__init__()
        self.step_ms = step_ms
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def train_step(self, data, optim_wrapper):
        foreign = (
            set(data) - {'inputs', 'data_samples'}
            if isinstance(data, dict) else {type(x).__name__
                                            for x in data} - {'Tensor'})
        self.seen.append((batch_digest(data), sorted(foreign)))
        time.sleep(self.step_ms / 1e3)
        return super().train_step(data, optim_wrapper)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        if mode == 'predict':
            return data_samples
        if isinstance(inputs, list):
            inputs = torch.stack(inputs)
        return dict(loss=(self.weight * inputs.float().mean()).sum())


class SeedingDataset:
    """Stands in for the fast-resume loops' per-sample seeding wrapper.

    Seeds numpy from ``index.seed`` (a :class:`SampleIndex`) before
    fetching. Like the real one it owns only ``dataset``: every other
    attribute, read or written (``metainfo``, ``pipeline``), is the wrapped
    dataset's.
    """

    def __init__(self, dataset) -> None:
        object.__setattr__(self, 'dataset', dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        if not isinstance(index, SampleIndex) or index.seed is None:
            raise TypeError(f'expected a seeded SampleIndex, got {index!r}')
        np.random.seed(index.seed)
        return self.dataset[index]

    def __getattr__(self, name):
        if name == 'dataset':
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __setattr__(self, name, value) -> None:
        setattr(self.dataset, name, value)


class SeededSampler:
    """Endless shuffled :class:`SampleIndex` stream with per-sample seeds."""

    def __init__(self, dataset, seed: int = 0) -> None:
        self.size = len(dataset)
        self.seed = seed

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        draw = 0
        generator = torch.Generator().manual_seed(self.seed)
        while True:
            for index in torch.randperm(self.size, generator=generator):
                yield SampleIndex(int(index), seed=self.seed * 100003 + draw)
                draw += 1


class _LazyInfiniteIterator:
    """Created in the loop's ``__init__``; starts workers on first next()."""

    def __init__(self, dataloader) -> None:
        self._dataloader = dataloader
        # Where mmengine's _InfiniteDataloaderIterator keeps it.
        set_held_iterator(self, None)

    def __iter__(self):
        return self

    def __next__(self):
        if held_iterator(self) is None:
            set_held_iterator(self, iter(self._dataloader))
        return next(held_iterator(self))


class LazyIterBasedTrainLoop(IterBasedTrainLoop):
    """The loop contract of the fast-resume loops, for the monitor tests:
    ``dataloader_iterator`` is one stable object made in ``__init__`` that
    starts no worker before the first ``next()``."""

    def __init__(self,
                 runner,
                 dataloader,
                 max_iters: int,
                 val_begin: int = 1,
                 val_interval: int = 1000) -> None:
        BaseLoop.__init__(self, runner, dataloader)
        self._max_iters, self._max_epochs = int(max_iters), 1
        self._epoch = self._iter = 0
        self.val_begin, self.val_interval = val_begin, val_interval
        self.stop_training = False
        self.dynamic_milestones, self.dynamic_intervals = (
            calc_dynamic_intervals(val_interval, None))
        self.dataloader_iterator = _LazyInfiniteIterator(self.dataloader)


def train(work_dir,
          *,
          loop='iter',
          num_workers=2,
          persistent=True,
          pin=False,
          start='fork',
          monitor=True,
          step_ms=0.0,
          max_iters=10,
          io_ms=0.0,
          transform_ms=(0.5, 0.5),
          crop=8,
          collate=None,
          dataset=None,
          hook=None,
          val=False,
          batch_sampler=None,
          feed=False,
          **cfg):
    """Train :class:`SleepyModel` on the sleepy pipeline; return the runner.

    ``loop`` is ``'iter'`` / ``'epoch'`` (stock mmengine loops) or
    ``'lazy'`` (:class:`LazyIterBasedTrainLoop` + :class:`SeedingDataset`).
    """
    from mmengine.runner import Runner
    if dataset is None:
        dataset = SleepyDataset(
            num=24, io_ms=io_ms, pipeline=sleepy_pipeline(transform_ms, crop))
    sampler = dict(type='InfiniteSampler', shuffle=True)
    if loop == 'lazy':
        dataset = SeedingDataset(dataset)
        sampler = dict(type=SeededSampler)
        train_cfg = dict(type=LazyIterBasedTrainLoop, max_iters=max_iters)
    elif loop == 'iter':
        train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters)
    else:
        sampler = dict(type='DefaultSampler', shuffle=True)
        train_cfg = dict(
            type='EpochBasedTrainLoop',
            max_epochs=-(-max_iters * 2 // len(dataset)))
    loader = dict(
        batch_size=2,
        num_workers=num_workers,
        persistent_workers=persistent and num_workers > 0,
        pin_memory=pin,
        sampler=sampler,
        dataset=dataset,
        collate_fn=collate or dict(type='pseudo_collate'))
    if num_workers:
        loader['multiprocessing_context'] = start
    if batch_sampler:
        loader['batch_sampler'] = batch_sampler
    if val:
        train_cfg['val_interval'] = val
        cfg.update(
            val_dataloader=dict(
                batch_size=4,
                dataset=SleepyDataset(num=4, pipeline=sleepy_pipeline((), 8)),
                sampler=dict(type='DefaultSampler', shuffle=False)),
            val_cfg=dict(type='ValLoop'),
            val_evaluator=dict(type=CountingMetric))
    hooks = [
        dict(
            dict(
                type='DataMonitorHook',
                interval=2,
                table_interval=4,
                warmup_iters=1,
                plot=False), **(hook or {}))
    ] if monitor else []
    if feed:
        hooks.append(
            dict(type='DeviceFeedHook',
                 **(feed if isinstance(feed, dict) else {})))
    hooks += cfg.pop('custom_hooks', [])
    default_hooks = dict(
        logger=dict(type='LoggerHook', interval=1),
        checkpoint=dict(type='CheckpointHook', interval=10**6))
    default_hooks.update(cfg.pop('default_hooks', {}))
    runner_cfg = dict(
        model=SleepyModel(step_ms),
        work_dir=str(work_dir),
        experiment_name=f'dm_{next(_RUNS)}',
        train_dataloader=loader,
        train_cfg=train_cfg,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        default_hooks=default_hooks,
        custom_hooks=hooks,
        randomness=dict(seed=0),
        log_level='WARNING')
    runner_cfg.update(cfg)
    _wait_for_a_free_log_dir(str(work_dir))
    runner = Runner(**runner_cfg)
    try:
        runner.train()
    finally:
        release_workers(runner)
    return runner


def _wait_for_a_free_log_dir(work_dir: str) -> None:
    """mmengine names a run's log dir (and its scalars.json) by the second
    it starts in: a second run in the same work_dir (a resume) within that
    second would append to the first run's logs. Wait for the next one."""
    while os.path.isdir(
            os.path.join(work_dir, time.strftime('%Y%m%d_%H%M%S'))):
        time.sleep(0.05)


def release_workers(runner) -> None:
    """Stop the workers the train loop keeps (stock loops leave that to the
    garbage collector, where torch waits 5 s per worker to join)."""
    holder = getattr(runner.train_loop, 'dataloader_iterator', None)
    for iterator in (held_iterator(holder),
                     started_iterator(runner.train_dataloader)):
        shutdown_workers(iterator)


class CountingMetric(BaseMetric):
    """A validation metric that only counts samples."""

    def process(self, data_batch, data_samples):
        self.results.append(len(data_samples))

    def compute_metrics(self, results):
        return dict(samples=sum(results))


_RUNS = itertools.count()
