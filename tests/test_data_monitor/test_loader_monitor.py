"""DataLoaderMonitor on plain DataLoaders (the API benchmark tools use)."""
import copy
import gc
import pickle
import threading

import mmcv
import mmengine.fileio
import pytest
import torch
from mmcv.transforms import RandomApply, RandomChoice
from mmengine.dataset import (ClassBalancedDataset, ConcatDataset,
                              RepeatDataset)
from monitor_helpers import (DropEvery, Sleep, SleepyCollate, SleepyDataset,
                             TupleCollate, batch_digest, sleepy_pipeline)
from torch.utils.data import DataLoader, IterableDataset

from mmdata_plugin.data_monitor import (DataLoaderMonitor, format_report,
                                        measure_dataloader, probes)
from mmdata_plugin.data_monitor.loader_monitor import (_merge_pairs,
                                                       loader_context)
from mmdata_plugin.data_monitor.step_log import StepLog
from mmdata_plugin.data_monitor.worker_timing import (ACCUMULATOR,
                                                      MonitoredBatch,
                                                      TimedCollate,
                                                      TimedFetch,
                                                      TimedTransform,
                                                      inside_timed_region,
                                                      timed_call)
from mmdata_plugin.datasets import SampleSeededDataset
from mmdata_plugin.engine import DataMonitorHook
from mmdata_plugin.testing import count_calls


def _loader(dataset, **kwargs):
    return DataLoader(
        dataset,
        batch_size=kwargs.pop('batch_size', 2),
        collate_fn=kwargs.pop('collate_fn', None) or SleepyCollate(0),
        **kwargs)


def test_steps_after_starts_pauses_and_skips_are_not_counted():
    loader = DataLoader(list(range(40)), batch_size=2)
    monitor = DataLoaderMonitor(
        loader,
        warmup_iters=2,
        settle_iters=1,
        manual_steps=True,
        timeline_every=2).install()

    def take(n_steps, batches_per_step=1):
        for _ in range(n_steps):
            for _ in range(batches_per_step):
                next(iterator)
            monitor.step()

    iterator = iter(loader)
    take(1)  # start-up batch
    take(2)  # warm-up
    assert (monitor.counted_steps, monitor.skipped) == (0, 3)
    take(4)
    assert monitor.counted_steps == 4
    assert len(monitor.timeline) == 2
    monitor.mark_pause()  # validation: this step and one more
    take(3)
    assert (monitor.counted_steps, monitor.skipped) == (5, 5)
    monitor.mark_pause(settle=False)  # a short pause: this step only
    take(2)
    assert (monitor.counted_steps, monitor.skipped) == (6, 6)
    take(1, batches_per_step=3)  # batches taken without steps (resume)
    take(2)
    assert (monitor.counted_steps, monitor.skipped) == (7, 8)
    iterator = iter(loader)  # a new epoch: start-up + settle
    take(3)
    assert (monitor.counted_steps, monitor.skipped) == (8, 10)
    assert monitor.starts == 2 and monitor.startup.wait.seen == 2
    monitor.step()  # no batch since the last step
    assert monitor.last_step is None and monitor.steps_without_batch == 1
    # A plain list cannot be switched to a timed class: collate only.
    assert set(monitor.summary()['stages']) == {'collate'}
    monitor.uninstall()


def test_books_kept_on_another_thread_count_what_inline_books_count(
        monkeypatch):
    # DataMonitorHook books on its report writer's thread: the training
    # thread only appends; the figures, the points and the sums the Ray
    # pool sizing reads are those of books kept inline, nothing is booked
    # on the counting thread, and the window is the span up to its call.
    from mmdata_plugin.data_monitor.report_writer import ReportWriter
    from mmdata_plugin.data_monitor.statistics import StatsBook
    booked_on = {}
    add_columns = StatsBook.add_columns

    def add_columns_here(book, columns):
        booked_on.setdefault(id(book), set()).add(threading.get_ident())
        add_columns(book, columns)

    monkeypatch.setattr(StatsBook, 'add_columns', add_columns_here)
    monitors, summaries = [], {False: [], True: []}
    writer = ReportWriter(name='test-books')
    for elsewhere in (False, True):
        loader = DataLoader(list(range(800)), batch_size=2)
        monitor = DataLoaderMonitor(
            loader, warmup_iters=0, settle_iters=0, manual_steps=True,
            timeline_every=7).install()
        if elsewhere:
            booked_on.clear()
            monitor.book_on(writer.submit)
        iterator = iter(loader)

        def summarise(window):
            made = summaries[elsewhere]
            function = monitor.deferred_summaries(window)
            if elsewhere:  # the next job handed over
                writer.submit(lambda: made.append(function()))
            else:
                made.append(function())

        for step in range(390):
            next(iterator)
            monitor.step(step)
            if step == 149:
                summarise(window=True)
        summarise(window=False)
        if elsewhere:
            writer.flush()
            # (the start-up batch's book is the counting thread's own)
            del booked_on[id(monitor.startup)]
            assert set.union(*booked_on.values()) == {writer.thread.ident}
            monitor.book_on(None)
            with pytest.raises(RuntimeError, match='another thread'):
                monitor.book_on(writer.submit)
                monitor.summary()
            monitor.book_on(None)
        monitors.append(monitor)
        monitor.uninstall()
    writer.close()
    for (first, window), (last, none) in summaries.values():
        assert first['steps'] == window['steps'] == 149  # (the start-up)
        assert last['steps'] == 389 and none is None
        assert [p['step'] for p in last['timeline']] == list(
            range(7, 389, 7))
    assert [p['step'] for p in monitors[1].new_points] == list(
        range(7, 389, 7))
    assert monitors[1].booked_totals[0] == 389


def _synthetic_steps(count: int) -> list:
    """Arguments of ``StepLog.append`` for ``count`` steps: no record,
    untimed, timed (with stages) and Ray data actors' records (with their
    node), a compute time unknown now and then."""
    steps = []
    for index in range(count):
        requested = 100 + 0.03 * index
        kind = index % 5
        record = None
        if kind:
            start = requested - 0.001 * (index % 7)
            record = dict(
                pid=1000 + index % 3,
                worker=index % 4 - 1,
                samples=1 + index % 8,
                start=start,
                end=start + 0.002 * (1 + index % 5),
                cpu=0.0005 * (index % 9),
                timed=kind == 2)
            if kind == 2:
                record.update(
                    stages={'decode': 0.001 * (index % 3), 'io': 0.0002},
                    drops={},
                    refetch_time=0.0)
            if kind == 4:
                node = f'node{index % 3}'
                record.update(node=node, host=f'host{node}', ip='10.0.0.1',
                              bytes=1000 + index)
        compute = None if index % 6 == 0 else 0.01 + 0.0001 * index
        steps.append((0.001 * (index % 4), compute, record, requested,
                      requested + 0.001 * (index % 4), None, index))
    return steps


def _rounded(value):
    if isinstance(value, float):
        return float(f'{value:.12g}')
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(item) for item in value]
    return value


def test_books_and_timeline_do_not_depend_on_how_steps_are_grouped():
    # Steps come to the books in runs whose size depends on the hand-over
    # rate; the steps held for the next timeline point are carried from
    # one run to the next.
    steps = _synthetic_steps(300)

    def booked(run_sizes):
        monitor = DataLoaderMonitor(
            DataLoader(list(range(4))), timeline_every=7,
            max_timeline_points=5)
        first = 0
        for size in run_sizes:
            log = StepLog()
            for step in steps[first:first + size]:
                log.append(*step)
            monitor._book(log)
            first += size
        assert first == len(steps)
        # The books' sums are added run by run: the same to 12 digits.
        return (_rounded(monitor.summary()), list(monitor.new_points),
                monitor._point_steps.values)

    one_by_one = booked([1] * 300)
    assert one_by_one[0]['steps'] == 300
    assert one_by_one[0]['nodes'] and len(one_by_one[0]['workers']) == 4
    for sizes in ([300], [0, 3, 4, 7, 13, 64, 0, 209], [6, 1, 100, 193]):
        assert booked(sizes) == one_by_one, sizes
    with pytest.raises(AttributeError):
        DataLoaderMonitor(DataLoader([0])).timeline_every = 3


def test_steps_held_for_booking_leave_the_garbage_collector_nothing():
    # Booked on another thread, steps wait up to ~10 s: kept as objects
    # the collector tracks (a tuple and its record per step), they made it
    # collect every few hundred steps, each walk with cold caches. A step
    # is a row of numbers; only a timed batch's record is kept.
    loader = _loader(
        SleepyDataset(num=4200, pipeline=sleepy_pipeline((0, ))),
        collate_fn=SleepyCollate(0))
    monitor = DataLoaderMonitor(
        loader, warmup_iters=0, settle_iters=0, manual_steps=True,
        sample_every=256).install()
    handed = []
    monitor.book_on(lambda job, *args: handed.append(args))
    iterator = iter(loader)
    for step in range(50):
        next(iterator)
        monitor.step(step)
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for step in range(50, 2050):
            next(iterator)
            monitor.step(step)
        growth = gc.get_count()[0] - before
    finally:
        gc.enable()
        monitor.uninstall()
    assert monitor.counted_steps >= 2000 and handed
    assert growth < 400  # a step's tuple and record before: 4,000


def test_hand_overs_come_every_seconds_of_steps_since_the_last_take(
        monkeypatch):
    # DataMonitorHook's refreshes take the steps not handed over yet
    # (deferred_summaries): each wake of the booking thread costs
    # milliseconds with cold caches, so the next hand-over is due
    # ``seconds`` of steps after the last take, whichever took them, at
    # the rate of the steps taken then.
    from mmdata_plugin.data_monitor import loader_monitor
    clock = [0.0]
    monkeypatch.setattr(loader_monitor, '_perf_counter', lambda: clock[0])
    loader = DataLoader(list(range(1300)), batch_size=1)
    monitor = DataLoaderMonitor(
        loader, warmup_iters=0, settle_iters=0, manual_steps=True).install()
    handed = []
    iterator = iter(loader)
    for step in range(1300):
        next(iterator)
        clock[0] += 1 / 128  # 128 steps a second, exact in binary
        monitor.step(step)
        if step == 20:
            monitor.book_on(
                lambda job, *args: handed.append((step, len(args[0]))),
                seconds=2.0)
        if step == 450:
            monitor.deferred_summaries(window=False)
    monitor.uninstall()
    after = [(step, count) for step, count in handed if step > 450]
    # Due 2 s after the take (the spacing from the last hand-over made
    # the one after the next come sooner).
    assert after == [(706, 256), (962, 256), (1218, 256)]


def test_a_long_timeline_is_halved_by_weighted_means():
    # Figures weigh by steps, stage means by timed batches (a point of an
    # older report has no count: all its steps were timed); an odd point
    # is kept as it is.
    def point(step, steps, ms, timed=None, stages=None):
        made = dict(step=step, steps=steps, wait=ms, compute=2 * ms,
                    worker=3 * ms, transfer=4 * ms, stages=stages or {})
        return made if timed is None else dict(made, timed=timed)

    points = [
        point(9, 10, 1.0, 1, dict(a=3.0)),
        point(19, 30, 5.0, 3, dict(a=1.0, b=2.0)),
        point(29, 10, 2.0, 0),
        point(39, 10, 4.0, 0),
        point(49, 2, 8.0, stages=dict(a=1.0)),
        point(59, 2, 9.0, 1, dict(a=4.0)),
        point(69, 5, 7.0),
    ]
    first, second, third, odd = _merge_pairs(points)
    assert first == dict(step=19, steps=40, wait=4.0, compute=8.0,
                         worker=12.0, transfer=16.0, timed=4,
                         stages=dict(a=1.5, b=1.5))
    assert second == dict(step=39, steps=20, wait=3.0, compute=6.0,
                          worker=9.0, transfer=12.0, timed=0, stages={})
    assert third['timed'] == 3 and third['stages'] == dict(a=2.0)
    assert third['wait'] == 8.5 and third['step'] == 59
    assert odd is points[-1]


def test_a_benchmark_can_count_the_first_batch_of_later_epochs():
    loader = DataLoader(list(range(6)), batch_size=2)  # 3 batches an epoch
    for count_restarts, counted in ((False, 3), (True, 4)):
        with DataLoaderMonitor(
                loader,
                warmup_iters=1,
                settle_iters=0,
                count_restarts=count_restarts) as monitor:
            for _ in range(2):  # two epochs: start-up, warm-up, 4 more
                list(loader)
            assert monitor.counted_steps == counted
            assert monitor.startup.wait.seen == 1 + (not count_restarts)
            throughput = monitor.summary()['throughput']
            assert throughput['batches_per_s'] > 0
            # A plain list is not switched to a timed class: no fetch count.
            assert throughput['samples_per_s'] is None


@pytest.mark.compat
def test_measure_dataloader_reports_and_restores_the_loader():
    dataset = SleepyDataset(num=24, io_ms=1, pipeline=sleepy_pipeline((1, 2)))
    loader = _loader(dataset, num_workers=2, collate_fn=SleepyCollate(1))
    pipeline = list(dataset.pipeline.transforms)
    collate = loader.collate_fn

    report = measure_dataloader(loader, 12, warmup_iters=2)

    assert report['schema'] == 'mmdata_plugin.data_monitor/1'
    rank = report['ranks'][0]
    assert rank['steps'] == 12 - 3  # start-up + 2 warm-up
    assert rank['transforms']['02_Sleep']['mean'] >= 2 * 2
    assert rank['stages']['collate']['mean'] >= 1
    # A consumer that does nothing is input-bound by definition.
    assert report['verdict']['input_bound'] == 'high'
    assert 'Where the data time goes' in format_report(report)
    assert type(loader) is DataLoader and loader.collate_fn is collate
    assert type(dataset) is SleepyDataset
    assert dataset.pipeline.transforms == pipeline
    assert mmengine.fileio.get is mmengine.fileio.io.get
    assert not hasattr(mmengine.fileio.get, '_data_monitor_original')


def _nested(num=6, ms=(2, 0, 1)):
    return SleepyDataset(
        num=num,
        pipeline=[
            dict(type='LoadImageFromFile'),
            RandomApply([Sleep(ms[0]), Sleep(ms[1])], prob=1.0),
            RandomChoice([[Sleep(ms[2])], [Sleep(ms[2])]], prob=[1.0, 0.0]),
            dict(type='PackImageLabelInputs'),
        ])


NESTED_KEYS = [
    '00_LoadImageFromFile', '01_RandomApply', '01_RandomApply.0_Sleep',
    '01_RandomApply.1_Sleep', '02_RandomChoice', '02_RandomChoice.0.0_Sleep',
    '02_RandomChoice.1.0_Sleep', '03_PackImageLabelInputs'
]
# Measured: all but the RandomChoice branch that is never taken.
RUN_KEYS = [key for key in NESTED_KEYS if key != '02_RandomChoice.1.0_Sleep']


def _measure(dataset):
    loader = _loader(dataset, shuffle=False)
    monitor = DataLoaderMonitor(loader, warmup_iters=0).install()
    batches = [batch for batch in loader]
    report = monitor.report()
    monitor.uninstall()
    assert all(set(b) == {'inputs', 'data_samples'} for b in batches)
    return report, report['ranks'][0]['transforms']


@pytest.mark.parametrize('wrapper', [RepeatDataset, ClassBalancedDataset])
def test_wrapped_datasets_and_nested_transforms_are_timed(wrapper):
    nested = _nested()
    args = dict(times=2) if wrapper is RepeatDataset else dict(
        oversample_thr=0.5)
    dataset = wrapper(nested, **args)
    report, transforms = _measure(dataset)

    assert [
        (p['id'], p['dataset'], p['dataset_type']) for p in report['pipelines']
    ] == [('p0', 'dataset.dataset', 'SleepyDataset')]
    assert report['pipelines'][0]['transforms'] == NESTED_KEYS
    assert sorted(transforms) == sorted(RUN_KEYS)
    # Wrappers are charged their own time only, not their children's.
    assert (transforms['01_RandomApply']['mean']
            < transforms['01_RandomApply.0_Sleep']['mean'] / 4)
    assert transforms['01_RandomApply.0_Sleep']['mean'] >= 2 * 2
    assert type(dataset) is wrapper
    assert not isinstance(nested.pipeline.transforms[1], TimedTransform)
    assert not isinstance(
        nested.pipeline.transforms[1].transforms.transforms[0], TimedTransform)


def test_shared_random_draws_stay_shared_while_timed():
    # TransformBroadcaster(share_random_params=True) flips img1 and img2
    # alike; timed (every batch), each target must not draw its own flip.
    import numpy as np
    from mmcv.transforms import RandomFlip, TransformBroadcaster
    from mmengine.dataset import Compose

    class Pairs(torch.utils.data.Dataset):
        pipeline = Compose([
            TransformBroadcaster(
                mapping={'img': ['img1', 'img2']},
                auto_remap=True,
                share_random_params=True,
                transforms=[RandomFlip(prob=0.5, direction='horizontal')])
        ])

        def __len__(self):
            return 64

        def __getitem__(self, index):
            img = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
            out = self.pipeline(dict(img1=img.copy(), img2=img.copy()))
            return bool((out['img1'] == out['img2']).all())

    loader = DataLoader(Pairs(), batch_size=4, collate_fn=list)
    monitor = DataLoaderMonitor(loader, sample_every=1,
                                warmup_iters=0).install()
    try:
        same = [pair for batch in loader for pair in batch]
    finally:
        monitor.uninstall()
    assert all(same) and len(same) == 64


@pytest.mark.compat
def test_rewinding_loaders_without_a_bucketing_batch_sampler():
    from mmdata_plugin.utils.started_iterators import rewind_samplers

    class Stream(IterableDataset):

        def __iter__(self):
            return iter(range(4))

    for loader in (DataLoader(Stream(), batch_size=2),
                   DataLoader(list(range(4)), batch_size=None),
                   DataLoader([], batch_size=2)):
        rewind_samplers(loader)  # nothing to empty, nothing raised


def test_concatenated_pipelines_are_told_apart():
    plain = SleepyDataset(num=6, pipeline=sleepy_pipeline((0.5, )))
    report, transforms = _measure(ConcatDataset([_nested(), plain]))
    assert [(p['id'], p['dataset'])
            for p in report['pipelines']] == [('p0', 'dataset.datasets[0]'),
                                              ('p1', 'dataset.datasets[1]')]
    assert sorted(transforms) == sorted([f'p0:{key}' for key in RUN_KEYS] + [
        'p1:00_LoadImageFromFile', 'p1:01_Sleep', 'p1:02_PackImageLabelInputs'
    ])


def test_refetched_samples_are_counted_with_their_cost():
    dataset = SleepyDataset(
        num=12,
        pipeline=[Sleep(1),
                  DropEvery(3),
                  dict(type='LoadImageFromFile')])
    report = measure_dataloader(_loader(dataset), 12, warmup_iters=0)
    refetch = report['ranks'][0]['refetch']
    assert refetch['drops'] == {'01_DropEvery': refetch['count']}
    assert refetch['count'] >= 5
    assert refetch['ms_per_batch'] >= 1  # each dropped attempt slept 1 ms
    assert 'refetch' in [a['topic'] for a in report['advice']]


def test_sampled_batches_estimate_stages_and_keep_totals_exact():
    # 02_Sleep is the bottleneck by a margin that a loaded machine's
    # slower decode and late wake-ups do not close (it failed once at
    # 2 ms under a profiler on both cores).
    dataset = SleepyDataset(num=48, pipeline=sleepy_pipeline((1, 5)))
    loader = _loader(dataset, collate_fn=SleepyCollate(1))
    plain = [batch_digest(b) for b in loader]
    timed_lists = []
    with DataLoaderMonitor(loader, warmup_iters=0, sample_every=4) as monitor:
        batches = []
        for batch in loader:  # no workers: the lists change here
            batches.append(batch_digest(batch))
            timed_lists.append(
                isinstance(dataset.pipeline.transforms[1], TimedTransform))
        report = monitor.report()
    assert batches == plain
    # After batch b the lists are set for batch b + 1: one in four timed.
    assert timed_lists[:8] == [False, False, False, True] * 2
    rank = report['ranks'][0]
    assert rank['steps'] == rank['batches'] == 23  # start-up not counted
    assert rank['sampling']['timed_batches'] == 5  # batches 4, 8, ... 20
    # Exact for every batch: samples, worker time (three sleeps of 2x1,
    # 2x5 and 1 ms per batch, timed or not).
    assert rank['samples_per_batch'] == 2
    assert rank['worker']['p50'] >= 2 * 1 + 2 * 5 + 1
    assert rank['worker']['count'] == 23
    transforms = rank['transforms']
    assert transforms['02_Sleep']['mean'] >= 2 * 5
    assert transforms['02_Sleep']['count'] == 5
    assert transforms['02_Sleep']['stderr'] > 0  # estimated: 5 of 23
    verdict = report['verdict']
    assert verdict['bottleneck'] == '02_Sleep'
    assert verdict['bottleneck_stderr'] == pytest.approx(
        transforms['02_Sleep']['stderr'] / rank['worker']['mean'])
    assert rank['stages']['io']['count'] == 5
    assert type(dataset) is SleepyDataset
    assert not any(
        isinstance(t, TimedTransform) for t in dataset.pipeline.transforms)
    assert not hasattr(mmcv.imfrombytes, '_data_monitor_original')


def _monitor_calls_per_batch(batch_size: int, timed: bool):
    """The calls into the monitor's code while the loader yields one
    (timed or untimed) batch of nested wrappers and probed loading."""
    loader = _loader(_nested(num=64, ms=(0, 0, 0)), batch_size=batch_size)
    with DataLoaderMonitor(loader, warmup_iters=0, sample_every=3):
        batches = iter(loader)
        next(batches)
        while ACCUMULATOR.timing != timed:
            next(batches)
        _, calls = count_calls(lambda: next(batches),
                               'mmdata_plugin/data_monitor/')
    return calls


def test_an_untimed_batch_runs_the_monitor_once_per_batch_not_per_sample():
    # Untimed batches run the plain transform lists (nested ones included)
    # without the IO/decode probes: what the monitor does for them does not
    # grow with the batch, not even by a wrapper call or a clock read.
    untimed = _monitor_calls_per_batch(2, timed=False)
    assert untimed == _monitor_calls_per_batch(8, timed=False)
    assert untimed['_fetch'] == untimed['TimedCollate.__call__'] == 1
    assert 'TimedTransform.__call__' not in untimed
    assert sum(n for name, n in untimed.items()
               if name.endswith('>thread_time')) == 2
    # A timed batch times every transform, read and decode of each sample:
    # 7 timed transforms run per sample (the two wrappers, their 3 children
    # that run, load and pack), the file read and the decode go through the
    # probes.
    per_sample = (_monitor_calls_per_batch(8, timed=True) -
                  _monitor_calls_per_batch(2, timed=True))
    assert per_sample['TimedTransform.__call__'] == 7 * 6
    assert per_sample['_make_probe.<locals>.probe'] == 2 * 6


def _attributes_in_a_dict(obj) -> bool:
    """Whether CPython keeps ``obj``'s attributes in a dict object (what
    switching its class or reading ``__dict__`` does for good) rather than
    inline, where its specialised attribute reads find them; asked without
    reading ``__dict__``."""
    return any(
        isinstance(ref, dict) and 'pipeline' in ref
        for ref in gc.get_referents(obj))


@pytest.mark.parametrize('num_workers', [0, 1])
def test_the_dataset_keeps_its_class_and_inline_attributes(num_workers):
    # With its class switched (or its __dict__ read) every self.attr read of
    # BaseDataset's per-sample code misses the interpreter's fast path:
    # ~0.5 us per sample on the cheap benchmark pipeline, most of what the
    # monitor cost there. Forked workers inherit the object as it is here.
    dataset = SleepyDataset(num=24, pipeline=sleepy_pipeline(()))
    assert not _attributes_in_a_dict(dataset)
    loader = _loader(dataset, num_workers=num_workers)
    with DataLoaderMonitor(loader, warmup_iters=0, sample_every=2) as monitor:
        for _ in loader:
            assert type(dataset) is SleepyDataset
            assert not _attributes_in_a_dict(dataset)
        assert monitor.summary()['sampling']['timed_batches'] > 0
    assert not _attributes_in_a_dict(dataset)
    assert not hasattr(dataset, '__getitems__')


def test_records_keep_their_figures_and_untimed_ones_only_totals():
    # No workers: records are not pickled, so one that shared a container
    # with the next batch's would change after it was taken.
    dataset = SleepyDataset(num=48, pipeline=sleepy_pipeline((0, 0)))
    loader = _loader(dataset, collate_fn=SleepyCollate(0))
    with DataLoaderMonitor(loader, warmup_iters=0, sample_every=2):
        raw = iter(loader)._source  # the batches with their records
        records, taken = [], []
        for batch in raw:
            records.append(batch.record)
            taken.append(copy.deepcopy(batch.record))
    assert records == taken
    assert [r['timed'] for r in records[:6]] == [True, False] * 3
    untimed = records[1]
    assert untimed.keys() == {
        'pid', 'worker', 'samples', 'start', 'end', 'cpu', 'timed'
    }
    assert untimed['samples'] == 2 and untimed['end'] > untimed['start']
    assert records[2]['stages'].keys() >= {'fetch', 'collate'}


@pytest.mark.parametrize('pin', [False, True])
def test_a_second_monitor_in_the_process_starts_a_fresh_schedule(pin):
    # Two loaders monitored at once in one process without workers (a
    # train and a val loader, a benchmark with 0 workers): the first one
    # leaves its plan and a countdown in the process-wide accumulator, in
    # the middle of its untimed batches.
    first = _loader(SleepyDataset(num=48, pipeline=sleepy_pipeline(())))
    first_monitor = DataLoaderMonitor(
        first, warmup_iters=0, sample_every=16).install()
    for taken, _ in enumerate(first, 1):
        if taken == 12:
            break
    assert not ACCUMULATOR.timing  # batch 12 of 16 untimed ones
    try:
        second = _loader(
            SleepyDataset(num=12, pipeline=sleepy_pipeline((1, ))),
            pin_memory=pin)
        report = measure_dataloader(second, 6, warmup_iters=0)
    finally:
        first_monitor.uninstall()
    rank = report['ranks'][0]
    # A fresh schedule: its first batches are all timed in full.
    assert rank['batches'] == 5  # start-up not counted
    assert rank['sampling']['timed_batches'] == 5
    assert set(rank['stages']) == {'io', 'decode', 'fetch', 'collate'}
    assert rank['transforms']['01_Sleep']['count'] == 5
    assert 'No stage sample yet' not in report['verdict']['summary']
    assert ACCUMULATOR.plans == [] and ACCUMULATOR.timing


def test_a_report_without_a_timed_batch_says_so():
    # One batch in 32 timed: the first (start-up, not counted) only.
    loader = _loader(SleepyDataset(num=12, pipeline=sleepy_pipeline((1, ))))
    report = measure_dataloader(loader, 6, warmup_iters=0, sample_every=32)
    rank = report['ranks'][0]
    assert rank['batches'] == 5
    assert rank['sampling']['timed_batches'] == 0
    assert rank['stages'] == {} and rank['transforms'] == {}
    assert 'No stage sample yet' in report['verdict']['summary']
    assert 'No stage sample yet' in format_report(report)


def test_cheap_samples_are_sampled_by_their_measured_cost():
    dataset = SleepyDataset(num=16, pipeline=sleepy_pipeline(()))
    loader = _loader(dataset)
    report = measure_dataloader(loader, 48, warmup_iters=0)
    rank = report['ranks'][0]
    # Far under 5 ms a sample: timing every batch would cost over 0.2%.
    assert 0 < rank['sampling']['timed_share'] < 0.5
    assert set(rank['transforms']) == {
        '00_LoadImageFromFile', '01_PackImageLabelInputs'
    }
    assert rank['stages']['decode']['stderr'] >= 0
    with pytest.raises(ValueError, match='sample_every must be None or >= 1'):
        DataLoaderMonitor(loader, sample_every=0)


class _BatchFetching(SleepyDataset):
    """Has its own ``__getitems__``, which counts its calls."""

    batch_fetches = 0

    def __getitems__(self, indices):
        self.batch_fetches += 1
        return [self.prepare_data(index) for index in indices]


@pytest.mark.parametrize('own_getitems', [False, True])
def test_a_batch_is_fetched_in_one_call(own_getitems):
    # The monitor hands torch's fetcher a __getitems__ (calling the
    # dataset's own or its __getitem__ per index), so its bookkeeping runs
    # once per batch; timed and untimed batches alike.
    cls = _BatchFetching if own_getitems else SleepyDataset
    dataset = cls(num=24, pipeline=sleepy_pipeline(()))
    loader = _loader(dataset, batch_size=3)
    plain = [batch_digest(b) for b in loader]
    fetches = getattr(dataset, 'batch_fetches', 0)
    with DataLoaderMonitor(loader, warmup_iters=0, sample_every=2) as monitor:
        assert isinstance(dataset.__getitems__, TimedFetch)
        assert [batch_digest(b) for b in loader] == plain
        rank = monitor.summary()
    assert rank['batches'] == 7 and rank['samples_per_batch'] == 3
    assert rank['sampling']['timed_batches'] == 3
    assert rank['stages']['fetch']['count'] == 3
    if own_getitems:
        assert dataset.batch_fetches - fetches == 8


def test_non_dict_batches_and_unbatched_loaders():
    dataset = SleepyDataset(num=8, pipeline=sleepy_pipeline(()))
    loader = _loader(dataset, collate_fn=TupleCollate(), num_workers=1)
    with DataLoaderMonitor(loader, warmup_iters=0):
        batches = list(loader)
    assert all(type(b) is tuple and len(b) == 2 for b in batches)

    unbatched = DataLoader(dataset, batch_size=None)
    with DataLoaderMonitor(unbatched, warmup_iters=0) as monitor:
        samples = list(unbatched)
    assert all(set(s) == {'inputs', 'data_samples'} for s in samples)
    assert monitor.summary()['samples_per_batch'] == 1


class _Stream(IterableDataset):

    def __init__(self) -> None:
        self.pipeline = [Sleep(1)]

    def __iter__(self):
        for i in range(8):
            yield self.pipeline[0](dict(i=i))


def test_iterable_datasets_time_their_pipeline_and_collate():
    loader = _loader(_Stream())
    report = measure_dataloader(loader, 4, warmup_iters=0)
    rank = report['ranks'][0]
    assert set(rank['stages']) == {'collate'}
    assert rank['transforms']['00_Sleep']['mean'] >= 2


def test_timed_objects_survive_pickling_for_spawn_workers():
    dataset = ConcatDataset([
        SleepyDataset(num=4, pipeline=sleepy_pipeline((1, ))),
        SleepyDataset(num=4, pipeline=sleepy_pipeline((1, )))
    ])
    loader = _loader(dataset)
    with DataLoaderMonitor(loader):
        copy = pickle.loads(pickle.dumps(dataset))
        collate = pickle.loads(pickle.dumps(loader.collate_fn))
    assert type(copy) is ConcatDataset
    assert copy.__getitems__.dataset is copy
    inner = copy.datasets[1].pipeline.transforms[1]
    assert isinstance(inner, TimedTransform) and inner.key == 'p1:01_Sleep'
    assert inner.ms == 1  # attributes reach the wrapped transform
    assert isinstance(collate, TimedCollate)
    batch = collate(copy.__getitems__([0, 5]))
    assert isinstance(batch, MonitoredBatch)
    assert batch.record['samples'] == 2
    assert set(batch.record['stages']) >= {
        'fetch', 'io', 'decode', 'collate', 'p0:01_Sleep', 'p1:01_Sleep'
    }


def test_probes_time_only_inside_monitored_fetches():
    probes.ensure_installed(timed_call, inside_timed_region)
    try:
        assert hasattr(mmcv.imfrombytes, '_data_monitor_original')
        before = dict(ACCUMULATOR.stages)
        mmengine.fileio.get(__file__)
        assert ACCUMULATOR.stages == before
    finally:
        probes.uninstall()
    assert not hasattr(mmcv.imfrombytes, '_data_monitor_original')


def test_bad_inputs_are_refused_with_a_clear_error():
    with pytest.raises(TypeError, match='needs a torch DataLoader'):
        DataLoaderMonitor([1, 2, 3])
    loader = DataLoader(list(range(4)))
    with DataLoaderMonitor(loader):
        with pytest.raises(RuntimeError, match='already measured by another'):
            DataLoaderMonitor(loader).install()
    with pytest.raises(RuntimeError, match='bypasses DataLoader.__iter__'):
        DataMonitorHook().before_train_iter(None, 0, MonitoredBatch({}, {}))


def test_setup_names_the_users_dataset_not_the_seeding_wrapper():
    # the fast-resume loops put SampleSeededDataset around the train dataset
    loader = _loader(SampleSeededDataset(SleepyDataset(num=4)))
    assert loader_context(loader)['dataset_type'] == 'SleepyDataset'
