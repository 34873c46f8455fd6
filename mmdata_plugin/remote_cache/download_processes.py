"""Download processes: several processes download what one plan decides.

One process's CPU (HTTP client, MD5 of the body, temp file, ledger) caps
the downloads per second of a node; the plan, though, is one (who is kept,
who is staged, what is in flight). So the node prefetcher keeps planning
and forks ``download_processes`` processes that download for it: it hands
each job (sample, URLs, size hint) over a pipe and books the answer
(sizes, or why not) when it comes back.

A download process reserves, writes and publishes like any process of the
node (key lock, reservation, temp file, rename, the ledger row batched),
but evicts nothing itself: when the budget has no free room for a file,
it asks the planner, which reserves in its name with its own eviction
policy (the plan). If it dies (``kill -9``, OOM), the store reclaims what
it left as a dead writer's (its reservations, its temp files; an entry it
renamed into place is adopted), and its jobs go to the process forked in
its place: nothing is lost, and a file it published is not downloaded
again.

Before downloading, a process checks (under the file's key lock, as the
one-process prefetcher asks the plan) that no reader has read the file
meanwhile (:meth:`~.read_once.ReadOnceMarks.reported`) and that the plan
has not let it go (a mark in ``planner/cancelled``); if either, it leaves
the decision to the planner. A reader's report goes once the planner has
taken it, so a job whose file was read while it waited and that the plan
no longer wants is cancelled before that (:meth:`ProcessDownloads.
recheck`): the process cannot see the plan's books.

The jobs of one coalesced request (:mod:`.coalesced_reads`) name its
covering span and go to one process, which runs them in turn on one
thread, reading the span once for them.
"""
import contextlib
import gc
import math
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection, Pipe
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from ..cache.node_store import CacheBudgetError, Reservation
from ..cache.process_owner import owner_of
from .coalesced_reads import SharedSpan, in_turn
from .node_cache_backend import NAMESPACE, DownloadNotWanted, RemoteReader
from .read_once import ReadOnceMarks

#: Seconds between two looks of a download process at its parent.
_PARENT_CHECK = 0.5
#: Seconds a download process gets to finish its downloads when stopped.
_STOP_SECONDS = 10.0
#: A URL another process was downloading and left no entry of, or that a
#: reader read (or the plan let go) before its download started.
_BUSY = None
#: A URL whose entry was freed before its size was taken.
_GONE = -1
#: Where the planner marks the files of downloads it no longer wants.
CANCELLED_DIR = os.path.join('planner', 'cancelled')


class DownloadResult(NamedTuple):
    """How the download of one sample's files ended.

    ``urls``: its files; ``fetched``: those on disk by this download (or
    found there); ``total``: their bytes; ``sized``: whether ``total`` is
    the sample's whole size; ``error``: ``(kind, message)`` of a failure;
    ``no_room``: the budget held no room for it in time.
    """
    sample: int
    urls: List[str]
    fetched: int
    total: int
    sized: bool
    seconds: float
    error: Optional[Tuple[str, str]] = None
    no_room: bool = False


class _Job:
    """A sample's download while the planner has it."""

    def __init__(self, job_id: int, sample: int, urls: List[str],
                 hint: int, cover: Optional[str]) -> None:
        self.id = job_id
        self.sample = sample
        self.urls = urls
        self.hint = hint
        self.cover = cover
        self.started = time.perf_counter()
        self.fetched = 0
        self.total = 0
        self.sized = True

    def result(self, error=None, no_room=False) -> DownloadResult:
        return DownloadResult(self.sample, self.urls, self.fetched,
                              self.total, self.sized,
                              time.perf_counter() - self.started, error,
                              no_room)


class _Worker:
    """The planner's end of one download process."""

    def __init__(self, pid: int, connection: Connection) -> None:
        self.pid = pid
        self.owner = owner_of(pid)
        self.connection = connection
        self.jobs: Dict[int, _Job] = {}


class ProcessDownloads:
    """The download processes of a node prefetcher, seen from it.

    Args:
        reader (RemoteReader): The planner's reader (its store's eviction
            policy is the plan); the processes inherit it.
        processes (int): Download processes.
        max_inflight (int): Most downloads at once, over all processes.
        room_wait (float): Seconds a download waits for room in a full
            budget (then it ends as ``no_room``: its reader downloads on
            demand), also for a file that outgrows its size hint.
        max_gap (int): Most bytes between two members of one request (see
            :class:`~.coalesced_reads.SharedSpan`).
    """

    def __init__(self, reader: RemoteReader, processes: int,
                 max_inflight: int, room_wait: float, max_gap: int) -> None:
        self.reader = reader
        self.max_gap = max_gap
        self.store = reader.store
        self.threads = max(1, math.ceil(max_inflight / processes))
        self.room_wait = room_wait
        self.cancelled_dir = os.path.join(self.store.cache_dir,
                                          CANCELLED_DIR)
        os.makedirs(self.cancelled_dir, exist_ok=True)
        for name in os.listdir(self.cancelled_dir):  # a dead planner's
            os.unlink(os.path.join(self.cancelled_dir, name))
        self.workers: List[Optional[_Worker]] = [None] * processes
        # A file's digest -> its URL and job, sent to a download process,
        # not answered yet; the digests of those the plan let go meanwhile.
        self._sent: Dict[str, Tuple[str, _Job]] = {}
        self._cancelled = set()
        self.lost = 0
        self._next_id = 0
        self._jobs: List[_Job] = []

    # -- processes --------------------------------------------------------

    def _fork(self, index: int) -> None:
        # (The store's ledger closes its connection around the fork.)
        ours, theirs = Pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (runs in the child)
            try:
                ours.close()
                for worker in self.workers:
                    if worker is not None:
                        worker.connection.close()
                _serve(theirs, self.reader, self.threads, self.room_wait,
                       self.max_gap, parent)
            finally:
                os._exit(1)  # never back into the planner's code
        theirs.close()
        self.workers[index] = _Worker(pid, ours)

    def _replace(self, index: int) -> None:
        """A download process died: its jobs go to the one forked in its
        place (the store reclaims its reservations and temp files)."""
        worker = self.workers[index]
        worker.connection.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(worker.pid, 0)
        self.lost += 1
        for job in worker.jobs.values():
            self._answered(job)
        self._jobs[:0] = worker.jobs.values()
        self._fork(index)

    def connections(self) -> List[Connection]:
        """What the planner waits on besides its own stop signal."""
        return [w.connection for w in self.workers if w is not None]

    # -- jobs -------------------------------------------------------------

    def submit(self, sample: int, urls: List[str], hint: int,
               cover: Optional[str] = None) -> None:
        """Download ``sample``'s files (``hint`` bytes in all), from the
        request of the span ``cover`` (a ``tarmember://`` path) when given;
        its :class:`DownloadResult` comes from a later :meth:`poll`."""
        self._next_id += 1
        self._jobs.append(
            _Job(self._next_id, sample, list(urls),
                 hint // max(1, len(urls)), cover))

    def poll(self, wanted: Callable[[int, str], bool]) -> List[DownloadResult]:
        """Book the answers of the download processes, make the room they
        ask for and hand out the new jobs; the downloads that ended.
        ``wanted(sample, url)`` says whether a file is still needed."""
        if self.workers[0] is None:
            for index in range(len(self.workers)):
                self._fork(index)
        ended: List[DownloadResult] = []
        for index, worker in enumerate(self.workers):
            try:
                while worker.connection.poll():
                    message = worker.connection.recv()
                    if message[0] == 'room':
                        self._make_room(worker, *message[1:])
                    else:
                        self._book(worker, message[1:], wanted, ended)
            except (EOFError, OSError):
                self._replace(index)
        self._hand_out(wanted, ended)
        return ended

    def _make_room(self, worker: _Worker, key: int, url: str,
                   reservation_id: Optional[int], held: int,
                   nbytes: int) -> None:
        """Reserve ``nbytes`` for ``url`` in ``worker``'s name (or grow its
        reservation to them), evicting in the plan's order; answer the
        reservation's id, None when there is no room."""
        try:
            if reservation_id is None:
                reservation_id = self.store.reserve_for(
                    worker.owner, NAMESPACE, url, nbytes).id
            else:
                Reservation(self.store, reservation_id, held).grow(nbytes)
        except CacheBudgetError:
            reservation_id = None
        worker.connection.send(('room', key, reservation_id))

    def _book(self, worker: _Worker, answer: tuple,
              wanted: Callable[[int, str], bool],
              ended: List[DownloadResult]) -> None:
        job_id, outcome, value = answer
        job = worker.jobs.pop(job_id)
        self._answered(job)
        if outcome == 'no_room':
            ended.append(job.result(no_room=True))
            return
        if outcome == 'failed':
            ended.append(job.result(error=value))
            return
        again = []
        for url, size in zip(job.urls, value):
            if size is _BUSY:
                # Another process had it, or a reader read it, while this
                # download waited: the plan says whether it is needed.
                if wanted(job.sample, url):
                    again.append(url)
                else:
                    job.sized = False
                continue
            job.fetched += 1
            if size == _GONE:
                job.sized = False
            else:
                job.total += size
        if again:
            # Alone now: its span's request would read all of it again.
            job.urls, job.cover = again, None
            self._jobs.append(job)
        else:
            ended.append(job.result())

    def _hand_out(self, wanted: Callable[[int, str], bool],
                  ended: List[DownloadResult]) -> None:
        """Send each new job to the least busy process, the jobs of one
        span to one process."""
        batches: Dict[int, list] = {}
        span_workers: Dict[str, _Worker] = {}
        for job in self._jobs:
            urls = [url for url in job.urls if wanted(job.sample, url)]
            if len(urls) < len(job.urls):
                job.sized, job.urls = False, urls
            if not urls:
                ended.append(job.result())
                continue
            worker = span_workers.get(job.cover) or min(
                self.workers, key=lambda w: len(w.jobs))
            if job.cover is not None:
                span_workers[job.cover] = worker
            worker.jobs[job.id] = job
            self._sent.update(
                (self.reader.entry_digest(url), (url, job)) for url in urls)
            batches.setdefault(worker.pid, []).append(
                (job.id, urls, job.hint, job.cover))
        self._jobs = []
        for worker in self.workers:
            batch = batches.get(worker.pid)
            if batch:
                # A dead process's jobs are taken back by the next poll.
                with contextlib.suppress(OSError):
                    worker.connection.send(('jobs', batch))

    def cancel(self, urls: List[str]) -> None:
        """The plan lets ``urls`` go: a download process that has not
        started theirs yet must not (it would be a second download)."""
        self._cancel([self.reader.entry_digest(url) for url in urls])

    def recheck(self, read: List[str],
                wanted: Callable[[int, str], bool]) -> None:
        """Readers have read the files of digests ``read`` (reports the
        planner has just taken): the jobs sent for them that the plan no
        longer wants are cancelled. Called while those reports are still
        on disk, so a process that starts one meanwhile sees the report."""
        self._cancel([
            digest for digest in read if digest in self._sent
            and not wanted(self._sent[digest][1].sample,
                           self._sent[digest][0])
        ])

    def _cancel(self, digests: List[str]) -> None:
        for digest in digests:
            if digest in self._sent and digest not in self._cancelled:
                self._cancelled.add(digest)
                os.close(os.open(self._cancel_mark(digest),
                                 os.O_CREAT | os.O_WRONLY, 0o644))

    def _cancel_mark(self, digest: str) -> str:
        return os.path.join(self.cancelled_dir, digest)

    def _answered(self, job: _Job) -> None:
        for url in job.urls:
            digest = self.reader.entry_digest(url)
            if self._sent.get(digest, (None, None))[1] is job:
                del self._sent[digest]
                if digest in self._cancelled:
                    self._cancelled.discard(digest)
                    os.unlink(self._cancel_mark(digest))

    def close(self) -> None:
        """Stop the download processes (running downloads finish, within
        ``_STOP_SECONDS``)."""
        for worker in self.workers:
            if worker is not None:
                with contextlib.suppress(OSError):
                    worker.connection.send(None)
        deadline = time.monotonic() + _STOP_SECONDS
        for worker in self.workers:
            if worker is not None:
                _join(worker.pid, deadline)
                worker.connection.close()
        self.workers = [None] * len(self.workers)


def _join(pid: int, deadline: float) -> None:
    """Wait for the child ``pid`` until ``deadline``, then kill it."""
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if not done:
                time.sleep(0.01)
                continue
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


# -- in the download process ------------------------------------------------


class _PlannerRoom:
    """Room this process's downloads ask of the planner, whose eviction
    policy is the plan (an eviction here could take a file the plan keeps
    or a reader is about to read)."""

    def __init__(self, send: Callable[[tuple], None], store,
                 room_wait: float) -> None:
        self._send = send
        self.store = store
        self.room_wait = room_wait
        self._lock = threading.Lock()
        self._asked: Dict[int, list] = {}
        self._next = 0

    def _ask(self, url: str, reservation_id: Optional[int], held: int,
             nbytes: int) -> Optional[int]:
        """The planner's answer: the reservation's id, or None."""
        with self._lock:
            self._next += 1
            key = self._next
            asked = self._asked[key] = [threading.Event(), None]
        self._send(('room', key, url, reservation_id, held, nbytes))
        # No answer: the planner is gone, and so will this process be.
        asked[0].wait(_PARENT_CHECK * 4)
        with self._lock:
            del self._asked[key]
        return asked[1]

    def answered(self, key: int, reservation_id: Optional[int]) -> None:
        with self._lock:
            asked = self._asked.get(key)
            if asked is not None:
                asked[1] = reservation_id
                asked[0].set()

    def reserve(self, url: str, nbytes: int) -> '_PlannedReservation':
        """Hold ``nbytes`` for ``url``'s entry: free room, else what the
        planner evicts, within ``room_wait``."""
        deadline = time.monotonic() + self.room_wait
        while True:
            with contextlib.suppress(CacheBudgetError):
                reservation = self.store.reserve_entry(NAMESPACE, url, nbytes)
                return _PlannedReservation(self.store, reservation.id,
                                           nbytes, self, url)
            reservation_id = self._ask(url, None, 0, nbytes)
            if reservation_id is not None:
                return _PlannedReservation(self.store, reservation_id,
                                           nbytes, self, url)
            if time.monotonic() > deadline:
                raise CacheBudgetError(
                    f'no room for {nbytes} bytes of {url} within '
                    f'{self.room_wait:g} s')
            time.sleep(0.01)

    def grow(self, reservation: Reservation, url: str, nbytes: int) -> bool:
        return self._ask(url, reservation.id, reservation.nbytes,
                         nbytes) is not None


class _PlannedReservation(Reservation):
    """A reservation of this process that the planner grows when the
    budget has no free room."""

    def __init__(self, store, reservation_id: int, nbytes: int,
                 room: _PlannerRoom, url: str) -> None:
        super().__init__(store, reservation_id, nbytes)
        self._room = room
        self._url = url

    def grow(self, nbytes: int) -> None:
        if nbytes <= self.nbytes:
            return
        with contextlib.suppress(CacheBudgetError):
            return super().grow(nbytes)
        if not self._room.grow(self, self._url, nbytes):
            raise CacheBudgetError(
                f'the node prefetcher found no room for {nbytes} bytes '
                f'of {self._url}')
        self.nbytes = nbytes


def _download(reader: RemoteReader, room: _PlannerRoom, url: str, hint: int,
              marks: ReadOnceMarks,
              span: Optional[SharedSpan]) -> Optional[int]:
    """Bytes of ``url``'s entry, ``_GONE`` if freed already, ``_BUSY``
    (another process had it, or it may not be wanted: the planner
    decides)."""
    digest = reader.entry_digest(url)
    cancelled = os.path.join(reader.store.cache_dir, CANCELLED_DIR, digest)

    def wanted() -> bool:
        # A reader read it, and its entry is gone (evicted for room, or
        # by the plan): the planner may not have heard of that read yet.
        return not (os.path.exists(cancelled) or marks.reported(digest))

    path = reader.entry_path(url)
    if os.path.exists(path):
        return _size(path)
    if span is not None and span.holds is not None and not \
            span.holds.holds(digest):
        # Another producer has it, or the span let it go: the planner
        # decides (it sends it again alone if it is still wanted).
        return _BUSY
    # Reserved before taking the file's lock: a reader waiting for that
    # lock must not wait for the planner too. (A span's member is held
    # already: its reader waits for this as for the span's read, bounded
    # by SharedSpan.let_go_if_late.)
    reservation = room.reserve(url, hint)
    try:
        entry = reader.fetch_into(url, reservation, room.room_wait, wanted,
                                  span)
    except DownloadNotWanted:
        return _BUSY
    if entry is None:
        return _BUSY
    return _size(entry.path) if entry.size is None else entry.size


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return _GONE


def _run_in_turn(reader: RemoteReader, room: _PlannerRoom, send,
                 jobs: List[tuple], max_gap: int) -> None:
    """Run ``jobs`` (of one span, or one job) on this thread; a span
    holds its members' keys until each is published."""
    cover = jobs[0][3]
    if cover is None:
        for job_id, urls, hint, _ in jobs:
            _run_job(reader, room, send, None, job_id, urls, hint)
        return
    span = SharedSpan(cover, max_gap)
    with reader.claimed(span, [url for job in jobs for url in job[1]],
                        room.room_wait):
        for job_id, urls, hint, _ in jobs:
            span.let_go_if_late()
            _run_job(reader, room, send, span, job_id, urls, hint)


def _run_job(reader: RemoteReader, room: _PlannerRoom, send,
             span: Optional[SharedSpan], job_id: int, urls: List[str],
             hint: int) -> None:
    marks = ReadOnceMarks(reader.store.cache_dir)
    try:
        sizes = [
            _download(reader, room, url, hint, marks, span) for url in urls
        ]
        answer = ('ended', job_id, 'done', sizes)
    except CacheBudgetError:
        answer = ('ended', job_id, 'no_room', None)
    except Exception as error:  # the planner warns; the reader reports
        answer = ('ended', job_id, 'failed',
                  (type(error).__name__, repr(error)))
    send(answer)


def _evicts_nothing(nbytes: int) -> tuple:
    return ()


def _serve(connection: Connection, reader: RemoteReader, threads: int,
           room_wait: float, max_gap: int,
           parent: int) -> None:  # pragma: no cover
    """The download process: runs the jobs it is sent until told to stop,
    or its parent (the planner) is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the planner stops it
    gc.freeze()  # as the prefetch process does (see its _run)
    store = reader.store
    # Only the planner evicts for this process's downloads (see
    # _PlannerRoom): the plan lives there.
    store.eviction_policy = _evicts_nothing
    lock = threading.Lock()

    def send(message) -> None:
        with lock, contextlib.suppress(OSError):
            connection.send(message)

    room = _PlannerRoom(send, store, room_wait)
    pool = ThreadPoolExecutor(threads, 'node-download')
    try:
        while os.getppid() == parent:
            if not connection.poll(_PARENT_CHECK):
                continue
            message = connection.recv()
            if message is None:
                break
            if message[0] == 'room':
                room.answered(*message[1:])
                continue
            for jobs in in_turn(message[1], lambda job: job[3]):
                pool.submit(_run_in_turn, reader, room, send, jobs,
                            max_gap)
    except (EOFError, OSError):
        pass
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        store.flush()
    os._exit(0)
