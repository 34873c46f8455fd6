"""Measure where a DataLoader's time goes, with or without a Runner.

:class:`DataLoaderMonitor` is the one implementation of the measurement:
``DataMonitorHook`` drives it from a training loop, and benchmark tools use
it on a plain DataLoader::

    monitor = DataLoaderMonitor(dataloader).install()
    for _, batch in zip(range(200), dataloader):
        ...                               # the consumer's work, if any
    report = monitor.report()             # dict, see docs/data_monitor.md
    print(format_report(report))
    monitor.uninstall()

In the main process it times every ``next()`` on the loader's iterators
(``DataLoader.__iter__`` returns a timing proxy) and receives each batch's
worker record (see :mod:`.worker_timing`).
"""
import multiprocessing
import os
import socket
import time
from collections import deque
from functools import partial
from typing import Callable, List, Optional, Tuple

import numpy as np
from mmengine.logging import print_log
from torch.utils.data import DataLoader

from ..datasets.sample_seeded_dataset import SampleSeededDataset
from ..utils.dataloader_slots import (dataloader_class_with_iter,
                                      rebind_dataloader_attribute)
from ..utils.started_iterators import (restart_started_iterator,
                                       shutdown_persistent_iterator)
from .instrument import LoaderInstrumentation
from .statistics import SampleBuffer, StatsBook, StepColumns
from .step_log import (COMPUTE, INDEX, START, WAIT, StepLog, is_timed,
                       transfer_times, worker_times)
from .verdict import build_report
from .worker_timing import MonitoredBatch

_perf_counter = time.perf_counter
#: Counted steps kept as rows (:class:`StepLog`) before they are added to
#: the books on the counting thread. Adding them one at a time, between two
#: batches' pipeline work that has pushed the books out of the CPU caches,
#: costs several times what a run of them costs. Longer runs make the
#: call that books one longer.
BOOK_EVERY = 64
#: Steps per run booked on another thread (:meth:`book_on`), which lets
#: the GIL go between runs. The training thread runs between two runs and
#: cools the caches again: a run costs a few dozen numpy calls whatever
#: its length, cold. Booked between 5 ms of JPEG decoding, as a training
#: thread's, 3.5 us a step in runs of 256, 2.0 in runs of 1024, 1.5 in
#: runs of 4096; a run of 1024 holds the GIL for ~2 ms (under the 5 ms
#: after which a waiting thread takes it anyway).
BOOK_RUN = 1024
#: Booked on another thread (:meth:`DataLoaderMonitor.book_on`), steps are
#: handed over after about this many seconds of them by default, at most
#: ``HAND_OVER_MOST``: each time that thread wakes it books with cold CPU
#: caches, and on a virtual machine with cold page walks too (1-2 ms per
#: wake measured, ~28 us a step when woken every 64 steps), so it wakes
#: seldom. The timeline's points are made when their steps are booked, so
#: they reach the visualizer up to this late (DataMonitorHook: up to its
#: refresh spacing, ``table_min_seconds``, and the steps it takes to send
#: them, a few a step).
HAND_OVER_SECONDS = 10.0
#: (~330 bytes a step: 16,384 are ~5 MB, 30 s of steps at 550 a second;
#: faster steps are handed over between refreshes too, a wake for 16,384
#: of them)
HAND_OVER_MOST = 16384


class _TimedIterator:
    """Proxy of a DataLoader iterator: times ``next()``, unwraps batches."""

    def __init__(self, iterator, monitor: 'DataLoaderMonitor') -> None:
        self._source = iterator
        self._monitor = monitor

    def __iter__(self) -> '_TimedIterator':
        return self

    def __next__(self):
        requested = _perf_counter()
        item = next(self._source)
        received = _perf_counter()
        if type(item) is MonitoredBatch:
            if item.trainer_stages:
                self._monitor.add_trainer_stages(item.trainer_stages)
            self._monitor._on_batch(requested, received, item.record)
            return item.batch
        self._monitor._on_batch(requested, received, None)
        return item

    def __len__(self) -> int:
        return len(self._source)

    def __getattr__(self, name: str):
        if name.startswith('__') or name == '_source':
            raise AttributeError(name)
        return getattr(self._source, name)


def _timed_iterator(loader: DataLoader, base: type) -> '_TimedIterator':
    monitor = loader._data_monitor
    monitor._on_iter_start()
    return _TimedIterator(base.__iter__(loader), monitor)


def _monitored_loader_class(base: type) -> type:
    """``base`` with an ``__iter__`` that returns a timing proxy."""
    return dataloader_class_with_iter(base, 'Monitored', _timed_iterator)


def _users_dataset(dataset):
    """What the config trains on: the fast-resume loops wrap it in a
    :class:`SampleSeededDataset` of their own."""
    if isinstance(dataset, SampleSeededDataset):
        return dataset.dataset
    return dataset


def loader_context(loader: DataLoader) -> dict:
    """The loader settings the verdict and the advice depend on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    context = loader.multiprocessing_context
    if context is not None and not isinstance(context, str):
        context = context.get_start_method()
    start_method = context or multiprocessing.get_start_method(
        allow_none=True) or multiprocessing.get_all_start_methods()[0]
    # RayDataNodesHook: Ray actors make the batches, not local workers.
    data_nodes = getattr(loader, '_ray_data_nodes', None)
    return dict(
        num_workers=loader.num_workers,
        batch_size=loader.batch_size,
        persistent_workers=loader.persistent_workers,
        pin_memory=loader.pin_memory,
        prefetch_factor=loader.prefetch_factor,
        start_method=start_method if loader.num_workers else None,
        dataset_type=type(_users_dataset(loader.dataset)).__name__,
        sampler_type=type(getattr(loader, 'sampler', None)).__name__,
        cpus=cpus,
        host=socket.gethostname(),
        collate=collate_name(loader.collate_fn),
        device_feed=hasattr(loader, '_device_feed'),
        data_nodes=None if data_nodes is None else data_nodes.context())


def collate_name(collate) -> str:
    """The user's collate function's name, through the monitor's timing
    wrapper and ``functools.partial`` (how mmengine builds it)."""
    while True:
        inner = getattr(collate, 'func', None) or getattr(
            collate, 'collate_fn', None)
        if inner is None:
            return getattr(collate, '__name__', type(collate).__name__)
        collate = inner


class DataLoaderMonitor:
    """Where a DataLoader's time goes: per stage, transform and worker.

    Steps right after a (re)start of iteration and after
    :meth:`mark_pause` (validation, checkpoint saving) are not counted: the
    first ``warmup_iters`` after the first start, ``settle_iters`` after
    later ones. The first batch after each start is kept apart as the
    start-up cost.

    Args:
        dataloader (DataLoader): The loader to measure.
        per_transform (bool): Time each pipeline transform (nested wrappers
            included). Defaults to True.
        split_io_decode (bool): Split mmcv's image loading into file read
            (``io``) and ``decode``. Defaults to True.
        warmup_iters (int): Steps not counted after the first start.
            Defaults to 5.
        settle_iters (int, optional): Steps not counted after a restart or
            a pause. Defaults to the batches in flight,
            ``prefetch_factor * num_workers`` (1 without workers).
        timeline_every (int): Counted steps per timeline point. Defaults to
            50.
        max_timeline_points (int): Neighbouring points are merged beyond
            this. Defaults to 500.
        manual_steps (bool): If True, a step is committed by :meth:`step`
            (a training loop calls it once per iteration, so batches that
            are fetched and skipped, e.g. on resume, are not counted);
            otherwise every batch is a step. Defaults to False.
        count_restarts (bool): Count the first batch after a later start of
            iteration (a new epoch) like any other: a loader benchmark then
            includes what each epoch's start costs (refilling the queues,
            new workers when they are not persistent). Use with
            ``settle_iters=0``. Defaults to False.
        sample_every (int, optional): Time the stages of one batch in this
            many (per worker); the others record only their exact totals
            (worker time, samples, CPU). None chooses it from the measured
            cost so that timing stays under 0.2% of the worker time; 1
            times every batch. Defaults to None.
    """

    # Slots, not a __dict__: with more than 30 attributes an instance's
    # dict is not a shared-key one, and CPython 3.11 reads and writes them
    # as dict lookups (LOAD_ATTR_WITH_HINT) instead of at fixed places;
    # a step reads or writes some 25 (1.1k of ~36k instructions a step
    # fewer, counted with callgrind). The step's own come first, side by
    # side.
    __slots__ = ('_index', '_trainer_pending', '_pending', '_pending_count',
                 '_last_received', '_starting', '_skip', '_last_step',
                 'skipped', '_unbooked', '_interval', '_counted',
                 '_unbooked_steps', '_book_every', 'steps_without_batch',
                 'manual_steps', 'new_points', '_submit', '_hand_over_seconds',
                 '_handed_at', '_most_unbooked', '_base_class', '_point_steps',
                 '_point_stages', '_timeline', '_timeline_every', '_total',
                 '_window', 'booked_totals', 'count_restarts', 'dataloader',
                 'instrumentation', 'max_timeline_points', 'settle_iters',
                 'starts', 'startup', 'warmup_iters')

    def __init__(self,
                 dataloader: DataLoader,
                 per_transform: bool = True,
                 split_io_decode: bool = True,
                 warmup_iters: int = 5,
                 settle_iters: Optional[int] = None,
                 timeline_every: int = 50,
                 max_timeline_points: int = 500,
                 manual_steps: bool = False,
                 count_restarts: bool = False,
                 sample_every: Optional[int] = None) -> None:
        if not isinstance(dataloader, DataLoader):
            raise TypeError('DataLoaderMonitor needs a torch DataLoader, got '
                            f'{type(dataloader).__name__}')
        if timeline_every < 1:
            raise ValueError(
                f'timeline_every must be >= 1, got {timeline_every}')
        if sample_every is not None and sample_every < 1:
            raise ValueError(
                f'sample_every must be None or >= 1, got {sample_every}')
        self.dataloader = dataloader
        self.warmup_iters = warmup_iters
        if settle_iters is None:
            settle_iters = max(1, (dataloader.prefetch_factor or 0) *
                               dataloader.num_workers)
        self.settle_iters = settle_iters
        self._timeline_every = timeline_every
        self.max_timeline_points = max_timeline_points
        self.manual_steps = manual_steps
        self.count_restarts = count_restarts
        self.instrumentation = LoaderInstrumentation(dataloader, per_transform,
                                                     split_io_decode,
                                                     sample_every)
        self._base_class: Optional[type] = None
        self.reset()

    # ------------------------------------------------------------ install
    def install(self, loop=None) -> 'DataLoaderMonitor':
        """Instrument the loader; restart iterators that already run.

        Workers started before this call run the uninstrumented pipeline
        (fork copies it at start, spawn pickles it), so the persistent
        iterator of the loader and the one a training loop keeps in
        ``loop.dataloader_iterator`` (stock ``IterBasedTrainLoop`` starts it
        in ``__init__``) are shut down and recreated. The global torch RNG
        is restored afterwards, and samplers seeded by their own seed
        (mmengine's) replay the same order, so the batches do not change.

        Args:
            loop (optional): Object with a ``dataloader_iterator`` to check.

        Returns:
            DataLoaderMonitor: ``self``.
        """
        if self._base_class is not None:
            return self
        loader = self.dataloader
        if getattr(loader, '_data_monitor', None) is not None:
            raise RuntimeError('this DataLoader is already measured by '
                               'another DataLoaderMonitor')
        self.instrumentation.install()
        self._base_class = type(loader)
        loader._data_monitor = self
        rebind_dataloader_attribute(loader, '__class__',
                                    _monitored_loader_class(self._base_class))
        self._restart_started(loop)
        return self

    def uninstall(self) -> None:
        """Undo :meth:`install` (persistent workers are shut down)."""
        if self._base_class is None:
            return
        loader = self.dataloader
        shutdown_persistent_iterator(loader)
        rebind_dataloader_attribute(loader, '__class__', self._base_class)
        del loader._data_monitor
        self._base_class = None
        self.instrumentation.uninstall()

    @property
    def installed(self) -> bool:
        return self._base_class is not None

    @property
    def timeline_every(self) -> int:
        """Counted steps per timeline point, fixed at construction: the
        steps held for the next point are always fewer than one point's."""
        return self._timeline_every

    @property
    def hand_over_seconds(self) -> float:
        """About how many seconds of counted steps are handed over at a
        time to the thread of :meth:`book_on`."""
        return self._hand_over_seconds

    @property
    def counted_steps(self) -> int:
        """Steps measured so far (warm-up and settling not included)."""
        return self._counted

    @property
    def total(self) -> StatsBook:
        """The figures of every counted step so far (the booking thread's
        while :meth:`book_on` has one)."""
        self._book_here()
        return self._total

    @property
    def window(self) -> StatsBook:
        """The figures of the counted steps since :meth:`take_window`."""
        self._book_here()
        return self._window

    def __enter__(self) -> 'DataLoaderMonitor':
        return self.install()

    def __exit__(self, *exc_info) -> None:
        self.uninstall()

    def _restart_started(self, loop) -> None:
        if restart_started_iterator(self.dataloader, loop):
            print_log(
                'DataMonitor restarted the DataLoader iterator the training '
                'loop had started, so that its workers run the timed '
                'pipeline (same sampler order and seeds).',
                logger='current')

    # ------------------------------------------------------------ steps
    def reset(self) -> None:
        """Forget everything measured so far."""
        self._total = StatsBook()
        self._window = StatsBook(capacity=1024)
        self._unbooked = StepLog()
        # Its steps, counted here: its len() is a Python call per step.
        self._unbooked_steps = 0
        # Where runs of counted steps are booked (see book_on).
        self._submit: Optional[Callable[..., None]] = None
        self._book_every = BOOK_EVERY
        self._most_unbooked = HAND_OVER_MOST
        self._hand_over_seconds = HAND_OVER_SECONDS
        self._handed_at = 0.0
        #: :meth:`StatsBook.sums` of the steps booked so far: one tuple
        #: that any thread may read while another books.
        self.booked_totals: tuple = self._total.sums()
        self._counted = 0
        self.startup = StatsBook(capacity=256)
        self._timeline: List[dict] = []
        #: Points not taken yet by the consumer (``popleft``): those of
        #: the timeline, made on whichever thread books (the oldest go
        #: beyond ``max_timeline_points`` untaken).
        self.new_points: deque = deque(maxlen=self.max_timeline_points)
        self.skipped = 0
        self.starts = 0
        self._last_step: Optional[tuple] = None
        self.steps_without_batch = 0
        self._pending: Optional[tuple] = None
        self._pending_count = 0
        self._trainer_pending: dict = {}
        self._skip = 0
        self._starting = False
        self._last_received: Optional[float] = None
        self._index = -1
        # Booked steps of the timeline point not complete yet.
        self._point_steps = StepLog()
        # Sums over the steps counted since take_interval (steps, wait,
        # compute, batches, worker time), kept once it is first called.
        self._interval: Optional[list] = None
        # Every stage seen in a timeline point so far (an ordered set): a
        # point gives 0.0 for those its timed batches did not run.
        self._point_stages: dict = {}

    def mark_pause(self, settle: bool = True) -> None:
        """The consumer does something else for a while.

        The step that spans the pause is not counted, nor (with ``settle``,
        for long pauses such as validation or checkpoint saving, during
        which the workers fill their queues) the ``settle_iters`` after it.
        """
        self._skip = max(self._skip, 1 + (self.settle_iters if settle else 0))

    def add_trainer_stages(self, stages: dict) -> None:
        """Add the training process's own data work (seconds by stage:
        ``receive``, ``pin``, ``to_device``, ``unpack``, ``preprocess``) to
        the step committed next."""
        pending = self._trainer_pending
        for key, seconds in stages.items():
            pending[key] = pending.get(key, 0.0) + seconds

    def _on_iter_start(self) -> None:
        self.starts += 1
        self._starting = True
        self._skip = max(
            self._skip,
            self.warmup_iters if self.starts == 1 else self.settle_iters)

    def _on_batch(self, requested: float, received: float,
                  record: Optional[dict]) -> None:
        self._pending = (requested, received, record)
        self._pending_count += 1
        if not self.manual_steps:
            self.step()

    def step(self, index: Optional[int] = None) -> None:
        """Commit the batch the consumer took since the last step.

        The timeline's points are made as the counted steps are booked
        (every :data:`BOOK_EVERY` steps, or on the thread of
        :meth:`book_on`) and queued in :attr:`new_points` too.

        Args:
            index (int, optional): The step's number (e.g. ``runner.iter``);
                counts on from the last one by default.
        """
        self._index = self._index + 1 if index is None else index
        trainer = self._trainer_pending
        if trainer:
            self._trainer_pending = {}
        pending = self._pending
        if pending is None:
            self.steps_without_batch += 1
            self._last_step = None
            return
        count = self._pending_count
        self._pending, self._pending_count = None, 0
        requested, received, record = pending
        previous, self._last_received = self._last_received, received
        wait = received - requested
        compute = requested - previous if previous is not None else None
        if count == 1 and not self._starting and not self._skip:
            counted = True
        else:
            counted = self._counts_off_the_steady_path(count, pending)
        self._last_step = (wait, compute, record, counted)
        if not counted:
            self.skipped += 1
            return
        self._unbooked.append(wait, compute, record, requested, received,
                              trainer, self._index)
        interval = self._interval
        if interval is not None:
            interval[0] += 1
            interval[1] += wait
            if compute is not None:
                interval[2] += compute
            if record:
                interval[3] += 1
                interval[4] += record['end'] - record['start']
        self._counted += 1
        self._unbooked_steps += 1
        if self._unbooked_steps >= self._book_every:
            self._book_unbooked()

    def _counts_off_the_steady_path(self, count: int, pending: tuple) -> bool:
        """Whether a step right after a start or a pause, or after batches
        taken without a step, is counted (it is not: its figures are not
        those of the steady state); keeps the first batch after a start
        as the start-up cost."""
        if self._starting and self.count_restarts and self.starts > 1:
            self._starting = False  # a new epoch's first batch: counted
        if self._starting or count > 1:
            if self._starting and count == 1:
                requested, received, record = pending
                self.startup.add(received - requested, None, record,
                                 requested, received)
            self._starting = False
            if count > 1:  # batches taken without a step (resume skip)
                self._skip = max(self._skip, self.settle_iters)
            return False
        if self._skip > 0:
            self._skip -= 1
            return False
        return True

    @property
    def last_step(self) -> Optional[dict]:
        """The step committed last: ``wait``, ``compute`` and ``worker``
        time (seconds; None where not known) and whether it was
        ``counted``; None when no batch came since the step before."""
        if self._last_step is None:
            return None
        wait, compute, record, counted = self._last_step
        return {
            'wait': wait,
            'compute': compute,
            'worker': record['end'] - record['start'] if record else None,
            'counted': counted
        }

    def take_interval(self) -> dict:
        """Sums over the steps counted since the last call (the first call
        starts the count): ``steps``, ``wait`` and ``compute`` (seconds),
        and over the ``batches`` with a worker record their ``worker``
        time.

        For a consumer that reports per interval of steps (a log line),
        instead of reading every step: a counted step adds to five sums,
        and none is kept for the line.
        """
        sums = self._interval or [0, 0.0, 0.0, 0, 0.0]
        self._interval = [0, 0.0, 0.0, 0, 0.0]
        return dict(zip(('steps', 'wait', 'compute', 'batches', 'worker'),
                        sums))

    def book_on(self,
                submit: Optional[Callable[..., None]],
                seconds: float = HAND_OVER_SECONDS) -> None:
        """Book the counted steps through ``submit(function, *args)``,
        which runs what it is handed in order on one other thread
        (DataMonitorHook's report writer), from now on: the training
        thread then only appends a row per step and hands them over in
        runs, and the books, the timeline and the summaries belong to that
        thread (summarised there by the function of
        :meth:`deferred_summaries`, which books what was counted before it
        first, and needs no copy). None: book on the calling thread
        again, once that thread has run all it was handed. ``seconds``:
        about how many seconds of steps are handed over at a time (at most
        ``HAND_OVER_MOST`` steps), counted from the last time they were
        taken, by a hand-over or by :meth:`deferred_summaries`.
        """
        if submit is not None and self._unbooked_steps:
            self._book_unbooked()  # the runs stay in order
        self._submit = submit
        self._hand_over_seconds = seconds
        self._book_every = min(BOOK_EVERY if submit is None else 1,
                               self._most_unbooked)
        self._handed_at = _perf_counter()

    def book_within(self, steps: int) -> None:
        """Book the counted steps at least every ``steps`` of them (hand
        them over that often with :meth:`book_on`): for a reader of
        :attr:`booked_totals` that needs them that fresh
        (RayDataNodesHook's pool sizing), at the cost of waking the
        booking thread that often."""
        self._most_unbooked = max(1, steps)
        self._book_every = min(self._book_every, self._most_unbooked)

    def _book_unbooked(self) -> None:
        """Book the steps counted since the last call, here or on the
        thread of :meth:`book_on`."""
        steps = self._take_unbooked()
        if not len(steps):
            return
        if self._submit is None:
            self._book(steps)
            return
        self._submit(self._book_in_runs, steps)

    def _take_unbooked(self) -> StepLog:
        """The steps counted since the last hand-over; starts the next,
        due after about ``seconds`` (:meth:`book_on`) of steps at the rate
        of these."""
        steps, self._unbooked = self._unbooked, StepLog()
        if not self._unbooked_steps:
            # (a refresh right after a hand-over, or in settling steps:
            # no rate to learn)
            return steps
        now = _perf_counter()
        if self._submit is not None:
            rate = self._unbooked_steps / max(now - self._handed_at, 1e-9)
            self._book_every = max(
                1,
                min(self._most_unbooked, HAND_OVER_MOST,
                    int(rate * self._hand_over_seconds)))
        self._handed_at = now
        self._unbooked_steps = 0
        return steps

    def _book_in_runs(self, steps: StepLog) -> None:
        """:meth:`_book` in runs of ``BOOK_RUN``, letting the GIL go
        between them: the training thread, which wants it back, waits for
        one run (about two milliseconds), not for the whole hand-over."""
        for first in range(0, len(steps), BOOK_RUN):
            if first:
                time.sleep(0)
            self._book(steps.part(first, first + BOOK_RUN))

    def _book(self, steps: StepLog) -> None:
        """Add a run of counted steps to the books and make the timeline
        points it completes."""
        if not len(steps):
            return
        # Converted once, for the books and the timeline alike.
        rows = steps.rows()
        columns = StepColumns(steps, rows)
        for book in (self._total, self._window):
            book.add_columns(columns)
        self.booked_totals = self._total.sums()
        self._add_point_steps(steps, rows)

    def _add_point_steps(self, steps: StepLog, rows: np.ndarray) -> None:
        """Make the timeline points that a run of counted steps (``rows``:
        its rows) completes; hold the steps of the next one.

        Only the held steps (fewer than a point's) are converted again,
        not the run, nor are its numbers copied into the held log.
        """
        held, every = self._point_steps, self.timeline_every
        first = len(held)
        whole = (first + len(steps)) // every * every
        if not whole:
            held.extend(steps)
            return
        if first:
            rows = np.concatenate((held.rows(), rows))
        records = held.records + [(first + row, record)
                                  for row, record in steps.records
                                  if first + row < whole]
        self._point_steps = steps.part(whole - first, len(steps))
        self._close_points(rows[:whole], records)

    def _book_here(self) -> None:
        """Book what is counted, unless the books live on another
        thread (:meth:`book_on`)."""
        if self._submit is None:
            self._book_unbooked()

    # ------------------------------------------------------------ results
    @property
    def timeline(self) -> List[dict]:
        """The points of the counted steps so far: per ``timeline_every``
        of them, their means (ms) and the ``step`` that closed each."""
        self._book_here()
        return self._timeline

    def _close_points(self, rows: np.ndarray, records: list) -> None:
        """The timeline points of steps' ``rows`` (``timeline_every`` of
        them per point, whole points only), with their kept ``records``
        (``(row, record)``, as :attr:`StepLog.records`).

        Made from those steps themselves, not from the books, which hold
        only sums over all steps.
        """
        every = self.timeline_every
        points = len(rows) // every
        by_point = rows.reshape(points, every, -1)
        compute = by_point[:, :, COMPUTE]
        # (np.nansum's own way, without its copies and checks)
        known = ~np.isnan(compute)
        computes = np.maximum(known.sum(axis=1), 1)
        with_record = ~np.isnan(by_point[:, :, START])
        batches = np.maximum(with_record.sum(axis=1), 1)
        figures = zip(
            (1e3 * by_point[:, :, WAIT].sum(axis=1) / every).tolist(),
            (1e3 * np.where(known, compute, 0.0).sum(axis=1) /
             computes).tolist(),
            (1e3 * np.where(with_record, worker_times(by_point), 0.0).sum(
                axis=1) / batches).tolist(),
            (1e3 * np.where(with_record, transfer_times(by_point), 0.0).sum(
                axis=1) / batches).tolist(),
            rows[every - 1::every, INDEX].tolist())
        timed = [[] for _ in range(points)]
        for row, record in records:
            if is_timed(record):
                timed[row // every].append(record['stages'])
        self._add_points([{
            'step': int(index),
            'steps': every,
            'wait': wait,
            'compute': compute_ms,
            'worker': worker,
            'transfer': transfer_ms,
            'timed': len(stages),
            # (a point without a timed batch has no stage figures, not 0.0)
            'stages': self._point_stage_means(stages) if stages else {}
        } for (wait, compute_ms, worker, transfer_ms, index), stages in zip(
            figures, timed)])

    def _point_stage_means(self, timed: List[dict]) -> dict:
        """A point's stage means (ms) over its timed batches' stages (at
        least one): 0.0 for a stage seen in an earlier point that these
        did not run."""
        stages = self._point_stages
        totals = dict.fromkeys(stages, 0.0)
        for record_stages in timed:
            for key, seconds in record_stages.items():
                if key not in totals:
                    stages[key] = None
                    totals[key] = 0.0
                totals[key] += seconds
        return {key: 1e3 * total / len(timed) for key, total in totals.items()}

    def _add_points(self, points: List[dict]) -> None:
        """Add points to the timeline one by one (it is halved whenever
        it grows beyond ``max_timeline_points``) and queue them."""
        timeline = self._timeline
        for point in points:
            timeline.append(point)
            if len(timeline) > self.max_timeline_points:
                timeline = self._timeline = _merge_pairs(timeline)
        self.new_points.extend(points)

    def summary(self, book: Optional[StatsBook] = None) -> dict:
        """This process's figures as plain data (one ``ranks`` entry).

        Args:
            book (StatsBook, optional): Which span; the whole run by
                default, ``self.window`` for the span since
                :meth:`take_window`.
        """
        return self.deferred_summary(book)()

    def _refuse_if_booked_elsewhere(self, what: str) -> None:
        if self._submit is not None:
            raise RuntimeError(
                f'DataLoaderMonitor.{what}: the books are kept on another '
                'thread (book_on); use deferred_summaries and run its '
                'function there')

    def deferred_summary(self,
                         book: Optional[StatsBook] = None,
                         copy: bool = True) -> Callable[[], dict]:
        """:meth:`summary`, made when the returned function is called.

        What it needs is copied now, in well under a millisecond, and
        summarised later on any thread while this monitor goes on counting
        (DataMonitorHook's report writer). With the books on another
        thread (:meth:`book_on`), see :meth:`deferred_summaries`.

        Args:
            book (StatsBook, optional): As for :meth:`summary`.
            copy (bool): Copy the book; False for one that is counted no
                more. Defaults to True.
        """
        self._refuse_if_booked_elsewhere('deferred_summary')
        book = self.total if book is None else book
        figures = book.copy() if copy else book
        timeline = list(self._timeline) if book is self._total else []
        return self._summariser(lambda: (figures, timeline))

    def _summariser(self, books: Callable[[], Tuple[StatsBook, list]]
                    ) -> Callable[[], dict]:
        """The summary of the book and timeline ``books()`` gives when
        called; the counts of this thread are copied now."""
        skipped, startup = self.skipped, self.startup.wait.copy()
        return lambda: self._summary(*books(), skipped, startup)

    def _summary(self, figures: StatsBook, timeline: list, skipped: int,
                 startup: SampleBuffer) -> dict:
        """A summary of ``figures``, with the counts and start-up waits
        copied on the counting thread."""
        summary = figures.summary()
        summary.update(
            skipped=skipped,
            startup=dict(count=startup.seen, wait=startup.describe()),
            timeline=timeline,
            # The loader's settings do not change while it is measured.
            context=loader_context(self.dataloader),
            pipelines=self.instrumentation.pipelines)
        return summary

    def take_window(self, deferred: bool = False):
        """The summary of the span since the last call; starts a new one.

        Args:
            deferred (bool): Return it as :meth:`deferred_summary` does.
                Defaults to False.
        """
        self._refuse_if_booked_elsewhere('take_window')
        self._book_here()
        window = self._start_window()
        summarise = self._summariser(lambda: (window, []))
        return summarise if deferred else summarise()

    def deferred_summaries(
            self, window: bool
    ) -> Callable[[], Tuple[dict, Optional[dict]]]:
        """The summaries of the whole run and (``window``) of the span
        since the last window, made when the returned function is called;
        the window is taken now.

        With the books on another thread (:meth:`book_on`), the function
        must run there, as the next thing handed over (in the job
        DataMonitorHook hands over next, its refresh): it books the steps
        counted up to this call, which it carries, and summarises the
        books uncopied. Nothing is handed over by this call, so the
        booking thread does not wake (and want the GIL) while the caller
        goes on; and the caller runs little code (a refresh comes seconds
        after the last, with cold caches): the steps are taken and the
        counts copied, nothing else.
        """
        if self._submit is None:
            total = self.deferred_summary()
            taken = self.take_window(deferred=True) if window else None
            return lambda: (total(), taken() if taken else None)
        return partial(self._book_and_summarise, self._take_unbooked(),
                       window, self.skipped, self.startup.wait.copy())

    def _book_and_summarise(self, steps: StepLog, window: bool, skipped: int,
                            startup: SampleBuffer
                            ) -> Tuple[dict, Optional[dict]]:
        """What :meth:`deferred_summaries` returns, on the books' thread:
        book ``steps``, then summarise the whole run and (``window``) the
        span since the last window, which starts a new one."""
        self._book_in_runs(steps)
        whole = self._summary(self._total, list(self._timeline), skipped,
                              startup)
        if not window:
            return whole, None
        return whole, self._summary(self._start_window(), [], skipped,
                                    startup)

    def _start_window(self) -> StatsBook:
        """The window's book so far; a new window starts."""
        taken, self._window = self._window, StatsBook(capacity=1024)
        return taken

    def report(self,
               rank_summaries: Optional[List[dict]] = None,
               **context) -> dict:
        """The full report: per-rank figures, verdict and advice.

        Args:
            rank_summaries (list[dict], optional): :meth:`summary` of every
                rank (gathered by the caller); this process's by default.
            **context: Extra context entries (e.g. ``world_size``).
        """
        if rank_summaries is None:
            rank_summaries = [dict(self.summary(), rank=0)]
        return build_report(rank_summaries, **context)


def _merge_pairs(points: List[dict]) -> List[dict]:
    """Halve a timeline by merging neighbours (weighted by steps).

    It runs every few hundred points on the training thread, over the
    whole timeline: written out per figure, without a comprehension or a
    generator per pair (each costs a call).
    """
    merged = []
    for first, second in zip(points[0::2], points[1::2]):
        steps1, steps2 = first['steps'], second['steps']
        steps = steps1 + steps2
        w1, w2 = steps1 / steps, steps2 / steps
        # Stage means weigh by timed batches (points of older reports have
        # no count: every batch was timed).
        t1, t2 = first.get('timed', steps1), second.get('timed', steps2)
        timed = t1 + t2
        stages1, stages2 = first['stages'], second['stages']
        stages = {}
        if timed:
            for key in stages1.keys() | stages2.keys():
                stages[key] = (stages1.get(key, 0.0) * t1 +
                               stages2.get(key, 0.0) * t2) / timed
        merged.append({
            'wait': first['wait'] * w1 + second['wait'] * w2,
            'compute': first['compute'] * w1 + second['compute'] * w2,
            'worker': first['worker'] * w1 + second['worker'] * w2,
            'transfer': first['transfer'] * w1 + second['transfer'] * w2,
            'step': second['step'],
            'steps': steps,
            'timed': timed,
            'stages': stages
        })
    if len(points) % 2:
        merged.append(points[-1])
    return merged


def measure_dataloader(dataloader: DataLoader,
                       num_batches: int,
                       step_fn: Optional[Callable] = None,
                       **monitor_args) -> dict:
    """Iterate ``num_batches`` batches under a monitor; return its report.

    Args:
        dataloader (DataLoader): The loader (restored afterwards).
        num_batches (int): Batches to take, warm-up included.
        step_fn (callable, optional): Called with each batch, to stand in
            for the model step; without it the consumer does nothing and
            the loader is measured flat out.
        **monitor_args: :class:`DataLoaderMonitor` arguments.
    """
    if num_batches < 1:
        raise ValueError(f'num_batches must be >= 1, got {num_batches}')
    with DataLoaderMonitor(dataloader, **monitor_args) as monitor:
        taken = 0
        while taken < num_batches:
            before = taken
            for batch in dataloader:
                if step_fn is not None:
                    step_fn(batch)
                taken += 1
                if taken == num_batches:
                    break
            if taken == before:
                raise ValueError('the DataLoader yields no batches')
        return monitor.report()


__all__ = ['DataLoaderMonitor', 'measure_dataloader', 'loader_context']
