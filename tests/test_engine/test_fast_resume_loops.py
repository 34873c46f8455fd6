"""The fast-resume loops inside real (in-process) mmengine Runners."""
import json
import os.path as osp
import subprocess
import sys

import pytest
from fast_resume_toys import (Recorder, ToyIterable, make_runner,
                              recorder_of)

from mmdata_plugin.engine import FastResumeHook
from mmdata_plugin.sample_order import DataPositionError
from mmdata_plugin.utils import (UnsafeCheckpointError, load_from_local_safely,
                                 trust_checkpoint)

ITER_LOOP = 'FastResumeIterBasedTrainLoop'
EPOCH_LOOP = 'FastResumeEpochBasedTrainLoop'


def train(tmp_path, name, train_cfg, **kwargs):
    work_dir = tmp_path / name
    work_dir.mkdir()
    runner = make_runner(work_dir, train_cfg, **kwargs)
    runner.train()
    return recorder_of(runner), work_dir


def test_drop_in_for_the_stock_iter_loop(tmp_path):
    """Same hooks in the same order, validation schedule, dynamic
    intervals, stop_training, and the same sample order as stock."""
    cfg = dict(max_iters=12, val_interval=4, dynamic_intervals=[(6, 3)])
    runs = {
        loop: train(
            tmp_path,
            loop,
            dict(type=loop, **cfg),
            val_interval=True,
            recorder=Recorder(stop_at=11))[0]
        for loop in ('IterBasedTrainLoop', ITER_LOOP)
    }
    stock, ours = runs['IterBasedTrainLoop'], runs[ITER_LOOP]
    assert ours.events == stock.events
    assert ('before_val', 9, None) in ours.events
    assert ours.iterations[-1]['iter'] == 10
    assert [r['index'] for r in ours.iterations] == \
        [r['index'] for r in stock.iterations]


@pytest.mark.compat
def test_resume_replays_data_and_training_randomness(tmp_path):
    cfg = dict(type=ITER_LOOP, max_iters=10)
    full, work_dir = train(tmp_path, 'full', cfg)
    resumed, _ = train(
        tmp_path,
        'resumed',
        cfg,
        resume_from=str(work_dir / 'iter_4.pth'))
    assert resumed.iterations == full.iterations[4:]
    assert 'Fast resume: skipped 4 batches (16 samples on all ranks) ' \
        'without loading any sample, by index arithmetic on ' \
        'InfiniteSampler' in log_of(tmp_path / 'resumed')
    checkpoint = load_from_local_safely(str(work_dir / 'iter_4.pth'))
    assert checkpoint['meta']['data_position']['consumed_samples'] == 16


def test_stock_loop_checkpoint_resumes(tmp_path):
    stock, work_dir = train(tmp_path, 'stock',
                            dict(type='IterBasedTrainLoop', max_iters=10))
    assert 'data_position' not in load_from_local_safely(
        str(work_dir / 'iter_4.pth'))['meta']
    ours, _ = train(
        tmp_path,
        'ours',
        dict(type=ITER_LOOP, max_iters=10),
        resume_from=str(work_dir / 'iter_4.pth'))
    assert [r['index'] for r in ours.iterations] == \
        [r['index'] for r in stock.iterations[4:]]


# A stock mmengine run, in a process that never imports mmdata_plugin:
# its checkpoints are what users of stock mmengine have.
_STOCK_RUN = """
import json, pathlib, sys
sys.path.insert(0, sys.argv[1])
from fast_resume_toys import make_runner, recorder_of
runner = make_runner(pathlib.Path(sys.argv[2]),
                     dict(type='IterBasedTrainLoop', max_iters=6),
                     num_workers=1)
runner.train()
assert not any(name.startswith('mmdata_plugin') for name in sys.modules)
print(json.dumps([r['index'] for r in recorder_of(runner).iterations]))
"""


@pytest.mark.compat
def test_stock_mmengine_and_our_checkpoints_resume_with_workers(
        tmp_path, monkeypatch):
    """On every torch: a stock mmengine checkpoint (which pickles
    ``builtins.getattr``) resumes once trusted, one written by our loops
    without; both with DataLoader workers, both exactly."""
    monkeypatch.delenv('MMDATA_TRUSTED_CHECKPOINTS', raising=False)
    stock_dir = tmp_path / 'stock'
    stock_dir.mkdir()
    written = subprocess.run(
        [sys.executable, '-c', _STOCK_RUN,
         osp.dirname(osp.abspath(__file__)), str(stock_dir)],
        capture_output=True, text=True, timeout=600)
    assert written.returncode == 0, written.stderr
    stock_order = json.loads(written.stdout.strip().splitlines()[-1])
    stock_checkpoint = str(stock_dir / 'iter_4.pth')
    cfg = dict(type=ITER_LOOP, max_iters=6)
    with pytest.raises(UnsafeCheckpointError, match='builtins.getattr'):
        train(tmp_path, 'refused', cfg, num_workers=1,
              resume_from=stock_checkpoint)
    trust_checkpoint(stock_checkpoint)
    resumed, _ = train(tmp_path, 'from_stock', cfg, num_workers=1,
                       resume_from=stock_checkpoint)
    assert [r['index'] for r in resumed.iterations] == stock_order[4:]

    full, work_dir = train(tmp_path, 'ours', cfg, num_workers=1)
    ours, _ = train(tmp_path, 'from_ours', cfg, num_workers=1,
                    resume_from=str(work_dir / 'iter_4.pth'))
    assert ours.iterations == full.iterations[4:]


@pytest.mark.parametrize('checkpoint', ['iter_8.pth', 'iter_12.pth'])
def test_epoch_loop_resumes_mid_epoch(tmp_path, checkpoint):
    # 23 samples, batch 4: 6 batches per epoch. iter_8 is batch 2 of epoch
    # 1; iter_12 is the last batch of epoch 1, before its after_train_epoch.
    cfg = dict(type=EPOCH_LOOP, max_epochs=3, val_interval=1)
    full, work_dir = train(
        tmp_path, 'full', cfg, sampler='DefaultSampler', val_interval=True)
    resumed, _ = train(
        tmp_path,
        'resumed',
        cfg,
        sampler='DefaultSampler',
        val_interval=True,
        resume_from=str(work_dir / checkpoint))
    done = int(checkpoint[5:-4])
    assert resumed.iterations == full.iterations[done:]
    # The interrupted epoch still ends with its epoch hooks and validation.
    last_trained = full.events.index(('after_train_iter', done - 1, done - 7))
    assert resumed.events[:2] == [('before_train', done, None),
                                  ('before_train_epoch', done, None)]
    assert resumed.events[2:] == full.events[last_trained + 1:]


def test_epoch_loop_resumes_an_epoch_checkpoint(tmp_path):
    cfg = dict(type=EPOCH_LOOP, max_epochs=3)
    options = dict(
        sampler='DefaultSampler',
        checkpoint_interval=1,
        checkpoint_by_epoch=True)
    full, work_dir = train(tmp_path, 'full', cfg, **options)
    resumed, _ = train(
        tmp_path,
        'resumed',
        cfg,
        resume_from=str(work_dir / 'epoch_1.pth'),
        **options)
    assert resumed.iterations == full.iterations[6:]


def test_epoch_loop_resumes_a_stock_checkpoint_mid_epoch(tmp_path):
    stock, work_dir = train(
        tmp_path,
        'stock',
        dict(type='EpochBasedTrainLoop', max_epochs=2),
        sampler='DefaultSampler')
    ours, _ = train(
        tmp_path,
        'ours',
        dict(type=EPOCH_LOOP, max_epochs=2),
        sampler='DefaultSampler',
        resume_from=str(work_dir / 'iter_8.pth'))
    assert [r['index'] for r in ours.iterations] == \
        [r['index'] for r in stock.iterations[8:]]
    assert ours.iterations[0]['batch_idx'] == 2


def test_contradicting_checkpoint_is_refused(tmp_path):
    _, work_dir = train(tmp_path, 'infinite',
                        dict(type=ITER_LOOP, max_iters=4))
    with pytest.raises(DataPositionError) as error:
        train(
            tmp_path,
            'default',
            dict(type=ITER_LOOP, max_iters=6),
            sampler='DefaultSampler',
            resume_from=str(work_dir / 'iter_4.pth'))
    assert ("sampler is 'InfiniteSampler' in the checkpoint but "
            "'DefaultSampler' in this run") in str(error.value)


def log_of(work_dir):
    return next(work_dir.glob('*/*.log')).read_text()


def test_iterable_dataset_falls_back_with_a_warning(tmp_path):
    cfg = dict(type=ITER_LOOP, max_iters=6)
    full, work_dir = train(
        tmp_path, 'full', cfg, sampler=None, dataset=ToyIterable())
    resumed, resumed_dir = train(
        tmp_path,
        'resumed',
        cfg,
        sampler=None,
        dataset=ToyIterable(),
        resume_from=str(work_dir / 'iter_4.pth'))
    assert ('WARNING - Fast resume is impossible here: the train dataset '
            '(ToyIterable) is an IterableDataset') in log_of(resumed_dir)
    assert 'Loading and dropping 4 batches instead' in log_of(resumed_dir)
    assert [r['index'] for r in resumed.iterations] == \
        [r['index'] for r in full.iterations[4:]]


class PeekingHook(Recorder):
    """Breaks the contract: reads a batch in before_train."""

    def __init__(self):
        super().__init__()
        self.before_train = self.peek

    def peek(self, runner):
        next(runner.train_loop.dataloader_iterator)


def test_reading_batches_before_positioning_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match='read before the loop positioned'):
        train(tmp_path, 'peek', dict(type=ITER_LOOP, max_iters=2),
              recorder=PeekingHook())


def test_hook_is_registered_once_and_bound(tmp_path):
    work_dir = tmp_path / 'w'
    work_dir.mkdir()
    runner = make_runner(work_dir, dict(type=ITER_LOOP, max_iters=1))
    loop = runner.train_loop
    hooks = [h for h in runner.hooks if isinstance(h, FastResumeHook)]
    assert len(hooks) == 1 and hooks[0].loop is loop
    assert loop.dataloader_iterator.started is False


def test_a_rank_sharded_dataset_with_a_stock_sampler_is_warned(
        tmp_path, monkeypatch):
    from mmdata_plugin.engine.runner import fast_resume_loops
    ann = tmp_path / 'ann.txt'
    ann.write_text(''.join(f'{i}.jpg 0\n' for i in range(8)))
    given = []
    real_advice = fast_resume_loops.stock_sampler_advice
    monkeypatch.setattr(fast_resume_loops, 'stock_sampler_advice',
                        lambda loader: given.append(real_advice(loader)))
    for sampler in ('InfiniteSampler', 'RankShardedInfiniteSampler'):
        work_dir = tmp_path / sampler
        work_dir.mkdir()
        make_runner(
            work_dir,
            dict(type=ITER_LOOP, max_iters=2),
            sampler=sampler,
            dataset=dict(type='RankShardedDataset',
                         ann_file=str(ann))).train_loop
    assert "type='RankShardedInfiniteSampler'" in given[0]
    assert given[1] is None
