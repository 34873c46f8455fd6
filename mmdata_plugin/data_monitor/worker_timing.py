"""Timing inside the process that loads the data (a worker, or the main one).

Every timed region -- a dataset fetch (a whole batch's, when the loader
batches), a pipeline transform, a file read, an image decode -- runs through :func:`timed_call`, which keeps a stack of
open regions so that each region is charged its *self* time (its duration
minus that of the regions it contains). The sums build up in one per-process
:class:`BatchAccumulator`; the collate wrapper turns them into one small
record per batch and sends it to the main process together with the batch,
as a :class:`MonitoredBatch`. Nothing is added to the samples or the batch
itself, so ``Pack*`` transforms, ``pseudo_collate`` and the model see the
same data as without the monitor, and nothing here draws random numbers.

A DataLoader worker runs its fetches and the collate of one batch one after
the other in one thread, which is what makes a per-process accumulator
exact. Datasets that fan a batch out to their own threads are timed as a
whole, not per transform.

Sampling. Timing a region costs 1.5-2 us, a cheap sample a few of them; so
only every K-th batch of a process is timed in stages (a *timed* batch), the
others run the original, unwrapped transforms (a :class:`TimingPlan` swaps
the pipeline lists at batch boundaries) and record only what is exact for
every batch: its start, end, CPU time and samples, taken once per batch
(the dataset's :class:`TimedFetch`, the collate), so an untimed batch
costs nothing per sample. K is chosen after each timed batch from its CPU
time, samples and how many regions it timed (:func:`sampling_interval`), so
that timing costs, amortised, at most :data:`TARGET_OVERHEAD` of the
worker's CPU time and :data:`SAMPLE_BUDGET` per sample, whichever is less
(reached by doubling K from one timed batch to the next):
the benchmark's 64x64 JPEGs (4 regions, batch 32) are timed about one
batch in 40, the demo's samples (5 regions, batch 16) one in 50, and
20-region detection samples one in 200. No random number is drawn: the
choice is a countdown.
"""
import math
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from torch.utils.data import get_worker_info

from ..utils.receipt_stamp import ReceiptStamp
# torch's own recursive pinning: MonitoredBatch hands its batch to it so
# that pin_memory=True pins exactly what it pins without us.
from ..utils.torch_internals import pin_memory as torch_pin_memory
from . import probes

_perf_counter = time.perf_counter
_thread_time = time.thread_time

#: Stage that collects a fetch's time outside pipeline transforms, file
#: reads and decodes (annotation lookup, deserialisation, custom loaders).
FETCH = 'fetch'
COLLATE = 'collate'

#: Cost of one timed region inside a real pipeline (two clock reads, the
#: stack and a dict update, plus the cache misses they cause between
#: decodes), taken at the top of what tools/benchmark_monitor_overhead.py
#: measured for its cheap and demo pipelines (2.3-2.5 us, then 2.4-3.7 us
#: on a busier machine): under-counting it lets timing exceed its budget.
REGION_COST = 4e-6
#: What timing may cost, amortised over the batches, whichever is less: a
#: share of the worker's CPU time, and seconds per sample (a heavy sample
#: would otherwise be timed at every batch: cheap in share, not in time).
TARGET_OVERHEAD = 0.002
SAMPLE_BUDGET = 0.25e-6
#: Batches of each process timed in full before sampling starts (they also
#: measure the cost K is chosen from), and the largest K: enough for 25
#: timed regions per sample (nested wrappers, probes) within the budget.
FULL_BATCHES = 8
MAX_EVERY = 512


class TimingPlan:
    """The pipeline lists of one instrumented dataset, timed and plain.

    Held by the dataset's :class:`TimedFetch`, so that it travels to spawn
    workers with it; registered with the accumulator of each process that
    fetches from the dataset, which calls :meth:`apply` at batch
    boundaries. At rest the lists hold the timed transforms.

    Args:
        sample_every (int, optional): Time every this many batches; None
            chooses it from the measured cost.
        probes (bool): The IO/decode probes belong to timed batches.
    """

    def __init__(self, sample_every: Optional[int] = None,
                 probes: bool = True) -> None:
        self.sample_every = sample_every
        self.probes = probes
        self.lists: List[tuple] = []  # (list, plain items, timed items)

    def add_list(self, items: list, plain: list) -> None:
        self.lists.append((items, plain, list(items)))

    def apply(self, timed: bool, with_probes: bool = True) -> None:
        """Put the timed (or the plain) transforms into the lists."""
        for items, plain, wrapped in self.lists:
            items[:] = wrapped if timed else plain
        if self.probes and with_probes:
            if timed:
                probes.ensure_installed(timed_call, inside_timed_region)
            else:
                probes.uninstall()


class BatchAccumulator:
    """What the current process has measured since its last batch record.

    Attributes:
        stages (dict): Self time in seconds per stage key.
        stack (list): Child time of each open region (innermost last).
        samples (int): Top-level dataset fetches.
        drops (dict): Top-level transforms that returned ``None`` (the
            dataset then re-fetches another index), per key.
        refetch_time (float): Seconds spent on those dropped attempts.
        attempt_start (dict): Start of the current attempt per pipeline.
        regions (int): Regions timed in this batch.
        timing (bool): Whether this batch is timed in stages.
        plans (list): Registered :class:`TimingPlan` s (none: every batch
            is timed).
        every (int): Current K: one batch in ``every`` is timed.
    """

    __slots__ = ('stages', 'stack', 'samples', 'drops', 'refetch_time',
                 'attempt_start', 't_first', 'cpu_first', 'regions',
                 'timing', 'plans', 'batches', 'countdown', 'every')

    def __init__(self) -> None:
        self.stack = []
        self.plans: List[TimingPlan] = []
        self.restart_sampling()
        self.reset()

    def reset(self) -> None:
        self.stages: Dict[str, float] = {}
        self.samples = 0
        self.drops: Dict[str, int] = {}
        self.refetch_time = 0.0
        self.attempt_start: Dict[int, float] = {}
        self.t_first: Optional[float] = None
        self.cpu_first = 0.0
        self.regions = 0

    def restart_sampling(self) -> None:
        self.timing = True
        self.batches = 0
        self.countdown = 0
        self.every = 1

    def start_batch(self) -> None:
        self.t_first, self.cpu_first = _perf_counter(), _thread_time()

    def register(self, plan: TimingPlan) -> None:
        """Sample this process's batches with ``plan`` (from now on).

        Called at the first fetch of a monitored dataset in this process,
        which is the first fetch of a batch. A new monitor starts a fresh
        schedule whatever ran before in the process (an earlier loader's
        countdown, a plan of a monitor that was never uninstalled, the
        state a fork inherited): its first :data:`FULL_BATCHES` batches
        are timed in full, and K is chosen from its own cost.
        """
        if plan in self.plans:
            return
        if not self.stack:  # leftovers of an aborted batch are not ours
            self.reset()
        self.plans.append(plan)
        self.restart_sampling()
        for each in self.plans:
            each.apply(True)

    def unregister(self, plan: TimingPlan) -> None:
        if plan not in self.plans:
            return
        self.plans.remove(plan)
        plan.apply(True, with_probes=False)
        if not self.plans:
            self.restart_sampling()

    def take_record(self, collate_start: float, collate_end: float) -> dict:
        """The record of the batch just collated; starts the next one.

        An untimed batch's record holds only its exact totals: no stage
        figures were taken, and the books read none from it.
        """
        if self.t_first is None:  # nothing was timed before the collate
            self.t_first, self.cpu_first = collate_start, _thread_time()
        cpu = _thread_time() - self.cpu_first
        pid, worker = _process_ids()
        timed = self.timing
        record = {
            'pid': pid,
            'worker': worker,
            'samples': self.samples,
            'start': self.t_first,
            'end': collate_end,
            'cpu': cpu,
            'timed': timed
        }
        if timed:
            stages = self.stages
            stages[COLLATE] = stages.get(COLLATE, 0.0) + (
                collate_end - collate_start)
            record.update(
                stages=stages,
                drops=self.drops,
                refetch_time=self.refetch_time)
        if self.plans:
            self._schedule(cpu)
        if timed or self.regions:
            self.reset()
        else:  # nothing was timed: the containers are empty, keep them
            self.samples = 0
            self.t_first = None
        return record

    def _schedule(self, batch_cpu: float) -> None:
        """Choose whether the next batch is timed (a countdown).

        The timing cost is CPU work, so it is weighed against the batch's
        CPU time: wall time would shrink K when other jobs slow the worker
        down, and a batch that waits for files gains nothing from timing
        more often. K at most doubles from one timed batch to the next, so
        that a short run (or the first log intervals after the warm-up)
        still gets timed batches; over a run that costs about log2(K)
        timed batches more.
        """
        if self.timing:
            fixed = self.plans[-1].sample_every  # the newest monitor's
            if fixed is not None:
                self.every = fixed
            elif self.batches >= FULL_BATCHES - 1:
                self.every = min(
                    2 * self.every,
                    sampling_interval(self.regions, self.samples, batch_cpu))
            self.countdown = self.every
        self.batches += 1
        self.countdown -= 1
        timing = self.countdown <= 0
        if timing != self.timing:
            self.timing = timing
            for plan in self.plans:
                plan.apply(timing)


def sampling_interval(regions: int, samples: int, batch_cpu: float) -> int:
    """K: time one batch in K so that timing ``regions`` regions (and the
    batch's record) costs at most :data:`TARGET_OVERHEAD` of ``batch_cpu``
    and :data:`SAMPLE_BUDGET` per sample, amortised."""
    cost = (regions + 1) * REGION_COST
    budget = min(TARGET_OVERHEAD * batch_cpu, SAMPLE_BUDGET * samples)
    return min(MAX_EVERY, max(1, math.ceil(cost / max(budget, 1e-12))))


#: The accumulator of this process (each DataLoader worker has its own copy).
ACCUMULATOR = BatchAccumulator()

#: ``(pid, DataLoader worker id or -1)`` of this process, once known: looked
#: up at its first record (a worker knows its id by then), forgotten in a
#: forked child (getpid is a system call: not one per batch).
_process: Optional[Tuple[int, int]] = None


def _process_ids() -> Tuple[int, int]:
    global _process
    if _process is None:
        info = get_worker_info()
        _process = (os.getpid(), -1 if info is None else info.id)
    return _process


def _forget_process() -> None:
    global _process
    _process = None


os.register_at_fork(after_in_child=_forget_process)


def timed_call(key: str, fn: Callable, *args, **kwargs) -> Any:
    """Call ``fn`` and charge its self time to stage ``key``."""
    acc = ACCUMULATOR
    stack = acc.stack
    start = _perf_counter()
    if acc.t_first is None:
        acc.t_first, acc.cpu_first = start, _thread_time()
    acc.regions += 1
    stack.append(0.0)
    try:
        return fn(*args, **kwargs)
    finally:
        elapsed = _perf_counter() - start
        child = stack.pop()
        stages = acc.stages
        stages[key] = stages.get(key, 0.0) + elapsed - child
        if stack:
            stack[-1] += elapsed


def inside_timed_region() -> bool:
    """Whether a monitored fetch is running (probes time nothing else)."""
    return bool(ACCUMULATOR.stack)


class TimedTransform:
    """A pipeline transform whose calls are timed under ``key``.

    It stands in the pipeline's list in place of the transform and forwards
    every attribute to it (``hasattr(t, 'get_indexes')`` of mix transforms,
    ``repr`` in logs). It is picklable, so spawn workers receive it.

    Args:
        transform (callable): The wrapped transform.
        key (str): Stage key, ``'{position:02d}_{ClassName}'`` (nested:
            ``'{parent key}.{position}_{ClassName}'``).
        pipeline (int): Index of the pipeline it belongs to.
        position (int | None): Its position in a dataset's top-level
            pipeline, None when nested. A ``None`` returned by a top-level
            transform makes the dataset re-fetch, which is counted.
    """

    def __init__(self,
                 transform: Callable,
                 key: str,
                 pipeline: int = 0,
                 position: Optional[int] = None) -> None:
        self.transform = transform
        self.key = key
        self.pipeline = pipeline
        self.position = position

    def __call__(self, *args, **kwargs):
        # timed_call inlined: this runs for every transform of every sample.
        acc = ACCUMULATOR
        stack = acc.stack
        start = _perf_counter()
        if acc.t_first is None:
            acc.t_first, acc.cpu_first = start, _thread_time()
        if self.position == 0:
            acc.attempt_start[self.pipeline] = start
        acc.regions += 1
        stack.append(0.0)
        try:
            result = self.transform(*args, **kwargs)
        finally:
            elapsed = _perf_counter() - start
            child = stack.pop()
            stages = acc.stages
            stages[self.key] = stages.get(self.key, 0.0) + elapsed - child
            if stack:
                stack[-1] += elapsed
        if result is None and self.position is not None:
            acc.drops[self.key] = acc.drops.get(self.key, 0) + 1
            acc.refetch_time += _perf_counter() - acc.attempt_start.get(
                self.pipeline, start)
        return result

    def __getattr__(self, name: str):
        # Dunders are looked up on the proxy itself (copy/pickle protocols
        # must not reach the wrapped object); `transform` is missing only
        # while unpickling.
        if name.startswith('__') or name == 'transform':
            raise AttributeError(name)
        return getattr(self.transform, name)

    def __iter__(self):
        # mmcv's cache_random_params (TransformBroadcaster and mmdet's
        # ProposalBroadcaster with share_random_params) finds the transforms
        # whose draws it shares by iterating what is not a BaseTransform:
        # through the proxy it reaches the wrapped one, so every target
        # still gets the same draw while a batch is timed.
        yield self.transform

    def __reduce__(self):
        return TimedTransform, (self.transform, self.key, self.pipeline,
                                self.position)

    def __repr__(self) -> str:
        return repr(self.transform)


class MonitoredBatch:
    """A collated batch travelling with its timing record.

    Only the monitor's DataLoader iterator ever sees it: it hands on
    ``batch`` and keeps ``record``. ``pin_memory`` is torch's protocol for
    custom batch types, so ``pin_memory=True`` pins the inner batch.
    ``trainer_stages`` holds what receiving (unpickling, the shared-memory
    segments' file-descriptor round trips included) and pinning the batch
    cost the training process, in seconds (None: nothing yet).
    """

    __slots__ = ('batch', 'record', 'trainer_stages')

    def __init__(self,
                 batch: Any,
                 record: Optional[dict],
                 trainer_stages: Optional[dict] = None) -> None:
        self.batch = batch
        self.record = record
        self.trainer_stages = trainer_stages

    def pin_memory(self, *args, **kwargs) -> 'MonitoredBatch':
        start = _perf_counter()
        batch = torch_pin_memory(self.batch, *args, **kwargs)
        return MonitoredBatch(
            batch, self.record,
            dict(self.trainer_stages or (), pin=_perf_counter() - start))

    def __reduce__(self):
        return _received, (ReceiptStamp(), self.batch, self.record)


def _received(started: float, batch: Any,
              record: Optional[dict]) -> MonitoredBatch:
    return MonitoredBatch(batch, record,
                          dict(receive=_perf_counter() - started))


class TimedCollate:
    """Wraps a DataLoader ``collate_fn``: times it, attaches the record.

    Args:
        collate_fn (callable): The DataLoader's collate function.
    """

    def __init__(self, collate_fn: Callable) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples):
        start = _perf_counter()
        batch = self.collate_fn(samples)
        end = _perf_counter()
        return MonitoredBatch(batch, ACCUMULATOR.take_record(start, end))


class TimedFetch:
    """A dataset's batch fetch as the monitor runs it: counted, its clocks
    started, timed as stage ``fetch`` when the batch is sampled.

    It is set as the dataset *instance*'s ``__getitems__``, which torch's
    fetcher looks up on the instance and calls once per batch, so an
    untimed batch costs nothing per sample. The dataset keeps its class and
    the way its attributes are stored: CPython (3.11+) keeps an instance's
    attributes inline, and its specialised ``self.attr`` reads need them
    there; switching the instance's class, or reading its ``__dict__``,
    moves them into a dict for good, and every attribute read of the
    dataset's own code (``BaseDataset.__getitem__``, ``prepare_data``, ...)
    then takes the interpreter's generic path, sample after sample
    (measured: docs/data_monitor.md, Overhead). Picklable: it travels with
    the dataset to spawn workers.

    Args:
        dataset: The dataset it fetches from.
        base (type): The dataset's own class: its ``__getitems__`` when it
            has one, else its ``__getitem__`` per index.
        plan (TimingPlan): The dataset's timing plan, registered with the
            accumulator of the process at its first fetch there.
        probes (bool): Install the IO/decode probes in the process before a
            timed fetch.
    """

    def __init__(self, dataset, base: type, plan: TimingPlan,
                 probes: bool) -> None:
        self.dataset = dataset
        self.base = base
        self.plan = plan
        self.probes = probes
        self._find_getitems()

    def _find_getitems(self) -> None:
        # Looked up once, not per batch: on a class without it the look-up
        # raises, and formats, an AttributeError (~2k instructions).
        self.getitems = getattr(self.base, '__getitems__', None)

    def __getstate__(self) -> dict:
        # Looked up again where it is unpickled: whatever the class holds
        # need not pickle.
        return {k: v for k, v in vars(self).items() if k != 'getitems'}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        self._find_getitems()

    def __call__(self, indices):
        return _fetch(self, len(indices), self._fetch_batch, indices)

    def one(self, index):
        """One sample: a loader without automatic batching indexes the
        dataset itself (see :func:`timed_dataset_class`)."""
        return _fetch(self, 1, self._fetch_one, index)

    def _fetch_batch(self, indices):
        dataset, base, getitems = self.dataset, self.base, self.getitems
        if getitems is not None:
            return getitems(dataset, indices)
        getitem = base.__getitem__
        return [getitem(dataset, index) for index in indices]

    def _fetch_one(self, index):
        return self.base.__getitem__(self.dataset, index)


def _fetch(fetcher: TimedFetch, samples: int, fetch: Callable, arg):
    """Count the samples, start the batch's clocks, time it if sampled.

    The dataset's plan is registered at its first fetch in this process,
    whether or not the batch in progress is timed: the countdown may have
    been left by another monitor, and only registering restarts it.
    """
    acc = ACCUMULATOR
    plan = fetcher.plan
    if plan not in acc.plans:
        acc.register(plan)
    if acc.t_first is None:
        acc.start_batch()
    acc.samples += samples
    if not acc.timing:
        return fetch(arg)
    if fetcher.probes:
        probes.ensure_installed(timed_call, inside_timed_region)
    return timed_call(FETCH, fetch, arg)


_TIMED_DATASET_CLASSES: Dict[type, type] = {}


def timed_dataset_class(base: type) -> type:
    """A subclass of ``base`` whose ``dataset[i]`` is a :class:`TimedFetch`
    of one sample, for loaders without automatic batching only.

    Such a loader indexes the dataset itself, and Python looks
    ``__getitem__`` up on the class, so the monitor switches the instance
    to this subclass (and back). That costs the dataset's attribute reads
    their fast path (see :class:`TimedFetch`), but there every sample is a
    batch anyway. It keeps the base's name, and pickles as "rebuild the
    base, switch the class", so spawn workers get it too.

    Args:
        base (type): The dataset's class.
    """
    cls = _TIMED_DATASET_CLASSES.get(base)
    if cls is None:
        cls = type(
            base.__name__, (base, ),
            dict(
                __getitem__=_timed_getitem,
                __reduce_ex__=_reduce_timed_dataset,
                __module__=base.__module__,
                __qualname__=base.__qualname__,
                _dm_base=base))
        _TIMED_DATASET_CLASSES[base] = cls
    return cls


def _timed_getitem(self, index):
    return self.__getitems__.one(index)


def _reduce_timed_dataset(self, protocol):
    base = type(self)._dm_base
    rebuild, args, *rest = base.__reduce_ex__(self, protocol)
    args = tuple(base if arg is type(self) else arg for arg in args)
    return (_rebuild_timed_dataset, (rebuild, args), *rest)


def _rebuild_timed_dataset(rebuild: Callable, args: tuple):
    obj = rebuild(*args)
    object.__setattr__(obj, '__class__', timed_dataset_class(type(obj)))
    return obj
