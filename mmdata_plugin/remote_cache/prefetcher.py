"""The node prefetcher: downloads ahead of the readers, keeps what the plan
keeps, and frees the rest as soon as it has been read.

One per node (see :class:`~mmdata_plugin.engine.hooks.RemoteCachePrefetchHook`).
Each :meth:`NodePrefetcher.poll`:

1. reads the node's position: the smallest next tick of its ranks
   (:mod:`.consumption_cursors`);
2. evicts the files the plan does not keep once a reader has read them
   (:mod:`.read_once`), and settles the reads the training loops have
   passed (what a reader did not report, e.g. a read served elsewhere);
3. decides the ticks up to ``position + window`` (:class:`~.stream_planner.
   StreamPlanner`: hit or download, kept until which tick, dropped) and
   starts their downloads, at most ``target_inflight`` requests at a time
   (neighbouring tar members of a round share one request,
   :mod:`.coalesced_reads`);
4. with a growing-window order, fills what is left of the in-flight target
   with the samples entering the next epoch's window, each booked as kept
   until its first read (:mod:`.window_ahead`).

A sample's files stay on disk while the plan keeps it or a decided read of
it is ahead. Files read ahead and not kept are *staged*: their bytes come
out of the ``reserve`` (the rest of the budget is the plan's to keep
samples in) until their read. The window covers the batches the
DataLoaders read ahead of the loop plus what arrives within the download
latency at the measured rate (Little's law: in flight = misses/s x
latency).
"""
import contextlib
import heapq
import json
import logging
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Iterable, Iterator, List, Optional

import numpy as np
from mmengine.logging import print_log

from ..cache.node_store import CacheBudgetError
from ..sample_order.node_stream import NodeStream
from .coalesced_reads import CoalesceLimits, RoundSpans, SharedSpan, in_turn
from .consumption_cursors import CursorReader
from .download_processes import DownloadResult, ProcessDownloads
from .node_cache_backend import (NAMESPACE, DownloadNotWanted, RemoteReader,
                                 write_victims)
from .booked_samples import BookedSamples
from .file_holders import FileHolders, digest_key
from .read_once import ReadOnceMarks
from .stream_planner import StreamPlanner
from .window_ahead import EnteringSamples

#: Samples downloaded before planning when no size is known yet.
_SIZE_PROBES = 4
#: Fewest samples the reserve stages (below it nothing is read ahead).
_MIN_STAGED = 4
#: Largest share of the budget an automatic reserve takes (when it holds
#: more than _MIN_STAGED samples): the rest keeps samples for hits.
RESERVE_SHARE = 0.05
#: Largest share of the budget an automatic reserve takes to stage two
#: coalesced requests' members (see needed_reserve).
COALESCED_RESERVE_SHARE = 0.25
#: Relative change of the needed reserve that resizes it.
_RESIZE_STEP = 0.25
#: Seconds a download waits for room in a full budget before it leaves
#: the file to its reader (readers waiting on it wait as long).
_ROOM_WAIT = 2.0
#: Seconds a file nobody planned stays out of the eviction order's front.
_JUST_PUBLISHED = 2.0
#: Reads ahead of the plan remembered until the plan decides them.
_READ_AHEAD_MEMORY = 1 << 16
#: Kept samples asked of the plan at first for the victims (then 8x more
#: at a time, while they are taken).
_VICTIMS_CHUNK = 1 << 12
#: Gauges of the running prefetcher, for monitors (JSON, replaced atomically).
STATUS_FILE = 'planner/status.json'


class NodePrefetcher:
    """Plans, downloads and frees the remote files of one node.

    Args:
        reader (RemoteReader): Downloads into the node store; its store
            must use :meth:`victims` as eviction policy.
        stream (NodeStream): The node's stream.
        sample_urls (callable): ``sample_urls(sample_id) -> list[str]``,
            the files a read of a sample reads. The books keep no file
            names: a booked sample's files are asked again when needed,
            from ``sample_urls.files(sample_id)`` when it has that method
            (every file a sample may read, also those a pipeline head
            serves since: :class:`~.pipeline_routing.SampleFiles`). When
            it has an ``nbytes`` method, ``nbytes(sample_id)`` is the
            sample's size if known without reading (a shard index), else
            None: the plan counts a sample the books do not size at it,
            else at the mean size downloaded.
        cursors (CursorReader): The positions of the node's ranks.
        reserve (int, optional): Bytes of the budget for files downloaded
            ahead of their read and not kept (the plan keeps samples in
            ``limit - reserve``). None sizes it by Little's law and resizes
            it as rates are measured (:meth:`needed_reserve`), at most
            ``RESERVE_SHARE`` of the limit.
        readahead (int): Ticks the node's DataLoaders read ahead of the
            loops (decided and downloading whatever the in-flight target).
        max_inflight (int): Most downloads at once.
        stop (int, optional): Tick after the last one trained.
        horizon (int): Ticks looked ahead for next uses.
        min_lead (int): Ticks downloaded ahead beyond ``readahead`` before
            any rate is measured.
        download_processes (int): Processes forked to download (see
            :mod:`.download_processes`): the plan's work and the
            downloads' then hold different interpreter locks; 1 downloads
            on threads of this process (the hook's default is 2).
        coalesce (CoalesceLimits, optional): Limits of the requests that
            fetch neighbouring tar members of a round at once (a group
            counts as one request against ``max_inflight``); None fetches
            each member with its own.
    """

    def __init__(self,
                 reader: RemoteReader,
                 stream: NodeStream,
                 sample_urls: Callable[[int], List[str]],
                 cursors: CursorReader,
                 reserve: Optional[int],
                 readahead: int,
                 max_inflight: int = 64,
                 stop: Optional[int] = None,
                 horizon: int = 1 << 20,
                 min_lead: int = 64,
                 download_processes: int = 1,
                 coalesce: Optional[CoalesceLimits] = None) -> None:
        self.reader = reader
        self.store = reader.store
        self.stream = stream
        self.sample_urls = sample_urls
        self.cursors = cursors
        self.reserve = None if reserve is None else int(reserve)
        self.auto_reserve = reserve is None
        self.readahead = int(readahead)
        self.max_inflight = int(max_inflight)
        self.stop = stop
        self.horizon = horizon
        self.min_lead = min_lead
        if self.reserve is not None and self.reserve >= self.store.limit:
            raise ValueError(
                f'the prefetch reserve ({self.reserve} bytes) leaves nothing '
                f'of cache_limit ({self.store.limit} bytes) to keep samples')
        self.marks = ReadOnceMarks(self.store.cache_dir)
        # A dead prefetcher's marks and reports go now, not when the plan
        # starts: a reader ahead of the plan reports its reads meanwhile.
        self.marks.reset()
        self.planner: Optional[StreamPlanner] = None
        self.position = 0
        self._lock = threading.RLock()
        # Decided reads not yet passed by the loops, per sample, and the
        # (tick, sample) heap that settles them when the loops pass.
        self._reads: Dict[int, int] = {}
        # The last of those reads' ticks.
        self._last_read: Dict[int, int] = {}
        self._releases: list = []
        # The samples the plan has on its books (read ahead or kept) with
        # their learned sizes, and the samples booking each file (samples
        # may share a file: one per person of a picture, a repeated
        # dataset). A booked sample's files are asked again when needed
        # (booked_files): only those of samples with decided reads ahead
        # are at hand, the rest of the books are a few ints a sample.
        self._books = BookedSamples()
        self._booked = FileHolders()
        self._files_ahead: Dict[int, List[str]] = {}
        # Digests of files a reader read before the plan decided their
        # tick (a reader ahead of the plan downloads on demand), oldest
        # first.
        self._read_ahead: Dict[str, None] = {}
        # Staged files (read ahead, not kept): bytes held of the reserve.
        self._staged: Dict[str, int] = {}
        self._staged_bytes = 0
        # digest -> (sample, url) of files marked to go at their read.
        self._marked: Dict[str, tuple] = {}
        # Growing windows: the next epoch's entering samples, and those
        # booked ahead whose first read the plan has not decided yet.
        self._entering = (EnteringSamples(stream)
                          if EnteringSamples.applies(stream) else None)
        self._booked_ahead = set()
        self._mean_size = float(reader.size_hint or 1 << 16)
        self._sizes_learned = 0
        self._largest_size = 0
        if download_processes > 1:
            self._processes = ProcessDownloads(
                reader, download_processes, max_inflight, _ROOM_WAIT,
                0 if coalesce is None else coalesce.max_gap)
            self._pool = None
        else:
            self._processes = None
            self._pool = ThreadPoolExecutor(max_inflight, 'node-prefetch')
        self._inflight = 0
        self._downloading = set()
        # Requests in flight (a coalesced group is one), this round's
        # groups, and the group each downloading sample belongs to.
        self._requests = 0
        self._round = None if coalesce is None else RoundSpans(coalesce)
        self._group_of = {}
        # Files off the books, until this thread has evicted them.
        self._leaving = set()
        self._started_at = time.time()
        # measured rates (exponential moving averages)
        self._latency = 0.05
        self._rate = 0.0
        self._miss_share = 1.0
        self._last = None
        self.stats = dict(planned=0, planned_hits=0, downloads=0,
                          refetched=0, failed=0, no_room=0,
                          evicted_by_plan=0, freed_at_read=0,
                          read_before_planned=0, read_before_download=0,
                          reserve_full=0,
                          entering_fetched=0, entering_dropped=0)
        self._warned = set()

    # -- sizes --------------------------------------------------------------

    def size_of(self, sample: int) -> int:
        size = self._books.size(sample)
        if size is None:
            size = self._told_size(sample)
        return int(self._mean_size) if size is None else size

    def _told_size(self, sample: int) -> Optional[int]:
        """The size the source tells without a download, or None."""
        nbytes = getattr(self.sample_urls, 'nbytes', None)
        return None if nbytes is None else nbytes(sample)

    def _learn_size(self, sample: int, size: int) -> None:
        # The mean is over the sizes learned, not the books: samples that
        # read no file (or whose file a pipeline head serves) are booked
        # with 0 bytes, and would pull the mean of what is downloaded
        # towards 0 -- or, counted without their 0, hold it near the
        # first guess. A sample off the books by now keeps no size.
        self._books.learn(sample, size)
        self._count_sizes(size, 1, size)

    def _learn_sizes(self, samples: List[int], sizes: List[int]) -> None:
        """:meth:`_learn_size` of many samples at once."""
        if not samples:
            return
        self._books.learn_many(samples, sizes)
        self._count_sizes(sum(sizes), len(sizes), max(sizes))

    def _count_sizes(self, total: int, count: int, largest: int) -> None:
        """Fold ``count`` sizes learned (``total`` bytes, the ``largest``)
        into the mean and the largest."""
        self._sizes_learned += count
        self._mean_size += (total - count * self._mean_size) / \
            self._sizes_learned
        self._largest_size = max(self._largest_size, largest)

    def _download_hint(self, sample: int) -> int:
        """Bytes reserved before downloading ``sample``: its size (learned,
        or told by the source), else the largest seen (a hint the file
        outgrows waits for room while its reader may be waiting on it)."""
        return (self._books.size(sample) or self._told_size(sample)
                or max(self._largest_size, int(self._mean_size)))

    def _present(self, urls: List[str]) -> bool:
        return all(
            os.path.exists(self.reader.entry_path(url)) for url in urls)

    def _file_key(self, url: str) -> int:
        return digest_key(self.reader.entry_digest(url))

    # -- start --------------------------------------------------------------

    def start(self, position: int) -> None:
        """Plan from tick ``position``; files already on disk that the
        plan reads soon count as kept (a restart with a warm cache)."""
        sizes = {row.key: row.size for row in self.store.entries(NAMESPACE)}
        self.position = position
        self.planner = StreamPlanner(
            self.stream,
            self.store.limit,
            self.size_of,
            start=position,
            stop=self.stop,
            horizon=self.horizon)
        if not sizes:
            # Nothing on disk tells the sample size the plan budgets with:
            # the first samples are needed now anyway, download them first
            # (but not again one that a reader ahead has read already).
            for sample in self.planner.lookahead(_SIZE_PROBES).tolist():
                for url in self.sample_urls(sample):
                    digest = self.reader.entry_digest(url)
                    with contextlib.suppress(DownloadNotWanted), \
                            self.reader.fetch(url, wanted=lambda d=digest:
                                              not self.marks.reported(d)) \
                            as entry:
                        sizes[url] = os.path.getsize(entry.path)
        present, files = [], []
        for sample in set(self.planner.lookahead(self.horizon).tolist()):
            urls = list(self.sample_urls(sample))
            if urls and all(url in sizes for url in urls):
                present.append(sample)
                files.append(urls)
        with self._lock:
            # Booked to hold their sizes while the plan adopts them.
            self._book_many(present, files)
            self._learn_sizes(present,
                              [sum(map(sizes.get, urls)) for urls in files])
            self.reserve = self._sized_reserve()
            self.planner.cache.capacity = self.store.limit - self.reserve
            self.planner.adopt(present)
            for sample, urls in zip(present, files):
                if sample not in self.planner.cache:
                    self._unbook(sample, urls)

    def needed_reserve(self) -> int:
        """Bytes the files read ahead and not kept need (Little's law):
        the window's ticks (read-ahead plus measured rate x latency) that
        miss, plus the margin of two samples :meth:`_decide_ahead` keeps;
        at least ``_MIN_STAGED`` samples, at most ``RESERVE_SHARE`` of the
        limit when that holds them. Once requests coalesce tar members, two
        requests' spans more (one read while the next downloads: a round's
        members are only as dense in their shards as the reserve lets it
        decide ticks ahead), at most ``COALESCED_RESERVE_SHARE``."""
        mean, limit = int(self._mean_size), self.store.limit
        staged = (math.ceil(self.window() * self._miss_share) + 2) * mean
        floor = _MIN_STAGED * mean
        share = RESERVE_SHARE
        if self._coalescing():
            staged += 2 * self._round.limits.max_span
            share = COALESCED_RESERVE_SHARE
        return min(max(staged, floor), max(floor, int(limit * share)))

    def _resize_reserve(self) -> List[str]:
        """Follow :meth:`needed_reserve` when it moved by more than
        ``_RESIZE_STEP``; the files of kept samples the smaller plan
        capacity drops."""
        needed = self.needed_reserve()
        if abs(needed - self.reserve) <= _RESIZE_STEP * self.reserve:
            return []
        self.reserve = needed
        gone = []
        for victim in self.planner.cache.resize(self.store.limit - needed):
            gone += self._drop(victim)
        return gone

    def _sized_reserve(self) -> int:
        """The reserve in bytes, now that the mean sample size is known."""
        limit, mean = self.store.limit, int(self._mean_size)
        floor = _MIN_STAGED * mean
        if self.reserve is None:
            return self.needed_reserve()
        if self.reserve < floor:
            print_log(
                f'Remote cache: prefetch_reserve={self.reserve} bytes holds '
                f'fewer than {_MIN_STAGED} samples (~{mean} bytes each) '
                f'read ahead; using {floor} bytes.',
                logger='current',
                level=logging.WARNING)
            if floor >= limit:
                raise ValueError(
                    f'cache_limit={limit} bytes cannot hold {_MIN_STAGED} '
                    f'samples of ~{mean} bytes read ahead besides what the '
                    'plan keeps; raise cache_limit.')
            return floor
        return self.reserve

    # -- what stays on disk ---------------------------------------------------

    def _book(self, sample: int,
              files: Optional[List[str]] = None) -> List[str]:
        """Put ``sample`` on the books (``files``: what ``sample_urls``
        just said of it); its booked files."""
        if sample in self._books:
            return self.booked_files(sample, files)
        urls = list(self.sample_urls(sample) if files is None else files)
        self._books.add(sample, len(urls))
        if not urls:
            # Reads no file (its path keys are empty, or a pipeline
            # head serves it): nothing to download or keep.
            self._books.learn(sample, 0)
        for url in urls:
            if self._booked.add(self._file_key(url), sample) > 1:
                # Another sample's read must not free it.
                self._unmark(url)
        return urls

    def _book_many(self, samples: List[int],
                   files: List[List[str]]) -> None:
        """:meth:`_book` of many samples not on the books, ``files`` the
        files of each (a warm start's, or a benchmark's kept set)."""
        counts = list(map(len, files))
        self._books.add_many(samples, counts)
        # (those that read no file: 0 bytes, as _book)
        empty = [sample for sample, count in zip(samples, counts) if not count]
        self._books.learn_many(empty, [0] * len(empty))
        urls = [url for listed in files for url in listed]
        shared = self._booked.add_many(
            [self._file_key(url) for url in urls], np.repeat(samples, counts))
        for index in np.flatnonzero(shared).tolist():
            self._unmark(urls[index])

    def booked_files(self, sample: int,
                     asked: Optional[List[str]] = None) -> List[str]:
        """The files ``sample`` booked (none when off the books): at hand
        while a decided read of it is ahead, else those of its files (of
        ``asked``, a list just asked, when it has them all) that the books
        say it booked."""
        count = self._books.files(sample)
        if not count:
            return []
        urls = self._files_ahead.get(sample)
        if urls is not None:
            return urls
        if asked is not None:
            urls = self._booked_among(sample, asked)
            if len(urls) == count:
                return urls
        every = getattr(self.sample_urls, 'files', self.sample_urls)
        return self._booked_among(sample, every(sample))

    def _booked_among(self, sample: int, listed: List[str]) -> List[str]:
        return [
            url for url in listed
            if self._booked.holds(self._file_key(url), sample)
        ]

    def _unbook(self, sample: int, urls: List[str]) -> List[str]:
        """Take ``sample`` (booking ``urls``) off the books; its files no
        other booked sample reads."""
        gone = []
        for url in urls:
            if self._booked.remove(self._file_key(url), sample):
                gone.append(url)
        self._books.remove(sample)
        self._files_ahead.pop(sample, None)
        return gone

    def _shared(self, url: str) -> bool:
        return self._booked.count(self._file_key(url)) > 1

    def _sharing(self, sample: int, urls: List[str]) -> set:
        """The other booked samples that read a file of ``sample``."""
        return {
            other
            for url in urls
            for other in self._booked.of(self._file_key(url))
            if other != sample
        }

    def _stage(self, url: str, nbytes: int) -> None:
        if url not in self._staged:
            self._staged[url] = nbytes
            self._staged_bytes += nbytes

    def _unstage(self, url: str) -> None:
        self._staged_bytes -= self._staged.pop(url, 0)

    def _mark(self, sample: int, url: str) -> None:
        digest = self.reader.entry_digest(url)
        if digest not in self._marked:
            self._marked[digest] = (sample, url)
            self.marks.mark(digest)

    def _unmark(self, url: str) -> None:
        digest = self.reader.entry_digest(url)
        if self._marked.pop(digest, None) is not None:
            self.marks.unmark(digest)

    def _settle(self, sample: int,
                urls: Optional[List[str]] = None) -> List[str]:
        """Bring the staging and read-once marks of ``sample``'s files
        (``urls`` when at hand) in line with the plan; its files when
        nothing needs them any more.

        Kept: counted in the plan's capacity, stays after every read. Not
        kept with reads ahead: staged; with one read ahead, marked to go
        at that read. Neither: gone.
        """
        if sample not in self._books:
            return []
        if urls is None:
            urls = self.booked_files(sample)
        kept = sample in self.planner.cache
        if not urls:
            return [] if kept else self._unbook(sample, urls)
        reads = self._reads.get(sample, 0)
        if kept or not reads:
            for url in urls:
                if kept or not self._shared(url):
                    # (a shared file stays staged for its other reader)
                    self._unstage(url)
                    self._unmark(url)
            if kept:
                return []
            others = self._sharing(sample, urls)
            gone = self._unbook(sample, urls)
            for other in others:
                # Its files are its own now: marked to go at its read.
                gone += self._settle(other)
            return gone
        share = self.size_of(sample) // len(urls)
        for url in urls:
            self._stage(url, share)
            if reads == 1 and not self._shared(url):
                self._mark(sample, url)
            else:
                self._unmark(url)
        return []

    def _drop(self, victim: int) -> List[str]:
        """The plan no longer keeps ``victim``: its files if they can go."""
        if victim in self._booked_ahead:
            # Downloaded for the next epoch, dropped before its read.
            self.stats['entering_dropped'] += 1
            self._booked_ahead.discard(victim)
        return self._settle(victim)

    def _take_reads(self, reported: List[str]) -> List[str]:
        """Files read since the last round (the digests ``reported``) that
        the plan lets go now."""
        gone = []
        for digest in reported:
            marked = self._marked.pop(digest, None)
            if marked is not None:
                _, url = marked
                self._unstage(url)
                gone.append(url)
            # Read, maybe by a reader ahead of the plan: before the plan
            # decided its tick, or before the plan's download of it (which
            # is then not wanted, :meth:`_still_needed`).
            self._read_ahead[digest] = None
        self.stats['freed_at_read'] += len(gone)
        # Reads the plan never reaches (the run ends first) are forgotten,
        # oldest first.
        while len(self._read_ahead) > _READ_AHEAD_MEMORY:
            del self._read_ahead[next(iter(self._read_ahead))]
        return gone

    def _read_already(self, urls: List[str]) -> bool:
        """Whether a reader ahead of the plan has read these files (the
        read of the tick being decided); forgets that it did."""
        digests = [self.reader.entry_digest(url) for url in urls]
        if not all(digest in self._read_ahead for digest in digests):
            return False
        for digest in digests:
            del self._read_ahead[digest]
        return True

    def _release_consumed(self) -> List[str]:
        gone = []
        while self._releases and self._releases[0][0] < self.position:
            _, sample = heapq.heappop(self._releases)
            count = self._reads[sample] - 1
            if count:
                self._reads[sample] = count
            else:
                del self._reads[sample]
                del self._last_read[sample]
                # Its reads are past: a report of one of them says nothing
                # of the next.
                for url in self.booked_files(sample):
                    self._read_ahead.pop(self.reader.entry_digest(url), None)
            gone.extend(self._settle(sample))
            if sample not in self._reads:
                self._files_ahead.pop(sample, None)
        return gone

    def _evict(self, urls: List[str]) -> None:
        # Outside self._lock: the store's ledger lock is taken before ours
        # when a download's reservation asks `victims`. Only this thread
        # books, so a file leaving now is on no book.
        if urls:
            if self._processes is not None:
                self._processes.cancel(urls)
            freed = self.store.evict_many(NAMESPACE, urls)
            self.stats['evicted_by_plan'] += sum(map(bool, freed))
        with self._lock:
            self._leaving.difference_update(urls)

    # -- eviction policy of the planner's store -----------------------------

    def victims(self, nbytes: int = 0):
        """Who the store evicts when a download needs room: files no plan
        needs, then kept samples, the one read furthest ahead first (never
        one read within the window, nor one with a read in the window still
        ahead), then files no plan needs that were published within the
        last seconds."""
        with self._lock:
            soon = self.position + self.window()
            leaving = list(self._leaving)
        for url in leaving:
            yield NAMESPACE, url
        # A file a reader ahead of the plan has just downloaded is on no
        # book yet, but evicting it before that reader opened it would make
        # the reader download it again.
        settled = max(self._started_at, time.time() - _JUST_PUBLISHED)
        recent = []
        for row in self.store.entries(NAMESPACE):
            if row.key not in leaving and not self._booked_file(row.digest):
                if row.last_access > settled:
                    recent.append(row.key)
                else:
                    yield NAMESPACE, row.key
        yield from self._files_of_kept(self._kept_beyond(soon))
        for url in recent:
            yield NAMESPACE, url

    def _kept_beyond(self, soon: int) -> Iterator[int]:
        """The kept samples read next beyond tick ``soon``, the one read
        furthest ahead first, but none with a read within the window still
        ahead (its reader would find nothing and download it again). Asked
        of the plan a chunk at a time: the victims' readers take the first
        few thousand of up to 1e7."""
        done, most = 0, _VICTIMS_CHUNK
        while True:
            with self._lock:
                if self.planner is None:
                    return
                samples, untils = self.planner.cache.kept_by_next_use(most)
                chunk = [
                    sample for sample, until in zip(
                        samples[done:].tolist(), untils[done:].tolist())
                    if until >= soon and not self._reads.get(sample)
                ]
                ended = len(samples) < most or untils[-1] < soon
            yield from chunk
            if ended:
                return
            done, most = most, 8 * most

    def _booked_file(self, digest: str) -> bool:
        with self._lock:
            return digest_key(digest) in self._booked

    def _files_of_kept(self, kept: Iterable[int]):
        """The files of the ``kept`` samples, each once, and none that a
        booked sample not among the ``kept`` so far reads (a shared
        file)."""
        evictable, seen = set(), set()
        for sample in kept:
            evictable.add(sample)
            with self._lock:
                urls = self.booked_files(sample)
            for url in urls:
                with self._lock:
                    holders = self._booked.of(self._file_key(url))
                    wanted = url not in seen and holders <= evictable
                if wanted:
                    seen.add(url)
                    yield NAMESPACE, url

    # -- window and concurrency ---------------------------------------------

    def window(self) -> int:
        """Ticks ahead of the loops that are decided and downloading."""
        lead = self._rate * self._latency * 3
        return self.readahead + max(self.min_lead, math.ceil(lead))

    def target_inflight(self) -> int:
        """Downloads to keep running: misses/s x latency, with margin."""
        if self._rate == 0:
            # Nothing measured yet (start, or a pause): a quarter of the
            # most, so a cold start is not one download at a time.
            return max(2, self.max_inflight // 4)
        misses_per_second = self._rate * self._miss_share
        wanted = math.ceil(misses_per_second * self._latency * 2) + 2
        return max(2, min(self.max_inflight, wanted))

    def _measure(self, position: int) -> None:
        now = time.monotonic()
        if self._last is not None:
            then, before = self._last
            if now - then >= 0.2:
                rate = (position - before) / (now - then)
                self._rate = rate if self._rate == 0 else (
                    0.7 * self._rate + 0.3 * rate)
                self._last = (now, position)
        else:
            self._last = (now, position)

    # -- the loop -----------------------------------------------------------

    def poll(self) -> bool:
        """One round; False until every rank has published a position."""
        position = self._loops_position()
        if position is None:
            return False
        if self.planner is None:
            self.start(position)
        with self._lock:
            self.position = max(self.position, position)
            self._measure(self.position)
            if self.auto_reserve:
                self._leaving.update(self._resize_reserve())
            reported = self.marks.read_reports()
            self._leaving.update(self._take_reads(reported))
            self._leaving.update(self._release_consumed())
            downloads = self._decide_ahead() + self._fetch_entering()
            if self._round is not None:
                self._round.close()
            leaving = list(self._leaving)
        if self._processes is not None:
            self._processes.recheck(reported, self._still_needed)
        self.marks.forget_reports(reported)
        self._evict(leaving)
        downloads = [(sample, urls, hint, group and group.span)
                     for sample, urls, hint, group in downloads]
        if self._processes is None:
            for run in in_turn(downloads, lambda download: download[3]):
                self._pool.submit(self._download_in_turn, run)
            return True
        for sample, urls, hint, span in downloads:
            self._processes.submit(sample, urls, hint, span and span.path)
        for result in self._processes.poll(self._still_needed):
            self._finished(result)
        return True

    def _loops_position(self) -> Optional[int]:
        """The tick the slowest rank's loop is at (every read before it is
        done); None until every rank has published one."""
        cursors = self.cursors.read()
        if cursors is None:
            return None
        return min(
            self.stream.tick_of(cursor.epoch, cursor.consumed)
            for cursor in cursors)

    def connections(self) -> list:
        """The download processes' pipes (answers to book when readable)."""
        return [] if self._processes is None else \
            self._processes.connections()

    def _decide_ahead(self) -> list:
        """Decide the ticks of the window; the downloads to start."""
        planner = self.planner
        must = self.position + self.readahead
        end = self.position + self._lead()
        downloads = []
        # A tick stages at most two samples (its read and one dropped).
        room = self.reserve - 2 * int(self._mean_size)
        target = self.target_inflight()
        coalescing = self._coalescing()
        within_target = None
        while planner.tick < end:
            if self._staged_bytes > room:
                self.stats['reserve_full'] += 1
                break
            # What the DataLoaders may read next is downloading whatever
            # the in-flight target: a reader ahead of the plan would wait.
            if planner.tick >= must:
                if not coalescing and self._requests >= target:
                    break
                if coalescing and within_target is None:
                    within_target = self._within_target(
                        end, target, room - self._staged_bytes)
                if coalescing and planner.tick >= within_target:
                    break
            decision = planner.decide()
            if decision is None:
                break
            download = self._apply(decision)
            if download is not None:
                downloads.append(download)
        return downloads

    def _coalescing(self) -> bool:
        """Whether requests have coalesced members (tar shards): only
        then are ticks decided in steps, further ahead."""
        return self._round is not None and self._round.coalesced > 0

    def _lead(self) -> int:
        """Ticks ahead of the loops decided: the window, and with
        coalesced requests as many as the reserve stages (the members of a
        request are the neighbours read within them)."""
        if not self._coalescing():
            return self.window()
        staged = self.reserve / self._mean_size / self._miss_share
        return max(self.window(), math.ceil(staged))

    def _within_target(self, end: int, target: int, room: int) -> int:
        """The tick up to which the undecided ticks' downloads keep the
        requests in flight within ``target``, each taken as a miss; a
        request coalesces the neighbours that ticks up to ``end`` read.
        Only the ticks whose misses ``room`` bytes stage are looked at, and
        decided (a fixed reserve of gigabytes would make the lead hundreds
        of thousands of ticks, each a ``sample_urls`` call a round)."""
        planner = self.planner
        free = target - self._requests
        if free <= 0:
            return planner.tick
        trial = RoundSpans(self._round.limits)
        stageable = math.ceil(
            max(room, 0) / self._mean_size / self._miss_share) + 1
        ahead = planner.lookahead(min(end - planner.tick,
                                      stageable)).tolist()
        for offset, sample in enumerate(ahead):
            _, opened = trial.join(self.sample_urls(sample))
            free -= opened
            if free < 0:
                return planner.tick + offset
        return planner.tick + len(ahead)

    def _apply(self, decision) -> Optional[tuple]:
        """Book what the decision needs on disk (files no longer needed
        leave); the download it needs, if any."""
        tick, sample = decision.tick, decision.sample
        self.stats['planned'] += 1
        if decision.hit:
            self.stats['planned_hits'] += 1
        hits = self.stats['planned_hits'] / self.stats['planned']
        self._miss_share = max(0.05, 1 - hits)
        # A dropped sample stays only for a read of it still ahead.
        for victim in decision.dropped:
            self._leaving.update(self._drop(victim))
        self._booked_ahead.discard(sample)
        # Asked once per decision (a data-info look-up, a stat per file a
        # pipeline head may serve): a booked sample's files stay on its
        # books, but a head may serve one since, and then it is not
        # downloaded.
        files = self.sample_urls(sample)
        read = sample not in self._books and self._read_already(files)
        urls = self._book(sample, files)
        # Booked again before this round evicted it: it stays.
        self._leaving.difference_update(urls)
        if read:
            # Nothing to download for this read: what is left of it is
            # what the plan keeps. A kept sample whose file has gone
            # meanwhile is downloaded for its next read, when the plan
            # decides that one (now, the plan could drop it before).
            self.stats['read_before_planned'] += 1
            self._leaving.update(self._settle(sample, urls))
            return None
        else:
            self._reads[sample] = self._reads.get(sample, 0) + 1
            self._last_read[sample] = tick
            self._files_ahead[sample] = urls
            heapq.heappush(self._releases, (tick, sample))
            self._settle(sample)
        download = self._download_of(sample, files)
        if download is not None and decision.hit:
            self.stats['refetched'] += 1
        return download

    def _download_of(self, sample: int, urls: List[str]) -> Optional[tuple]:
        """The download ``sample`` needs (counted in flight), or None when
        its files are on disk or coming: ``(sample, urls, hint, group)``,
        ``group`` the round's coalesced request it joined (None: its own;
        its span is known once the round is decided)."""
        if sample in self._downloading or self._present(urls):
            return None
        self._inflight += 1
        self._downloading.add(sample)
        group, opened = (None, True) if self._round is None else \
            self._round.join(urls)
        self._requests += opened
        if group is not None:
            self._group_of[sample] = group
        return sample, urls, self._download_hint(sample), group

    def _fetch_entering(self) -> tuple:
        """Downloads of samples entering the next epoch's window, at low
        priority: only while fewer than the target downloads run. Each is
        booked as kept until its first read (like :meth:`StreamPlanner.
        adopt` books files on disk), as far as the plan's capacity allows
        once samples kept for later reads make room (Belady); the
        downloads to start."""
        entering = self._entering
        if entering is None:
            return []
        planner, cache = self.planner, self.planner.cache
        epoch, _ = self.stream.epoch_of(self.position)
        entering.select(epoch + 1,
                        cache.capacity // max(1, int(self._mean_size)))
        target = self.target_inflight()
        downloads = []
        while self._requests < target:
            item = entering.peek()
            if item is None:
                break
            if self.stop is not None and item[0] >= self.stop:
                # Read after the end of training (queued by first read).
                entering.clear()
                break
            tick, sample = item
            if tick < planner.tick or sample in self._books:
                # The plan got there first.
                entering.pop()
                continue
            dropped = cache.admit(sample, tick, self.size_of(sample))
            if dropped is None:
                break
            entering.pop()
            for victim in dropped:
                self._leaving.update(self._drop(victim))
            urls = self._book(sample)
            self._leaving.difference_update(urls)
            self._booked_ahead.add(sample)
            self.stats['entering_fetched'] += 1
            download = self._download_of(sample, urls)
            if download is not None:
                downloads.append(download)
        return downloads

    def _download_in_turn(self, downloads: List[tuple]) -> None:
        """Run ``downloads`` (of one span, or one download) on this thread;
        a span holds its members' keys until each is published."""
        span = downloads[0][3]
        if span is None:
            for download in downloads:
                self._download(*download)
            return
        urls = [url for download in downloads for url in download[1]]
        with self.reader.claimed(span, urls, _ROOM_WAIT):
            for download in downloads:
                span.let_go_if_late()
                self._download(*download)

    def _download(self, sample: int, urls: List[str], size: int,
                  span: Optional[SharedSpan]) -> None:
        """Download ``sample``'s files on this thread (one process), from
        ``span``'s one request when given."""
        start = time.perf_counter()
        total, fetched, sized = 0, 0, True
        error, no_room = None, False
        try:
            for url in urls:
                try:
                    entry = self.reader.fetch(
                        url,
                        size // max(len(urls), 1),
                        wanted=lambda url=url: self._still_needed(sample, url),
                        room_wait=_ROOM_WAIT,
                        span=span)
                except DownloadNotWanted:
                    sized = False
                    continue
                fetched += 1
                with entry:
                    if entry.size is not None:  # downloaded by this call
                        total += entry.size
                        continue
                    try:
                        total += os.path.getsize(entry.path)
                    except FileNotFoundError:
                        # Read and freed already.
                        sized = False
        except CacheBudgetError:
            # No room within _ROOM_WAIT (the budget holds what reads
            # before this one need): no body was read, its reader
            # downloads it on demand, once (and so do the readers of the
            # rest of its span, let go by then: SharedSpan.let_go_if_late).
            no_room = True
        except Exception as failure:  # the reader's own read reports it
            error = (type(failure).__name__, repr(failure))
        self._finished(
            DownloadResult(sample, urls, fetched, total, sized,
                           time.perf_counter() - start, error, no_room))

    def _finished(self, result: DownloadResult) -> None:
        """Book how a download ended (on a thread, or answered by a
        download process)."""
        with self._lock:
            if result.no_room:
                self.stats['no_room'] += 1
            elif result.error is not None:
                self.stats['failed'] += 1
            elif result.fetched:
                self.stats['downloads'] += 1
                self._latency = 0.8 * self._latency + 0.2 * result.seconds
                if result.sized:
                    self._learn_size(result.sample, result.total)
            self._inflight -= 1
            self._downloading.discard(result.sample)
            group = self._group_of.pop(result.sample, None)
            if group is None or group.ended_one():
                self._requests -= 1
        if result.error is not None:
            kind, message = result.error
            self._warn_once(
                kind, f'Remote cache prefetch of {result.urls} failed '
                f'({message}); the DataLoader reads it on demand.')

    def _still_needed(self, sample: int, url: str) -> bool:
        """Whether a download is still wanted when it starts: a reader
        ahead of the plan may have downloaded, read and reported the file
        (the plan freed it) while the download waited for a thread or for
        that reader's download of the same file. The loops' position is
        read afresh: the plan's own lags a round behind, and a reader that
        read the file may have let it go already."""
        position = self._loops_position()
        digest = self.reader.entry_digest(url)
        # A reader's report of its read, not taken by the plan yet.
        reported = self.marks.reported(digest)
        with self._lock:
            if sample in self._booked_ahead:  # for its first read, ahead
                return True
            # The decided reads it is for, none of them behind the loops,
            # and not all of them read by a reader ahead of the plan
            # (reported, or taken and not yet matched to the read it was).
            pending = self._reads.get(sample, 0)
            passed = position is not None and self._last_read.get(
                sample, position) < position
            read = reported or digest in self._read_ahead
            if pending and not passed and (not read or pending > 1):
                return True
            self.stats['read_before_download'] += 1
            return False

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            print_log(message, logger='current', level=logging.WARNING)

    # -- reporting and shutdown ---------------------------------------------

    def status(self) -> dict:
        """Gauges and totals of the prefetcher (plain data)."""
        with self._lock:
            cache = self.planner.cache if self.planner else None
            return dict(
                time=time.time(),
                pid=os.getpid(),
                download_processes=(len(self._processes.workers)
                                    if self._processes else 1),
                download_processes_lost=(self._processes.lost
                                         if self._processes else 0),
                position=self.position,
                planned_to=self.planner.tick if self.planner else 0,
                window=self.window(),
                inflight=self._inflight,
                requests_inflight=self._requests,
                coalesced_requests=(self._round.coalesced
                                    if self._round is not None else 0),
                target_inflight=self.target_inflight(),
                max_inflight=self.max_inflight,
                latency_s=self._latency,
                rate_per_s=self._rate,
                kept_bytes=cache.used if cache else 0,
                keep_capacity=cache.capacity if cache else 0,
                reserve=self.reserve,
                staged_bytes=self._staged_bytes,
                mean_size=self._mean_size,
                entering_pending=(self._entering.pending()
                                  if self._entering else 0),
                **self.stats)

    def write_victims(self, cache_dir: str, most: int = 4096) -> None:
        """Publish the eviction order for the readers' stores."""
        urls = []
        for _, url in self.victims():
            urls.append(url)
            if len(urls) >= most:
                break
        write_victims(cache_dir, urls)

    def write_status(self, cache_dir: str) -> None:
        path = os.path.join(cache_dir, STATUS_FILE)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + '.tmp', 'w') as file:
            json.dump(self.status(), file)
        os.replace(path + '.tmp', path)

    def close(self) -> None:
        """Stop downloading; running downloads finish or are abandoned."""
        if self._processes is not None:
            self._processes.close()
        else:
            self._pool.shutdown(wait=True, cancel_futures=True)
