"""DeviceFeedHook + block_collate in real mmengine training runs: the model
gets the very batches of a run without them, and the monitor sees the
training process's data work."""
import json
import os.path as osp
import sys

import pytest
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from monitor_helpers import SleepyDataset, sleepy_pipeline, train
from torch.utils.data import DataLoader

from mmdata_plugin.engine import DeviceFeedHook

pytestmark = pytest.mark.filterwarnings(
    "ignore:'pin_memory' argument is set as true")
BLOCK = dict(type='block_collate', stack_inputs=False)


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
    cache = {}

    def get(loop):
        if loop not in cache:
            cache[loop] = train(tmp_path_factory.mktemp('reference'),
                                loop=loop, monitor=False).model.seen
        return cache[loop]

    return get


@pytest.mark.parametrize('loop,persistent,pin,start', [
    ('iter', True, True, 'fork'),
    ('iter', False, False, 'fork'),
    ('epoch', True, False, 'fork'),
    ('epoch', False, True, 'fork'),
    ('lazy', True, False, 'fork'),
    ('lazy', True, True, 'spawn'),
])
@pytest.mark.compat
def test_fed_blocks_reach_the_model_unchanged_and_are_measured(
        tmp_path, reference, loop, persistent, pin, start):
    runner = train(tmp_path, loop=loop, persistent=persistent, pin=pin,
                   start=start, collate=BLOCK, feed=True)
    assert runner.model.seen == reference(loop)
    with open(osp.join(runner.log_dir, 'data_monitor.json')) as f:
        report = json.load(f)
    trainer = report['ranks'][0]['trainer']
    assert {'receive', 'to_device', 'unpack', 'preprocess'} <= set(trainer)
    assert report['context']['collate'] == 'block_collate'
    assert report['context']['device_feed'] is True
    # The hook leaves the loader and the data preprocessor as they were.
    assert type(runner.train_dataloader) is DataLoader
    assert 'cast_data' not in vars(runner.model.data_preprocessor)
    assert 'forward' not in vars(runner.model.data_preprocessor)


def test_stacked_inputs_give_the_same_batches(tmp_path, reference):
    runner = train(tmp_path, collate=dict(type='block_collate'), feed=True,
                   monitor=False)
    assert runner.model.seen == reference('iter')


def test_the_hook_alone_passes_other_batches_unchanged(tmp_path, reference):
    runner = train(tmp_path, feed=True, monitor=False)
    assert runner.model.seen == reference('iter')


def test_without_a_monitor_and_without_workers(tmp_path):
    runner = train(tmp_path, num_workers=0, collate=BLOCK, feed=True,
                   monitor=False)
    assert runner.model.seen == train(tmp_path / 'ref', num_workers=0,
                                      monitor=False).model.seen


class SwitchIntervalProbe(Hook):
    """Records the interpreter's switch interval at each training step."""

    seen = []

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        self.seen.append(sys.getswitchinterval())


@pytest.mark.parametrize('feed,during', [(True, 0.0005),
                                         (dict(switch_interval=0.002), 0.002),
                                         (dict(switch_interval=None), None)])
def test_the_switch_interval_is_short_while_fed_and_put_back(
        tmp_path, feed, during):
    before = sys.getswitchinterval()
    SwitchIntervalProbe.seen.clear()
    train(tmp_path, collate=BLOCK, feed=feed, monitor=False, max_iters=3,
          custom_hooks=[dict(type=SwitchIntervalProbe)])
    assert SwitchIntervalProbe.seen == [during or before] * 3
    assert sys.getswitchinterval() == before


def test_without_workers_the_switch_interval_is_left_alone(tmp_path):
    before = sys.getswitchinterval()
    SwitchIntervalProbe.seen.clear()
    train(tmp_path, num_workers=0, collate=BLOCK, feed=True, monitor=False,
          max_iters=2, custom_hooks=[dict(type=SwitchIntervalProbe)])
    assert SwitchIntervalProbe.seen == [before] * 2


@pytest.mark.parametrize('value', [0, -1, '5ms'])
def test_a_bad_switch_interval_is_named(value):
    with pytest.raises(ValueError, match='switch_interval'):
        DeviceFeedHook(switch_interval=value)


def test_the_device_is_named_and_documented():
    assert DeviceFeedHook().device is None
    assert str(DeviceFeedHook(device='cpu').device) == 'cpu'
    assert DeviceFeedHook.priority == 'BELOW_NORMAL'
    assert SleepyDataset  # the pipeline the runs above use


def test_blocks_without_the_hook_read_as_the_batch(tmp_path, reference):
    # The data preprocessor's cast_data walks the block as a Mapping.
    runner = train(tmp_path, collate=BLOCK, monitor=True)
    assert runner.model.seen == reference('iter')


def test_without_workers_the_pipeline_draws_where_it_draws_without_the_hook(
        tmp_path):
    # The fast-resume loop reseeds the main process at each iteration; a
    # pipeline running there (no workers, no per-sample seeds) must load
    # batch i after that reseeding, not during step i-1.
    train_cfg = dict(type='FastResumeIterBasedTrainLoop', max_iters=6,
                     seed_per_sample=False)
    fed = train(tmp_path / 'fed', num_workers=0, collate=BLOCK, feed=True,
                monitor=False, train_cfg=train_cfg)
    plain = train(tmp_path / 'plain', num_workers=0, monitor=False,
                  collate=BLOCK, train_cfg=train_cfg)
    assert fed.model.seen == plain.model.seen


class BatchTypeMetric(BaseMetric):
    """Records the type of each validation batch in ``seen``."""

    seen = []

    def process(self, data_batch, data_samples):
        self.seen.append(type(data_batch).__name__)
        self.results.append(len(data_samples))

    def compute_metrics(self, results):
        return dict(samples=sum(results))


@pytest.mark.parametrize('pin', [False, True])
def test_validation_gets_the_batches_it_gets_without_the_hook(tmp_path, pin):
    types = {}
    for feed in (False, True):
        BatchTypeMetric.seen.clear()
        train(
            tmp_path / str(feed), collate=BLOCK, feed=feed, monitor=False,
            max_iters=4, pin=pin,
            train_cfg=dict(type='IterBasedTrainLoop', max_iters=4,
                           val_interval=2),
            val_dataloader=dict(
                batch_size=4, num_workers=2, pin_memory=pin,
                collate_fn=dict(type='block_collate'),
                dataset=SleepyDataset(num=8, pipeline=sleepy_pipeline((), 8)),
                sampler=dict(type='DefaultSampler', shuffle=False)),
            val_cfg=dict(type='ValLoop'),
            val_evaluator=dict(type=BatchTypeMetric))
        types[feed] = set(BatchTypeMetric.seen)
    assert types[True] == types[False] == {'dict'}


def test_a_fed_fast_resume_run_resumes_bitwise(tmp_path):
    # The feeder takes one batch ahead; the saved position counts the
    # batches it handed out, so the resumed run continues where the model
    # stopped.
    kwargs = dict(collate=dict(type='block_collate'), feed=True,
                  monitor=False)

    def loop(max_iters):
        return dict(type='FastResumeIterBasedTrainLoop', max_iters=max_iters)

    reference = train(tmp_path / 'ref', train_cfg=loop(8), **kwargs)
    checkpoint = dict(type='CheckpointHook', interval=4, by_epoch=False)
    train(tmp_path / 'run', train_cfg=loop(4),
          default_hooks=dict(checkpoint=checkpoint), **kwargs)
    resumed = train(tmp_path / 'run', train_cfg=loop(8), resume=True,
                    load_from=str(tmp_path / 'run' / 'iter_4.pth'), **kwargs)
    assert resumed.model.seen == reference.model.seen[4:]


@pytest.mark.compat
@pytest.mark.parametrize('loop', ['iter', 'lazy'])
def test_no_batch_stays_placed_after_training(tmp_path, loop):
    # The loop keeps its iterator after train() (for a later test() or
    # val()); the batch the feeder placed ahead must not stay on the device
    # with it.
    import gc

    from mmdata_plugin.handover import DeviceBatch
    runner = train(tmp_path, loop=loop, collate=BLOCK, feed=True,
                   monitor=False)
    gc.collect()
    assert runner.train_loop.dataloader_iterator is not None
    assert not [o for o in gc.get_objects() if type(o) is DeviceBatch]
