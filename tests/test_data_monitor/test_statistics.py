"""Steps added to the books in bulk give what adding them one by one gives."""
import numpy as np
import pytest

from mmdata_plugin.data_monitor.statistics import (SampleBuffer, Series,
                                                   StatsBook, StepColumns,
                                                   percentiles)
from mmdata_plugin.data_monitor.step_log import StepLog


@pytest.mark.parametrize('seen', [0, 1, 5, 37])
@pytest.mark.parametrize('run', [1, 3, 16, 64, 200])
def test_a_series_is_thinned_as_its_values_one_by_one(seen, run):
    rng = np.random.default_rng(seen * 1000 + run)
    values = rng.normal(size=seen + 5 * run)
    single, bulk = SampleBuffer(capacity=16), SampleBuffer(capacity=16)
    for value in values[:seen]:
        single.add(float(value))
        bulk.add(float(value))
    for value in values[seen:]:
        single.add(float(value))
    for first in range(seen, len(values), run):
        bulk.extend(Series(values[first:first + run]))
    assert bulk.values == single.values
    assert (bulk.stride, bulk.seen) == (single.stride, single.seen)
    assert bulk.peak == single.peak
    assert bulk.total == pytest.approx(single.total, abs=1e-9)
    assert bulk.squares == pytest.approx(single.squares)


@pytest.mark.parametrize('count', [1, 2, 3, 10, 11, 64, 65, 1023, 1024, 4097])
def test_percentiles_are_numpys_to_the_last_bit(count):
    rng = np.random.default_rng(count)
    for values in (rng.lognormal(size=count) * 1e-3,
                   np.round(rng.uniform(size=count), 2),
                   np.full(count, 0.1)):
        buffer = SampleBuffer(capacity=4096)
        for value in values.tolist():
            buffer.add(value)
        expected = np.percentile(buffer.values.tolist(), (50, 90, 100))
        assert percentiles(buffer.values, (50, 90, 100)) == [
            float(v) for v in expected
        ]


def _steps(count, workers):
    rng = np.random.default_rng(count + workers)
    steps, clock = [], 0.0
    for index in range(count):
        worker = index % workers if workers else -1
        start = clock + rng.uniform(0, 0.01)
        end = start + rng.uniform(0.001, 0.02)
        requested = end + rng.uniform(-0.01, 0.01)
        received = max(requested, end) + rng.uniform(0, 0.001)
        timed = index % 7 == 0
        record = dict(
            pid=100 + worker + 10 * (index // 50),
            worker=worker,
            samples=4,
            start=start,
            end=end,
            cpu=0.9 * (end - start),
            stages=dict(fetch=end - start, collate=1e-4) if timed else {},
            drops={'00_Load': 1} if index == 14 else {},
            refetch_time=1e-3 if index == 14 else 0.0,
            timed=timed)
        if index == 21:
            record['stages']['03_Late'] = 2e-3
        if index == 30:
            record = None  # a batch without a worker record
        compute = None if index == 0 else rng.uniform(0, 0.01)
        trainer = dict(receive=1e-5) if index % 3 == 0 else {}
        steps.append((received - requested, compute, record, requested,
                      received, trainer, index))
        clock = received
    return steps


def _log(steps):
    log = StepLog()
    for step in steps:
        log.append(*step)
    return log


def _close(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _close(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12)
    else:
        assert a == b


@pytest.mark.parametrize('workers', [0, 1, 3])
def test_a_run_of_steps_adds_up_as_its_steps_one_by_one(workers):
    steps = _steps(150, workers)
    single, bulk = StatsBook(capacity=32), StatsBook(capacity=32)
    for step in steps:
        single.add(*step[:6])  # (the step's number is not booked)
    for first in range(0, len(steps), 64):
        bulk.add_columns(StepColumns(_log(steps[first:first + 64])))
    _close(bulk.summary(), single.summary())
    assert set(bulk.workers) == set(single.workers)


def test_a_run_of_steps_gives_each_workers_figures():
    steps = _steps(120, 3)
    book = StatsBook()
    book.add_columns(StepColumns(_log(steps)))
    summary = book.summary()
    for stats in summary['workers']:
        mine = [(rec, req, rcv) for _, _, rec, req, rcv, _, _ in steps
                if rec is not None and rec['worker'] == stats['worker']]
        times = [rec['end'] - rec['start'] for rec, _, _ in mine]
        transfer = [rcv - max(req, rec['end']) for rec, req, rcv in mine]
        slack = [req - rec['end'] for rec, req, _ in mine]
        assert stats['batches'] == len(mine)
        assert stats['time']['mean'] == pytest.approx(1e3 * np.mean(times))
        assert stats['time']['max'] == pytest.approx(1e3 * max(times))
        assert stats['transfer'] == pytest.approx(1e3 * np.mean(transfer))
        assert stats['slack'] == pytest.approx(1e3 * np.mean(slack))
        timed = sum(rec['timed'] for rec, _, _ in mine)
        assert stats['timed_batches'] == timed
        assert stats['pids'] == sorted({rec['pid'] for rec, _, _ in mine})
    assert summary['trainer'] == pytest.approx(dict(receive=1e-2 * 40 / 120))
    assert summary['compute']['count'] == 119
    assert summary['samples_per_batch'] == 4


def test_ray_actors_batches_keep_where_they_were_made():
    # A Ray data actor's record is kept whole (untimed, but with its node):
    # its worker's and its node's figures say where and how many bytes.
    steps, clock = [], 0.0
    for index in range(30):
        worker = index % 3  # 0 and 1: actors; 2: a local worker
        record = dict(pid=100 + worker, worker=worker, samples=2,
                      start=clock, end=clock + 0.01, cpu=0.005, timed=False)
        if worker < 2:
            record.update(node=f'node{worker}', ip='127.0.0.1',
                          host=f'host{worker}', bytes=1000 * (worker + 1))
        steps.append((0.001, 0.02, record, clock + 0.01, clock + 0.011, {},
                      index))
        clock += 0.02
    log = _log(steps)
    assert len(log.records) == 20
    summary = StatsBook()
    summary.add_columns(StepColumns(log))
    summary = summary.summary()
    workers = {w['worker']: w for w in summary['workers']}
    for actor in (0, 1):
        assert workers[actor]['hosts'] == [f'host{actor}']
        assert workers[actor]['nodes'] == [f'node{actor}']
        assert workers[actor]['bytes'] == 1000 * (actor + 1)
    assert 'hosts' not in workers[2] and workers[2]['batches'] == 10
    assert [(n['node'], n['batches'], n['host']) for n in summary['nodes']
            ] == [('node0', 10, 'host0'), ('node1', 10, 'host1')]
