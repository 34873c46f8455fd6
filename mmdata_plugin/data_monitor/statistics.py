"""Per-step figures of one process, aggregated into a JSON-able summary.

All durations are kept in seconds and reported in milliseconds. Memory is
bounded: percentiles come from a deterministically thinned sample (no
random numbers are drawn anywhere in the monitor), means and maxima from
exact running sums.

Wait, compute, transfer, slack, worker time, samples and CPU are exact: every
batch records them. Stage times come from the *timed* batches only (see
:mod:`.worker_timing`): their means are estimates whenever not every batch
was timed, reported with their standard error (``stderr``).
"""
import copy
import math
from array import array
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .probes import DECODE, IO
from .step_log import (COMPUTE, CPU, END, PID, REQUESTED, SAMPLES, START,
                       WAIT, WORKER, StepLog, is_timed, transfer_times,
                       worker_times)
from .worker_timing import COLLATE, FETCH

#: Stages of a worker's batch production that are not pipeline transforms,
#: in the order tables list them.
BASE_STAGES = (IO, DECODE, FETCH, COLLATE)
#: The training process's data stages that hold up its training thread
#: between two requests for a batch: waiting for the fed batch, the data
#: preprocessor. ``receive`` and ``pin`` run in the pin-memory thread when
#: there is one (else inside the wait), ``unpack`` in DeviceFeeder's
#: placing thread.
MAIN_THREAD_STAGES = ('to_device', 'preprocess')


#: Up to this many values, :func:`percentiles` sorts them in Python.
SORTED_BELOW = 64


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list:
    """``np.percentile(values, qs)``, the same floats, at a fraction of its
    cost on the few thousand values a report describes (it converts them
    and runs generic checks per call; a report makes dozens of calls).

    The linear method as numpy computes it: the order statistics around
    ``(n - 1) * q / 100`` (found by one partition, or for a few values by
    sorting them, which costs less than numpy's fixed cost per call),
    interpolated from the nearer one.
    """
    count = len(values)
    if not count:
        raise ValueError('percentiles of no values')
    positions = [(count - 1) * (q / 100) for q in qs]
    below = [math.floor(p) for p in positions]
    if count <= SORTED_BELOW:
        ordered = sorted(values)
    else:
        ordered = np.partition(
            np.asarray(values, dtype=float),
            sorted({i for b in below for i in (b, min(b + 1, count - 1))}))
    result = []
    for position, low in zip(positions, below):
        a, b = float(ordered[low]), float(ordered[min(low + 1, count - 1)])
        weight, step = position - low, b - a
        result.append(b - step * (1 - weight) if weight >= 0.5 else
                      a + step * weight)
    return result


def describe(values, total: float, count: int, peak: float) -> dict:
    """``mean``, ``p50``, ``p90``, ``max`` (ms) and ``count``."""
    if not count:
        return dict(mean=0.0, p50=0.0, p90=0.0, max=0.0, count=0)
    p50, p90 = percentiles(values, (50, 90)) if len(values) else (0, 0)
    return dict(
        mean=1e3 * total / count,
        p50=1e3 * float(p50),
        p90=1e3 * float(p90),
        max=1e3 * peak,
        count=count)


class SampleBuffer:
    """Running sum/max of a series plus an evenly thinned sample of it.

    Once ``capacity`` values are kept, every other one is dropped and only
    every ``stride``-th new value is kept, so the sample always covers the
    whole run evenly. They are kept in an ``array('d')``: a copy of it (a
    report's snapshot) is one ``memcpy``, and numpy reads it without
    converting each float.

    Args:
        capacity (int): Most values kept for percentiles.
    """

    __slots__ = ('capacity', 'values', 'stride', 'seen', 'total', 'squares',
                 'peak')

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.values = array('d')
        self.stride = 1
        self.seen = 0
        self.total = 0.0
        self.squares = 0.0
        self.peak = 0.0

    def add(self, value: float) -> None:
        if self.seen % self.stride == 0:
            self.values.append(value)
            if len(self.values) > self.capacity:
                del self.values[1::2]
                self.stride *= 2
        self.seen += 1
        self.total += value
        self.squares += value * value
        if value > self.peak:
            self.peak = value

    def extend(self, series: 'Series') -> None:
        """Add the values of ``series`` in order, as :meth:`add` would one
        by one (the same thinned sample; sums up to rounding)."""
        values = series.values
        count = len(values)
        if not count:
            return
        kept, stride = self.values, self.stride
        first = -self.seen % stride
        while first < count:
            # Appending `room` values overflows the capacity: thin there.
            room = self.capacity + 1 - len(kept)
            taken = values[first:first + room * stride:stride]
            kept.extend(taken)
            first += len(taken) * stride
            if len(kept) > self.capacity:
                del kept[1::2]
                # The next kept value lies on the doubled stride's grid.
                first += (-(self.seen + first)) % (2 * stride)
                stride = self.stride = 2 * stride
        self.seen += count
        self.total += series.total
        self.squares += series.squares
        if series.peak > self.peak:
            self.peak = series.peak

    def copy(self) -> 'SampleBuffer':
        """An independent copy (the kept values are copied, not shared)."""
        other = SampleBuffer.__new__(SampleBuffer)
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        other.values = self.values[:]
        return other

    def describe(self) -> dict:
        return describe(self.values, self.total, self.seen, self.peak)

    def stderr(self, population: int) -> float:
        """Standard error (ms) of the mean as an estimate of the mean of
        ``population`` values of which these are an even sample."""
        n = self.seen
        if n < 2 or n >= population:
            return 0.0
        mean = self.total / n
        variance = max(self.squares / n - mean * mean, 0.0) * n / (n - 1)
        return 1e3 * math.sqrt(variance / n * (1 - n / population))


class Series:
    """One figure over a run of steps, with the sums a :class:`SampleBuffer`
    keeps: reduced once for all the books the run goes to.

    Args:
        values (np.ndarray): The figure per step, in step order.
    """

    __slots__ = ('values', 'total', 'squares', 'peak')

    def __init__(self, values: np.ndarray) -> None:
        # An array('d'), which a SampleBuffer slices and extends by.
        self.values = array('d', values.tobytes())
        self.total = float(values.sum())
        self.squares = float(values @ values)
        self.peak = float(values.max()) if len(values) else 0.0


class WorkerRun:
    """The batches of one worker process within a run of steps (or of one
    Ray data actor, or made on one data node).

    Args:
        pids (set): Their processes' ids.
        timed (list[dict]): Their records of timed batches.
        time (Series): Their worker times.
        transfer (float): Their transfer times' sum.
        slack (float): Their slacks' sum.
        cpu (float): Their CPU times' sum.
        places (set, optional): ``(host, ip, node)`` of the Ray data actors
            that made them; empty for DataLoader workers.
        nbytes (int): Their blocks' bytes (Ray data actors). Defaults to 0.
    """

    __slots__ = ('pids', 'timed', 'time', 'transfer', 'slack', 'cpu',
                 'places', 'bytes')

    def __init__(self,
                 pids: set,
                 timed: List[dict],
                 time: Series,
                 transfer: float,
                 slack: float,
                 cpu: float,
                 places: Optional[set] = None,
                 nbytes: int = 0) -> None:
        self.pids = pids
        self.timed = timed
        self.time = time
        self.transfer = transfer
        self.slack = slack
        self.cpu = cpu
        self.places = places or set()
        self.bytes = nbytes


def _made_where(records: List[dict]) -> tuple:
    """``(places, bytes)`` of batches made by Ray data actors (the records
    of one worker or one node all come from one kind of producer); empty
    for workers."""
    if not records or 'node' not in records[0]:
        return set(), 0
    return ({(record['host'], record['ip'], record['node'])
             for record in records}, sum(record['bytes'] for record in records))


class StepColumns:
    """A run of counted steps as columns, to add them to books in bulk.

    Adding steps one at a time costs a dozen method calls each; a run of
    them costs a few numpy reductions per figure over the rows of its
    :class:`StepLog`, shared by every book.

    Args:
        log (StepLog): The run's steps.
        rows (np.ndarray, optional): ``log.rows()``, when the caller has
            them already.
    """

    def __init__(self, log: StepLog, rows: Optional[np.ndarray] = None
                 ) -> None:
        if rows is None:
            rows = log.rows()
        compute = rows[:, COMPUTE]
        self.wait = Series(rows[:, WAIT])
        self.compute = Series(compute[~np.isnan(compute)])
        self.trainer = log.trainer
        # Steps without a worker record have no worker figures.
        with_record = ~np.isnan(rows[:, START])
        rows = rows[with_record]
        worker_time = worker_times(rows)
        transfer = transfer_times(rows)
        slack = rows[:, REQUESTED] - rows[:, END]
        cpu = rows[:, CPU]
        self.worker = Series(worker_time)
        self.transfer = Series(transfer)
        self.slack = Series(slack)
        self.samples = int(rows[:, SAMPLES].sum())
        self.cpu = float(cpu.sum())
        self.timed = [
            record for _, record in log.records if is_timed(record)
        ]
        figures = (rows[:, PID], worker_time, transfer, slack, cpu)
        # The batches of Ray data actors (their records are kept), with
        # their positions among the rows that have a record.
        made = [(row, record) for row, record in log.records
                if 'node' in record]
        made_records = [record for _, record in made]
        self.workers = self._by('worker', rows[:, WORKER], figures,
                                made_records)
        # Per node: the actors' batches (a local worker's beside them, with
        # RayDataNodesHook(local_workers=True), is on no node).
        self.nodes = {}
        if made:
            positions = np.cumsum(with_record)[[row for row, _ in made]] - 1
            nodes = np.asarray([record['node'] for record in made_records])
            self.nodes = self._by(
                'node', nodes, tuple(figure[positions] for figure in figures),
                made_records)

    def _by(self, key: str, groups: np.ndarray, figures: tuple,
            made: List[dict]) -> Dict[Any, WorkerRun]:
        """The figures (pids, worker time, transfer, slack, CPU per batch)
        grouped by ``groups`` (the ``key`` of each batch's record: its
        worker, or its Ray node), in the order the groups first come;
        ``made``: the Ray data actors' records, for where they made their
        batches."""
        pids, worker_time, transfer, slack, cpu = figures
        runs = {}
        for group in _first_seen(groups):
            mine = groups == group
            name = int(group) if key == 'worker' else group
            runs[name] = WorkerRun(
                set(pids[mine].astype(np.int64).tolist()),
                [record for record in self.timed
                 if record.get(key) == name], Series(worker_time[mine]),
                float(transfer[mine].sum()), float(slack[mine].sum()),
                float(cpu[mine].sum()),
                *_made_where([r for r in made if r[key] == name]))
        return runs


def _first_seen(values: np.ndarray) -> list:
    """The distinct ``values`` in the order they first come: a run's few
    workers (or nodes) found by numpy's sort, not by a ``dict.fromkeys``
    of each batch's (a Python object made and hashed per batch)."""
    distinct, first = np.unique(values, return_index=True)
    return distinct[np.argsort(first)].tolist()


class WorkerStats:
    """Batches produced by one worker process (or Ray data actor, or on
    one data node)."""

    def __init__(self, capacity: int) -> None:
        self.time = SampleBuffer(capacity)
        self.pids = set()
        self.places = set()
        self.bytes = 0
        self.stage_totals: Dict[str, float] = defaultdict(float)
        self.timed = 0
        self.transfer = 0.0
        self.slack = 0.0
        self.cpu = 0.0

    def add_run(self, run: WorkerRun) -> None:
        self.time.extend(run.time)
        self.pids |= run.pids
        self.timed += len(run.timed)
        totals = self.stage_totals
        for record in run.timed:
            for key, value in record['stages'].items():
                totals[key] += value
        self.transfer += run.transfer
        self.slack += run.slack
        self.cpu += run.cpu
        self.places |= run.places
        self.bytes += run.bytes

    def copy(self) -> 'WorkerStats':
        other = copy.copy(self)
        other.time = self.time.copy()
        other.pids, other.places = set(self.pids), set(self.places)
        other.stage_totals = defaultdict(float, self.stage_totals)
        return other

    def summary(self, worker: int) -> dict:
        batches = self.time.seen
        stages = {key: 0.0 for key in BASE_STAGES}
        stages['transforms'] = 0.0
        for key, total in self.stage_totals.items():
            stages[key if key in stages else 'transforms'] += total
        timed = max(self.timed, 1)
        return dict(
            worker=worker,
            **self._place(batches),
            # Non-persistent workers get a new process every epoch.
            pids=sorted(self.pids)[-8:],
            processes=len(self.pids),
            batches=batches,
            timed_batches=self.timed,
            time=self.time.describe(),
            stages={k: 1e3 * v / timed
                    for k, v in stages.items()},
            transfer=1e3 * self.transfer / batches,
            slack=1e3 * self.slack / batches,
            cpu_share=self.cpu / max(self.time.total, 1e-12))

    def _place(self, batches: int) -> dict:
        """Where the batches of Ray data actors were made, their size and
        the rate of their transfer (nothing for local workers)."""
        if not self.places:
            return {}
        hosts, ips, nodes = zip(*sorted(self.places))
        return dict(
            hosts=list(hosts),
            ips=list(ips),
            nodes=list(nodes),
            bytes=self.bytes / batches,
            gbps=self.bytes / max(self.transfer, 1e-12) / 1e9)

    def node_summary(self, node: str) -> dict:
        """The figures of the batches made on ``node`` (a Ray node id)."""
        summary = self.summary(-1)
        for key in ('worker', 'stages', 'timed_batches', 'nodes'):
            del summary[key]
        return dict(summary, node=node, host=summary.pop('hosts')[0],
                    ip=summary.pop('ips')[0])


class StatsBook:
    """Everything measured over a span of counted steps.

    Args:
        capacity (int): Values kept per series for percentiles.
    """

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self.wait = SampleBuffer(capacity)
        self.compute = SampleBuffer(capacity)
        self.worker = SampleBuffer(capacity)
        self.transfer = SampleBuffer(capacity)
        self.slack = SampleBuffer(capacity)
        self.stages: Dict[str, SampleBuffer] = {}
        self.workers: Dict[int, WorkerStats] = {}
        self.nodes: Dict[str, WorkerStats] = {}
        self.samples = 0
        self.timed = 0
        self.timed_samples = 0
        self.cpu = 0.0
        self.drops: Dict[str, int] = defaultdict(int)
        self.refetch_time = 0.0
        self.trainer: Dict[str, float] = defaultdict(float)

    def add(self,
            wait: float,
            compute: Optional[float],
            record: Optional[dict],
            t_request: float,
            t_received: float,
            trainer: Optional[dict] = None) -> None:
        """Add one counted step.

        Args:
            wait (float): Seconds the consumer waited in ``next()``.
            compute (float, optional): Seconds the consumer spent between
                the previous batch and this request.
            record (dict, optional): The batch's worker record.
            t_request (float): When ``next()`` was called.
            t_received (float): When it returned.
            trainer (dict, optional): The training process's data work
                for this step (seconds by stage).
        """
        log = StepLog()
        log.append(wait, compute, record, t_request, t_received, trainer)
        self.add_columns(StepColumns(log))

    def add_columns(self, columns: StepColumns) -> None:
        """Add a run of counted steps (see :meth:`add`)."""
        self.wait.extend(columns.wait)
        for key, seconds in columns.trainer.items():
            self.trainer[key] += seconds
        self.compute.extend(columns.compute)
        self.worker.extend(columns.worker)
        self.transfer.extend(columns.transfer)
        self.slack.extend(columns.slack)
        self.samples += columns.samples
        self.cpu += columns.cpu
        for record in columns.timed:
            self._add_stages(record)
        for groups, runs in ((self.workers, columns.workers),
                             (self.nodes, columns.nodes)):
            for group, run in runs.items():
                stats = groups.get(group)
                if stats is None:
                    stats = groups[group] = WorkerStats(
                        min(self.capacity, 1024))
                stats.add_run(run)

    def sums(self) -> tuple:
        """``(steps, wait, worker time, batches, compute, computed
        steps)``: the running sums (seconds) the pool sizing of
        RayDataNodesHook compares between two reads."""
        return (self.wait.seen, self.wait.total, self.worker.total,
                self.worker.seen, self.compute.total, self.compute.seen)

    def copy(self) -> 'StatsBook':
        """A copy that later additions to this book leave unchanged, made
        in well under a millisecond (the kept values are copied by C
        loops, nothing is summarised): its :meth:`summary` can then run on
        another thread while this book goes on counting."""
        other = copy.copy(self)
        for name in ('wait', 'compute', 'worker', 'transfer', 'slack'):
            setattr(other, name, getattr(self, name).copy())
        other.stages = {k: b.copy() for k, b in self.stages.items()}
        other.workers = {k: w.copy() for k, w in self.workers.items()}
        other.nodes = {k: w.copy() for k, w in self.nodes.items()}
        other.drops = defaultdict(int, self.drops)
        other.trainer = defaultdict(float, self.trainer)
        return other

    def _add_stages(self, record: dict) -> None:
        self.timed += 1
        self.timed_samples += record['samples']
        self.refetch_time += record['refetch_time']
        for key, count in record['drops'].items():
            self.drops[key] += count
        stages = record['stages']
        buffers = self.stages
        for key, buffer in buffers.items():
            buffer.add(stages.get(key, 0.0))
        if not stages.keys() <= buffers.keys():
            for key in stages.keys() - buffers.keys():
                self._new_stage(key).add(stages[key])

    def _new_stage(self, key: str) -> SampleBuffer:
        buffer = self.stages[key] = SampleBuffer(self.capacity)
        # Timed batches before this stage first ran spent no time in it.
        for _ in range(self.timed - 1):
            buffer.add(0.0)
        return buffer

    def summary(self) -> dict:
        """The span as plain data (ms); see docs/data_monitor.md."""
        batches = self.worker.seen
        worker_mean = self.worker.total / batches if batches else 0.0

        def stage(buffer: SampleBuffer) -> dict:
            # Over the timed batches: an estimate of all batches' mean.
            described = buffer.describe()
            described['share'] = (
                described['mean'] / 1e3 /
                worker_mean if worker_mean else 0.0)
            described['stderr'] = buffer.stderr(batches)
            return described

        wait, compute = self.wait.total, self.compute.total
        # Steps without a compute figure (the first after a start) still
        # waited; scale compute to the counted steps for the share.
        if self.compute.seen:
            compute *= self.wait.seen / self.compute.seen
        # A step's wait + compute is the time from the batch before it to
        # its own: their sum is the wall time of the counted steps.
        span = wait + compute
        refetched = sum(self.drops.values())
        steps = self.wait.seen
        trainer = {
            key: 1e3 * total / steps
            for key, total in sorted(self.trainer.items())
        } if steps else {}
        main_thread = sum(trainer.get(key, 0.0) for key in MAIN_THREAD_STAGES)
        return dict(
            steps=self.wait.seen,
            batches=batches,
            samples_per_batch=self.samples / batches if batches else 0.0,
            sampling=dict(
                timed_batches=self.timed,
                timed_share=self.timed / batches if batches else 0.0),
            wait=self.wait.describe(),
            compute=self.compute.describe(),
            worker=self.worker.describe(),
            transfer=self.transfer.describe(),
            slack=self.slack.describe(),
            wait_share=wait / span if span else 0.0,
            # The training process's data work per step (ms), and the share
            # of step time its main thread spent on it, inside compute.
            trainer=trainer,
            trainer_share=1e-3 * main_thread * steps / span if span else 0.0,
            # Samples are counted by the dataset's timed fetch: None where
            # the dataset could not be given one.
            throughput=dict(
                batches_per_s=self.wait.seen / span if span else 0.0,
                samples_per_s=(self.samples /
                               span if span and self.samples else None)),
            cpu_share=(self.cpu / self.worker.total
                       if self.worker.total else None),
            stages={
                key: stage(self.stages[key])
                for key in BASE_STAGES if key in self.stages
            },
            transforms={
                key: stage(buffer)
                for key, buffer in sorted(self.stages.items())
                if key not in BASE_STAGES
            },
            # Seen in the timed batches (transforms are wrapped there).
            refetch=dict(
                count=refetched,
                per_sample=(refetched / self.timed_samples
                            if self.timed_samples else 0.0),
                ms_per_batch=(1e3 * self.refetch_time /
                              self.timed if self.timed else 0.0),
                drops=dict(self.drops)),
            workers=[
                stats.summary(worker)
                for worker, stats in sorted(self.workers.items())
            ],
            **self._node_summaries())

    def _node_summaries(self) -> dict:
        """``nodes``: per Ray data node (nothing with local workers)."""
        if not self.nodes:
            return {}
        return dict(nodes=[
            stats.node_summary(node)
            for node, stats in sorted(self.nodes.items())
        ])
