"""DataMonitorHook in real mmengine training runs.

The loop x workers x persistent x pin_memory x start-method matrix runs the
sleepy pipeline of monitor_helpers; every run is checked against a run
without the hook: the model must get the very same batches.
"""
import glob
import json
import os.path as osp
import threading
import time
from types import SimpleNamespace

import pytest
from helpers import DEMO_CONFIG, REPO_ROOT, TRAIN_SCRIPT, quick_cfg_options
from mmengine.config import Config
from monitor_helpers import (SeedingDataset, SleepyCollate, SleepyDataset,
                             TupleCollate, train)
from torch.utils.data import BatchSampler, DataLoader

from mmdata_plugin.data_monitor.loader_monitor import HAND_OVER_SECONDS
from mmdata_plugin.data_monitor.worker_timing import (TimedCollate,
                                                      TimedTransform)
from mmdata_plugin.engine import DataMonitorHook, apply_data_monitor_env
from mmdata_plugin.testing import python_path, run_ranks

LOOPS = ('iter', 'epoch', 'lazy')
# pin_memory=True runs on this CPU-only machine; torch warns it is a no-op.
pytestmark = pytest.mark.filterwarnings(
    "ignore:'pin_memory' argument is set as true")


def _report(runner) -> dict:
    with open(osp.join(runner.log_dir, 'data_monitor.json')) as f:
        return json.load(f)


def _matrix():
    cases = [(loop, 0, False, pin, 'fork') for loop in LOOPS
             for pin in (False, True)]
    cases += [(loop, 2, persistent, pin, 'fork') for loop in LOOPS
              for persistent in (False, True) for pin in (False, True)]
    # spawn workers import torch and mmengine (seconds each): one per loop.
    cases += [('iter', 2, True, True, 'spawn'),
              ('epoch', 2, False, False, 'spawn'),
              ('lazy', 2, True, False, 'spawn')]
    return cases


@pytest.fixture(scope='module')
def reference_batches(tmp_path_factory):
    """What the model gets without the hook, per loop and worker count."""
    cache = {}

    def get(loop, num_workers):
        if (loop, num_workers) not in cache:
            runner = train(
                tmp_path_factory.mktemp('reference'),
                loop=loop,
                num_workers=num_workers,
                monitor=False)
            cache[loop, num_workers] = runner.model.seen
        return cache[loop, num_workers]

    return get


class BucketBatchSampler(BatchSampler):
    """Keeps unfinished batches on the instance, as mmdet's
    AspectRatioBatchSampler does (two buckets: here by index parity)."""

    def __init__(self, sampler, batch_size, drop_last=False):
        super().__init__(sampler, batch_size, drop_last)
        self._aspect_ratio_buckets = [[], []]

    def __iter__(self):
        for index in self.sampler:
            bucket = self._aspect_ratio_buckets[index % 2]
            bucket.append(index)
            if len(bucket) == self.batch_size:
                yield bucket[:]
                del bucket[:]


def test_a_restarted_bucketing_batch_sampler_gives_the_same_batches(
        tmp_path):
    # The iteration-based loop starts its iterator (its workers prefetch
    # batches, leaving indices in the buckets) before the hook restarts it.
    batches = [
        train(tmp_path / str(monitor), loop='iter', num_workers=2,
              monitor=monitor,
              batch_sampler=dict(type=BucketBatchSampler)).model.seen
        for monitor in (False, True)
    ]
    assert batches[0] == batches[1]


@pytest.mark.parametrize('loop,workers,persistent,pin,start', _matrix())
def test_matrix_measures_without_changing_batches(tmp_path, reference_batches,
                                                  loop, workers, persistent,
                                                  pin, start):
    runner = train(
        tmp_path,
        loop=loop,
        num_workers=workers,
        persistent=persistent,
        pin=pin,
        start=start)
    assert runner.model.seen == reference_batches(loop, workers)
    assert all(not foreign for _, foreign in runner.model.seen)

    report = _report(runner)
    rank = report['ranks'][0]
    assert rank['steps'] >= 4
    assert [w['worker'] for w in rank['workers']] == (
        list(range(workers)) if workers else [-1])
    assert set(rank['stages']) == {'io', 'decode', 'fetch', 'collate'}
    assert list(rank['transforms']) == [
        '00_LoadImageFromFile', '01_Sleep', '02_Sleep', '03_RandomImageCrop',
        '04_PackImageLabelInputs'
    ]
    assert rank['transforms']['01_Sleep']['mean'] >= 2 * 0.5
    assert report['context']['num_workers'] == workers
    assert report['context']['start_method'] == (start if workers else None)

    assert [p['dataset'] for p in report['pipelines']] == [
        'dataset.dataset' if loop == 'lazy' else 'dataset'
    ]
    loader = runner.train_dataloader
    assert type(loader) is DataLoader
    assert not isinstance(loader.collate_fn, TimedCollate)
    dataset = loader.dataset.dataset if loop == 'lazy' else loader.dataset
    assert type(dataset) is SleepyDataset
    assert type(loader.dataset) is (
        SeedingDataset if loop == 'lazy' else SleepyDataset)
    assert not any(
        isinstance(t, TimedTransform) for t in dataset.pipeline.transforms)


def test_verdict_flips_with_the_model_step_and_names_the_stage(tmp_path):
    # Per batch of 2: read 2x4 ms, transforms 2x2 and 2x16 ms, collate 6 ms
    # on one worker: ~50 ms, against a 0 ms or a 500 ms model step (wide
    # margins: the cores are shared, and load stretches sleeps, CPU work
    # and the hand-over, but not to 5% of a 500 ms step). Every batch is
    # timed (sample_every=1), so the stages' self times must add up within
    # each batch's worker time exactly, not only on average over samples.
    costs = dict(
        num_workers=1,
        io_ms=4,
        transform_ms=(2, 16),
        collate=SleepyCollate(6),
        max_iters=14,
        hook=dict(warmup_iters=2, sample_every=1))
    fast = _report(train(tmp_path / 'fast', step_ms=0, **costs))
    slow = _report(train(tmp_path / 'slow', step_ms=500, **costs))

    assert fast['verdict']['input_bound'] == 'high', fast['verdict']
    assert slow['verdict']['input_bound'] == 'none', slow['verdict']
    for report in (fast, slow):
        rank = report['ranks'][0]
        stages, transforms = rank['stages'], rank['transforms']
        # Sleeps are lower bounds; each cost lands in its own stage.
        assert stages['io']['mean'] >= 8
        assert transforms['01_Sleep']['mean'] >= 4
        assert transforms['02_Sleep']['mean'] >= 32
        assert stages['collate']['mean'] >= 6
        assert 0 < stages['decode']['mean'] < stages['io']['mean']
        # Self time: the loader transform is not charged its read/decode.
        assert (transforms['00_LoadImageFromFile']['mean']
                < stages['io']['mean'] / 2)
        parts = sum(s['mean']
                    for s in [*stages.values(), *transforms.values()])
        assert 0.8 * rank['worker']['mean'] <= parts <= rank['worker']['mean']
        assert report['verdict']['bottleneck'] == '02_Sleep'
    assert fast['verdict']['workers_needed'] >= 2
    assert slow['verdict']['workers_needed'] == 1
    topics = [a['topic'] for a in fast['advice']]
    assert topics[:2] == ['workers', 'stage']
    assert '02_Sleep is' in fast['advice'][1]['text']
    assert slow['advice'] == []


def test_non_dict_batches_reach_the_model_unchanged(tmp_path,
                                                    reference_batches):
    runner = train(tmp_path, collate=TupleCollate(), num_workers=2)
    assert all(not foreign for _, foreign in runner.model.seen)
    assert _report(runner)['ranks'][0]['batches'] >= 4


def test_validation_checkpoints_and_resume_are_not_counted(tmp_path):
    runner = train(
        tmp_path,
        num_workers=0,
        max_iters=12,
        val=4,
        hook=dict(warmup_iters=0, settle_iters=0, table_interval=0),
        default_hooks=dict(
            checkpoint=dict(type='CheckpointHook', interval=6,
                            by_epoch=False)))
    rank = _report(runner)['ranks'][0]
    # 12 steps: the start-up batch and the steps right after validation
    # (4, 8) and checkpoint (6) are not counted (12 is the last).
    assert (rank['steps'], rank['skipped']) == (12 - 4, 4)

    resumed = train(
        tmp_path,
        num_workers=2,
        max_iters=16,
        hook=dict(warmup_iters=0, table_interval=0),
        resume=True)
    rank = _report(resumed)['ranks'][0]
    # The 12 batches skipped on resume are not steps: 4 trained, of which
    # the first (start-up, skipped batches) and the batches in flight are
    # not counted.
    assert rank['steps'] + rank['skipped'] == 4
    assert rank['skipped'] >= 1


def _logged_steps(runner, key='dm_wait_time'):
    """Iterations whose log line (scalars.json) has ``key``, and all."""
    lines = [
        json.loads(line)
        for line in open(osp.join(runner.log_dir, 'vis_data', 'scalars.json'))
    ]
    lines = [s for s in lines if 'loss' in s]  # train log lines
    return {s['step'] for s in lines if key in s}, {s['step'] for s in lines}


def test_log_lines_hold_only_what_the_interval_measured(tmp_path):
    # No worker: each step's batch is fetched in it, nothing in flight.
    first = train(
        tmp_path,
        num_workers=0,
        max_iters=8,
        hook=dict(warmup_iters=0, settle_iters=0, table_interval=0))
    measured, steps = _logged_steps(first)
    assert steps == set(range(1, 9)) and measured == set(range(2, 9))
    # Resumed: the message hub comes back with the last dm_* values; the
    # first iterations (start-up, settling) count nothing and log nothing.
    resumed = train(
        tmp_path,
        num_workers=0,
        max_iters=12,
        resume=True,
        hook=dict(warmup_iters=0, settle_iters=2, table_interval=0))
    measured, steps = _logged_steps(resumed)
    assert steps == set(range(9, 13))
    assert measured == {12}  # 9: start-up, 10-11: settling
    assert _logged_steps(resumed, 'dm_input_bound')[0] == {12}
    # An epoch spent settling (12 iterations an epoch) logs nothing either.
    epochs = train(
        tmp_path / 'epochs',
        loop='epoch',
        num_workers=0,
        max_iters=24,
        hook=dict(warmup_iters=0, settle_iters=12, table_interval=0))
    measured, steps = _logged_steps(epochs)
    assert steps == set(range(1, 25))
    assert measured == set(range(2, 13))


def test_the_log_lines_values_are_the_intervals_and_come_last_in_order():
    # The hook writes its buffers' single values in place: each line shows
    # its interval's means only, no key of an interval without a figure,
    # and the dm_* keys last in the same order (as new buffers were).
    from mmengine.logging import MessageHub

    from mmdata_plugin.engine.hooks.data_monitor_hook import LOG_SCALARS
    hub = MessageHub.get_instance('test_log_line_values')
    runner = SimpleNamespace(message_hub=hub)
    hook = DataMonitorHook()
    intervals = iter([
        dict(steps=2, wait=0.2, compute=0.6, batches=2, worker=0.8),
        dict(steps=2, wait=0.1, compute=0.3, batches=0, worker=0.0),
        dict(steps=4, wait=0.4, compute=0.4, batches=4, worker=2.0),
        dict(steps=0, wait=0.0, compute=0.0, batches=0, worker=0.0),
    ])
    hook.monitor = SimpleNamespace(take_interval=lambda: next(intervals))
    expected = [(0.1, 0.4, 0.25), (0.05, None, 0.25), (0.1, 0.5, 0.5),
                (None, None, None)]
    for values in expected:
        hub.update_scalar('train/loss', 1.0)  # the model's step, before
        hook._publish_interval(runner)
        scalars = hub.log_scalars
        shown = [key for key, value in zip(LOG_SCALARS, values)
                 if value is not None]
        assert list(scalars) == ['train/loss'] + shown
        for key, value in zip(LOG_SCALARS, values):
            if value is not None:
                assert scalars[key].mean(10) == pytest.approx(value)
                assert scalars[key].current() == pytest.approx(value)


def test_outputs_log_line_visualizer_tables_and_png(tmp_path):
    runner = train(
        tmp_path,
        max_iters=12,
        num_workers=2,
        log_level='INFO',
        hook=dict(plot=True))
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert 'DataMonitor at iteration 4, rank 0' in log
    assert 'Where the data time goes' in log
    assert 'Input-bound: ' in log
    assert osp.getsize(osp.join(runner.log_dir, 'data_monitor.png')) > 10_000
    scalars = [
        json.loads(line)
        for line in open(osp.join(runner.log_dir, 'vis_data', 'scalars.json'))
    ]
    logged = [s for s in scalars if 'dm_wait_time' in s]
    assert logged and all('dm_input_bound' in s for s in logged)
    detail = [s for s in scalars if 'data_monitor/02_Sleep_time' in s]
    assert detail and 'data_monitor/io_time' in detail[0]
    # Every point of the report's timeline went to the visualizer (made on
    # the report writer's thread, sent from the training thread), at the
    # iteration that closed it.
    timeline = _report(runner)['ranks'][0]['timeline']
    points = [s for s in scalars if 'data_monitor/wait_time' in s]
    assert [s['step'] for s in points] == [p['step'] + 1 for p in timeline]
    assert [s['data_monitor/wait_time'] for s in points] == pytest.approx(
        [p['wait'] for p in timeline])


def test_env_variable_turns_the_hook_on_and_off():
    cfg = Config(dict(custom_hooks=[dict(type='EMAHook')]))
    assert apply_data_monitor_env(cfg, {}) is None
    assert apply_data_monitor_env(cfg, {'MMDATA_MONITOR': '1'}) is True
    assert [h['type']
            for h in cfg.custom_hooks] == ['EMAHook', 'DataMonitorHook']
    apply_data_monitor_env(cfg, {'MMDATA_MONITOR': '1'})  # no duplicate
    assert len(cfg.custom_hooks) == 2
    assert apply_data_monitor_env(cfg, {'MMDATA_MONITOR': 'off'}) is False
    assert [h['type'] for h in cfg.custom_hooks] == ['EMAHook']
    with pytest.raises(ValueError, match="MMDATA_MONITOR='maybe'"):
        apply_data_monitor_env(cfg, {'MMDATA_MONITOR': 'maybe'})


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match='interval=0'):
        DataMonitorHook(interval=0)
    with pytest.raises(ValueError, match='sample_every=0'):
        DataMonitorHook(sample_every=0)


SLOW_RANK_PLUGIN = '''
import os
import time

from mmengine.registry import TRANSFORMS


@TRANSFORMS.register_module()
class SlowOnRank:
    """Takes ``ms`` milliseconds per sample on rank ``rank`` only."""

    def __init__(self, rank, ms):
        self.slow = int(os.environ.get('RANK', 0)) == rank
        self.ms = ms

    def __call__(self, results):
        if self.slow:
            time.sleep(self.ms / 1e3)
        return results
'''


def test_two_rank_run_names_the_slowed_rank(tmp_path, train_env):
    (tmp_path / 'slow_rank_plugin.py').write_text(SLOW_RANK_PLUGIN)
    config = tmp_path / 'slow_rank.py'
    # MMDATA_MONITOR=1 keeps the config's hook, which refreshes the tables
    # (a gather of both ranks on the writer thread) at iteration 8 only:
    # both ranks must skip 16 and 24 alike (table_min_seconds), or one
    # waits in a gather the other never joins.
    config.write_text(
        f'_base_ = [{DEMO_CONFIG!r}]\n'
        "custom_imports = dict(imports=['mmdata_plugin', 'slow_rank_plugin'],"
        ' allow_failed_imports=False)\n'
        "custom_hooks = [dict(type='DataMonitorHook', table_interval=8, "
        'table_min_seconds=3600)]\n'
        'train_dataloader = dict(num_workers=1, dataset=dict(pipeline=['
        "dict(type='LoadImageFromFile'), "
        "dict(type='SlowOnRank', rank=1, ms=40), "
        "dict(type='RandomImageCrop', crop_size=64), "
        "dict(type='PackImageLabelInputs')]))\n")
    env = dict(
        train_env,
        MMDATA_MONITOR='1',
        PYTHONPATH=python_path(REPO_ROOT, str(tmp_path)))
    work_dir = tmp_path / 'work'
    out = run_ranks(
        TRAIN_SCRIPT, [
            str(config), '--work-dir',
            str(work_dir), '--launcher', 'pytorch',
            *quick_cfg_options(max_iters=24, interval=24)
        ],
        env=env).stdout

    assert 'MMDATA_MONITOR=1: DataMonitorHook on.' in out
    (path, ) = glob.glob(str(work_dir / '*' / 'data_monitor.json'))
    with open(path) as f:
        report = json.load(f)
    verdict = report['verdict']
    assert [r['rank'] for r in report['ranks']] == [0, 1]
    assert verdict['worst_rank'] == 1
    assert verdict['input_bound'] == 'high'
    # 2x, not more: on a loaded machine (make test's two pytest workers)
    # rank 0's worker waits for the cores too; unslowed, both are alike.
    assert verdict['rank_wait_shares'][
        '1'] > 2 * verdict['rank_wait_shares']['0']
    assert verdict['bottleneck'] == '01_SlowOnRank'
    assert '(rank 1, the worst of 2)' in out
    assert 'Rank 1 is starved' in out
    assert 'DataMonitor at iteration 8, rank ' in out
    assert 'DataMonitor at iteration 16' not in out
    assert 'DataMonitor at iteration 24' not in out
    # One refresh and the final report, each with both ranks' figures.
    assert out.count('Per rank (ms per step):') == 2
    assert not glob.glob(str(work_dir / '*' / 'data_monitor.json.tmp'))


def test_refreshes_are_written_beside_training_and_after_train_waits(
        tmp_path, monkeypatch):
    from mmdata_plugin.engine.hooks import data_monitor_hook
    writes = []
    save = data_monitor_hook.save_report

    def slow_save(report, path, cache=None):
        main = threading.current_thread() is threading.main_thread()
        if not main:  # a slow disk: after_train must wait for it
            time.sleep(0.3)
        save(report, path, cache)
        writes.append((report['context']['iteration'], main))

    monkeypatch.setattr(data_monitor_hook, 'save_report', slow_save)
    runner = train(
        tmp_path,
        max_iters=6,
        num_workers=0,
        hook=dict(table_interval=2, table_min_seconds=0))
    # Refreshes at iterations 2, 4, 6 on the writer thread, all done before
    # after_train's final write on the training thread.
    assert writes == [(1, False), (3, False), (5, False), (6, True)]
    assert _report(runner)['context']['iteration'] == 6


def _saved(monkeypatch, figure) -> list:
    """``figure(report)`` of every report the hook saves, in order."""
    from mmdata_plugin.engine.hooks import data_monitor_hook
    saved, save = [], data_monitor_hook.save_report

    def recording_save(report, path, cache=None):
        saved.append(figure(report))
        save(report, path, cache)

    monkeypatch.setattr(data_monitor_hook, 'save_report', recording_save)
    return saved


def test_refreshes_skip_intervals_shorter_than_table_min_seconds():
    hook = DataMonitorHook(table_interval=10, table_min_seconds=5)
    # 10 iterations in 1 s: the next refresh 5 intervals on.
    hook._space_refreshes(9, 1.0)
    assert hook._next_table == 60
    # 50 iterations in 12.5 s: 2 intervals on.
    hook._space_refreshes(59, 13.5)
    assert hook._next_table == 80
    # Slow steps: the next interval.
    hook._space_refreshes(79, 63.5)
    assert hook._next_table == 90
    every_interval = DataMonitorHook(table_interval=10, table_min_seconds=0)
    every_interval._space_refreshes(9, 0.001)
    assert every_interval._next_table == 20


def test_a_resumed_run_spaces_its_first_refresh_from_where_it_resumed(
        tmp_path):
    import logging
    loader = DataLoader(list(range(8)), batch_size=2)
    runner = _stand_in_runner(loader, logging.getLogger('dm_resumed_test'),
                              tmp_path)
    runner.iter = 1000
    hook = DataMonitorHook(table_interval=10, table_min_seconds=5,
                           plot=False)
    hook.before_train(runner)
    try:
        # 100 iterations (not 1,100) in 1 s: 50 intervals on (not 550).
        hook._space_refreshes(1099, 1.0)
        assert hook._next_table == 1600
    finally:
        hook.after_train(runner)


@pytest.mark.parametrize('table_interval, table_min_seconds, seconds',
                         [(10, 5, 15), (10, 0, HAND_OVER_SECONDS),
                          (0, 5, HAND_OVER_SECONDS)])
def test_hand_over_seconds_follow_the_refresh_spacing(
        tmp_path, table_interval, table_min_seconds, seconds):
    # A refresh hands the writer the steps not handed over yet: with
    # refreshes about every table_min_seconds, steps are handed over on
    # their own only after three times that (each wake of the writer costs
    # milliseconds with cold caches).
    import logging
    loader = DataLoader(list(range(8)), batch_size=2)
    runner = _stand_in_runner(loader, logging.getLogger('dm_hand_over_test'),
                              tmp_path)
    hook = DataMonitorHook(
        table_interval=table_interval,
        table_min_seconds=table_min_seconds,
        plot=False)
    hook.before_train(runner)
    try:
        assert hook.monitor.hand_over_seconds == seconds
    finally:
        hook.after_train(runner)


def test_every_rank_waits_for_the_spacing_of_the_refresh_before(
        tmp_path, monkeypatch):
    """The next refresh's iteration is decided on the writer's thread
    after its gather; a training thread that reached the next interval
    first waits for it instead of reading the one before (a rank that did
    not would refresh alone, its gather waiting on the others)."""
    from mmdata_plugin.engine.hooks import data_monitor_hook
    gather = data_monitor_hook.all_gather_object

    def slow_gather(data, group=None):
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.5)
        return gather(data, group=group)

    monkeypatch.setattr(data_monitor_hook, 'all_gather_object', slow_gather)
    writes = _saved(monkeypatch, lambda report: report['context']['iteration'])
    runner = train(
        tmp_path,
        max_iters=8,
        num_workers=0,
        hook=dict(table_interval=2, table_min_seconds=3600))
    assert writes == [1, 8]
    assert _report(runner)['context']['iteration'] == 8


def test_refreshes_are_spaced_by_rank_0s_clock(tmp_path, monkeypatch):
    """Every rank spaces its refreshes from the gathered rank 0's seconds,
    not its own: here rank 0's (this process's, scaled) say each interval
    took hours, so no interval is skipped although this clock's say
    milliseconds."""
    from mmdata_plugin.engine.hooks import data_monitor_hook
    gather = data_monitor_hook.all_gather_object

    def slow_rank_0(data, group=None):
        return [dict(g, elapsed=g['elapsed'] * 1e7)
                for g in gather(data, group=group)]

    monkeypatch.setattr(data_monitor_hook, 'all_gather_object', slow_rank_0)
    writes = _saved(monkeypatch, lambda report: report['context']['iteration'])
    train(tmp_path,
          max_iters=6,
          num_workers=0,
          hook=dict(table_interval=2, table_min_seconds=5))
    assert writes == [1, 3, 5, 6]


def test_a_refresh_whose_figures_fail_still_joins_the_gather(
        tmp_path, monkeypatch):
    """Its rank still gathers (its peers are in that gather) and spaces
    the next refresh as they do; the failure is named in the log."""
    from mmdata_plugin.engine.hooks import data_monitor_hook
    gathers = []
    gather = data_monitor_hook.all_gather_object

    def counted(data, group=None):
        gathers.append(sorted(data))
        return gather(data, group=group)

    monkeypatch.setattr(data_monitor_hook, 'all_gather_object', counted)
    snapshot = DataMonitorHook._snapshot

    def failing_first(self, runner, with_window=False):
        made = snapshot(self, runner, with_window)
        if with_window and runner.iter == 1:
            made['summaries'] = lambda: 1 / 0
        return made

    monkeypatch.setattr(DataMonitorHook, '_snapshot', failing_first)
    writes = _saved(monkeypatch, lambda report: report['context']['iteration'])
    runner = train(
        tmp_path,
        max_iters=6,
        num_workers=0,
        hook=dict(table_interval=2, table_min_seconds=0))
    assert gathers[0] == ['elapsed', 'error']
    assert len(gathers) == 4  # three refreshes and the final report
    assert writes == [3, 5, 6]
    log = open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()
    assert "the figures of rank(s) 0 (ZeroDivisionError('division by zero'))" \
        ' failed' in log


def test_refreshes_reuse_the_head_cache_figures_the_final_report_reads_them(
        tmp_path, monkeypatch):
    from mmdata_plugin.engine.hooks import data_monitor_hook
    reads = []

    def read_head_cache(dataset):
        reads.append(threading.current_thread() is threading.main_thread())
        return dict(cache_dirs=['/node'], hits=len(reads), misses=0,
                    produced=0, bypassed=0, evicted_entries=0,
                    committed_bytes=0, limit=1, hit_ratio=1.0)

    monkeypatch.setattr(data_monitor_hook, 'read_head_cache',
                        read_head_cache)
    saves = _saved(monkeypatch, lambda report: report['head_cache']['hits'])
    runner = train(
        tmp_path,
        max_iters=6,
        num_workers=0,
        hook=dict(table_interval=2, table_min_seconds=0))
    # Three refreshes within HEAD_CACHE_READ_EVERY share the writer's one
    # read; the final report reads afresh, on the training thread.
    assert reads == [False, True]
    assert saves == [1, 1, 1, 2]
    assert _report(runner)['head_cache']['hits'] == 2


class _StandInRunner(SimpleNamespace):
    """What before_train and the steps read of a Runner; its ``iter`` is
    its loop's, as mmengine's Runner's is."""

    @property
    def iter(self) -> int:
        return self.train_loop.iter

    @iter.setter
    def iter(self, value: int) -> None:
        self.train_loop.iter = value


def _stand_in_runner(loader, logger, log_dir):
    from mmengine.logging import MessageHub
    return _StandInRunner(
        max_iters=100, logger=logger, log_dir=str(log_dir),
        cfg=Config(),
        hooks=[], model=SimpleNamespace(),
        message_hub=MessageHub.get_instance('dm_blind_test'),
        visualizer=SimpleNamespace(add_scalars=lambda *a, **k: None),
        train_loop=SimpleNamespace(dataloader=loader, iter=0),
        train_dataloader=loader)


@pytest.mark.parametrize('counted_first', [False, True])
def test_a_loop_that_bypasses_the_monitored_iterator_is_warned_once(
        counted_first, caplog, tmp_path):
    import logging
    logger = logging.getLogger('dm_blind_test')
    loader = DataLoader(list(range(64)), batch_size=2)
    runner = _stand_in_runner(loader, logger, tmp_path)
    hook = DataMonitorHook(warmup_iters=0, settle_iters=0, table_interval=0,
                           plot=False)
    hook.before_train(runner)
    try:
        if counted_first:  # a loop that did feed the monitor before
            batches = iter(loader)
            for _ in range(3):
                next(batches)
                hook.before_train_iter(runner, runner.iter)
                runner.iter += 1
            assert hook.monitor.counted_steps
        with caplog.at_level(logging.WARNING, logger='dm_blind_test'):
            for _ in range(6):  # steps that took no batch from the loader
                hook.before_train_iter(runner, runner.iter)
                runner.iter += 1
    finally:
        hook._writer.close()
        hook.monitor.uninstall()
    warnings = [r for r in caplog.records if 'cannot see' in r.message]
    assert len(warnings) == (0 if counted_first else 1)


def test_a_burst_of_points_reaches_the_visualizer_a_few_a_step(
        tmp_path, monkeypatch):
    # The points of a whole hand-over are booked at once on the writer's
    # thread, and a backend call costs tens of microseconds to a
    # millisecond: a step sends them for POINTS_SECONDS (at least one),
    # oldest first, and the end of training sends the rest.
    import logging
    from collections import Counter

    from mmdata_plugin.data_monitor import load_report
    from mmdata_plugin.engine.hooks import data_monitor_hook
    loader = DataLoader(list(range(400)), batch_size=2)
    runner = _stand_in_runner(loader, logging.getLogger('dm_points_test'),
                              tmp_path)
    sent, backend_seconds = [], [0.0]

    def add_scalars(scalars, step):
        if backend_seconds[0]:
            time.sleep(backend_seconds[0])
        sent.append((runner.iter, step))

    runner.visualizer = SimpleNamespace(add_scalars=add_scalars)
    hook = DataMonitorHook(interval=1, warmup_iters=0, settle_iters=0,
                           table_interval=0, plot=False)
    hook.before_train(runner)
    batches = iter(loader)

    def burst_then_steps(count: int) -> Counter:
        """Points sent per step in the ``count`` steps after a burst."""
        for _ in range(20):
            next(batches)
            hook.before_train_iter(runner, runner.iter)
            hook.after_train_iter(runner, runner.iter)
            runner.iter += 1
        # A hand-over now, as after HAND_OVER_SECONDS of steps (private).
        hook.monitor._book_unbooked()
        hook._writer.flush()
        assert len(hook.monitor.new_points) >= 15
        earlier = len(sent)
        for _ in range(count):
            next(batches)
            hook.before_train_iter(runner, runner.iter)
            runner.iter += 1
        return Counter(at for at, _ in sent[earlier:])

    try:
        # A backend slower than the time for points: one point a step.
        backend_seconds[0] = 2 * data_monitor_hook.POINTS_SECONDS
        first = runner.iter + 20
        assert burst_then_steps(3) == {first: 1, first + 1: 1, first + 2: 1}
        # A fast one (within a time made ample here): several a step.
        backend_seconds[0] = 0.0
        monkeypatch.setattr(data_monitor_hook, 'POINTS_SECONDS', 1.0)
        first = runner.iter + 20
        assert burst_then_steps(3)[first] > 1
    finally:
        hook.after_train(runner)
    timeline = load_report(str(tmp_path / 'data_monitor.json'))['ranks'][0][
        'timeline']
    assert [step for _, step in sent] == [p['step'] + 1 for p in timeline]


def test_a_step_reads_the_loop_iter_once(tmp_path):
    # mmengine's Runner.iter reads its train_loop property twice and checks
    # the loop against an abstract class three times before the loop's
    # iter: a step reads the loop's, once, in before_train_iter, and
    # after_train_iter reuses it; runner.iter is read only by a refresh
    # (its snapshot).
    import logging

    class Loop:
        reads = 0

        def __init__(self, dataloader) -> None:
            self.dataloader = dataloader
            self.count = 0

        @property
        def iter(self) -> int:
            Loop.reads += 1
            return self.count

    class Runner(_StandInRunner):
        reads = 0

        @property
        def iter(self) -> int:
            Runner.reads += 1
            return self.train_loop.iter

    loader = DataLoader(list(range(64)), batch_size=2)
    runner = Runner(**vars(
        _stand_in_runner(loader, logging.getLogger('dm_iter_test'),
                         tmp_path)))
    loop = runner.train_loop = Loop(loader)
    hook = DataMonitorHook(warmup_iters=0, settle_iters=0, table_interval=100,
                           plot=False)
    hook.before_train(runner)
    try:
        batches, reads = iter(loader), (Loop.reads, Runner.reads)
        for _ in range(12):
            next(batches)
            hook.before_train_iter(runner, loop.count)
            hook.after_train_iter(runner, loop.count)
            loop.count += 1
        assert (Loop.reads - reads[0], Runner.reads - reads[1]) == (12, 0)
        assert hook.monitor.last_step['counted']
    finally:
        hook.after_train(runner)


def test_a_log_line_covers_the_steps_up_to_its_own(tmp_path):
    # The log line's scalars are put in before_train_iter, once its step is
    # committed: LoggerHook, in after_train_iter, logs the interval's steps
    # up to this one, as when they were put in after_train_iter.
    import logging

    from mmengine.hooks import LoggerHook
    loader = DataLoader(list(range(64)), batch_size=2)
    runner = _stand_in_runner(loader, logging.getLogger('dm_line_test'),
                              tmp_path)
    runner.hooks = [LoggerHook(interval=4)]
    hook = DataMonitorHook(warmup_iters=0, settle_iters=0, table_interval=0,
                           plot=False)
    hook.before_train(runner)
    waits, logged = [0.001 * (step + 1) for step in range(8)], []
    try:
        for step, wait in enumerate(waits):
            hook.monitor._on_batch(10.0 * step, 10.0 * step + wait, None)
            hook.before_train_iter(runner, step)
            hook.after_train_iter(runner, step)
            buffer = runner.message_hub.log_scalars.get('train/dm_wait_time')
            logged.append(None if buffer is None else buffer.current())
            runner.iter += 1
    finally:
        hook.after_train(runner)
    assert logged[3] == pytest.approx(sum(waits[:4]) / 4)
    assert logged[7] == pytest.approx(sum(waits[4:]) / 4)
