"""A fileio backend that reads remote files through the node cache.

Configured in ``backend_args``, so every transform that reads through
mmengine's fileio (``LoadImageFromFile``, ``LoadAnnotations``, ours) reads
the node's local copy, waits on the download already in flight (the
store's single flight), or downloads the file itself::

    backend_args = dict(
        backend='node_cache',
        remote=dict(backend='http'),    # any fileio backend's arguments
        cache_dir='/local/nvme/cache',  # one per node
        cache_limit='200GB')

Files are the ``'remote'`` namespace of a
:class:`~mmdata_plugin.cache.node_store.NodeStore`, keyed by their path
(the URL). What is kept, and for how long, is the node prefetcher's plan
(:class:`~mmdata_plugin.engine.hooks.RemoteCachePrefetchHook`); without it
the store keeps the most recently read files.
"""
import contextlib
import logging
import os
import time
from typing import (Any, Callable, Dict, Iterator, List, Optional, Tuple,
                    Union)

from mmengine.fileio import get_file_backend
from mmengine.fileio.backends import BaseStorageBackend, register_backend
from mmengine.logging import print_log

from ..cache.node_store import KeyNotHeld, NodeStore, Reservation, StoreEntry
from ..remote.errors import RemoteCorruptError
from ..remote.remote_backend import CORRUPT_ATTEMPTS
from .coalesced_reads import SharedSpan
from .read_once import ReadOnceMarks

#: Store namespace of downloaded files.
NAMESPACE = 'remote'
#: Counter namespace of reads through the backend (hits, misses, wait_us).
READS = 'remote_reads'
#: The running prefetcher's eviction order, for the readers' stores.
VICTIMS_FILE = os.path.join('planner', 'victims.txt')
#: A victims file older than this is a dead prefetcher's.
VICTIMS_MAX_AGE = 10.0
#: Reads of a file evicted between its lookup and its open.
_EVICTED_RETRIES = 3
#: Whether open files can be named by descriptor (Linux's /proc); looked
#: up once, not on every read.
_PROC_FD = os.path.isdir('/proc/self/fd')


class PlannedEviction:
    """Eviction policy of a reader's store: the prefetcher's order first.

    A reader that downloads on demand (the prefetcher lags, or a file the
    plan does not know) may need room. It evicts what the node's prefetcher
    lists as least needed (files no plan needs, then kept samples read
    furthest ahead, never one read within the prefetch window), then, when
    that is not enough or no prefetcher runs, the least recently used.

    Args:
        store (NodeStore): The reader's store.
    """

    def __init__(self, store: NodeStore) -> None:
        self.store = store
        self.path = os.path.join(store.cache_dir, VICTIMS_FILE)

    def planned(self) -> List[str]:
        try:
            if time.time() - os.path.getmtime(self.path) > VICTIMS_MAX_AGE:
                return []
            with open(self.path) as file:
                return file.read().splitlines()
        except FileNotFoundError:
            return []

    def __call__(self, nbytes: int) -> Iterator[Tuple[str, str]]:
        planned = self.planned()
        for url in planned:
            yield NAMESPACE, url
        # Then the least recently used: the listed files may be gone (the
        # list is up to VICTIMS_MAX_AGE old; a dead prefetcher's), and a read
        # must not fail for it. Each entry once (the store counts what it
        # frees by what is yielded).
        listed = set(planned)
        for namespace, key in self.store.least_recently_used(nbytes):
            if namespace != NAMESPACE or key not in listed:
                yield namespace, key


@contextlib.contextmanager
def _pinned(path: str) -> Iterator[Optional[str]]:
    """A path to ``path``'s file that stays valid while in the block
    (None if the file is gone already). The store may evict (unlink) a
    file between a lookup and the caller's open; an open descriptor keeps
    its inode, and Linux's ``/proc/<pid>/fd`` opens it again by name (by
    pid, not ``self``: a subprocess handed the path opens it too)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield None
        return
    try:
        yield f'/proc/{os.getpid()}/fd/{fd}' if _PROC_FD else path
    finally:
        os.close(fd)


class DownloadNotWanted(Exception):
    """A download given up when its turn came: nobody needs the file any
    more (raised by :meth:`RemoteReader.fetch` before any byte is read)."""


def write_victims(cache_dir: str, urls: List[str]) -> None:
    """Publish the prefetcher's eviction order (see :class:`PlannedEviction`)."""
    path = os.path.join(cache_dir, VICTIMS_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + '.tmp', 'w') as file:
        file.write('\n'.join(urls))
    os.replace(path + '.tmp', path)


class RemoteReader:
    """Downloads remote files into a node store.

    Shared by the backend (reads on demand) and the prefetcher (reads
    ahead), so both count the bytes they download the same way.

    Args:
        store (NodeStore): The node store.
        remote (dict, optional): ``backend_args`` of the remote fileio
            backend; None infers it from each path's prefix (``s3://``,
            ``http://``).
        size_hint (int): Bytes reserved for a file whose size is not known
            yet; the store grows the reservation to the bytes written, so
            0 reserves exactly the file's size.
    """

    def __init__(self, store: NodeStore, remote: Optional[dict] = None,
                 size_hint: int = 0) -> None:
        self.store = store
        self.remote_args = dict(remote or {})
        self.size_hint = size_hint
        self._backends: Dict[str, BaseStorageBackend] = {}
        self._unclaimed_said = False

    def remote(self, url: str) -> BaseStorageBackend:
        """The remote backend for ``url``."""
        prefix = url.split('://', 1)[0] if '://' in url else ''
        backend = self._backends.get(prefix)
        if backend is None:
            backend = get_file_backend(url, backend_args=self.remote_args)
            self._backends[prefix] = backend
        return backend

    def entry_path(self, url: str) -> str:
        return self.store.entry_path(NAMESPACE, url)

    def entry_digest(self, url: str) -> str:
        """The name of ``url``'s entry: what its read-once mark, its
        readers' reports and its download's cancel mark are named."""
        return os.path.basename(self.entry_path(url))

    def fetch(self,
              url: str,
              size_hint: Optional[int] = None,
              admit: bool = True,
              wanted: Optional[Callable[[], bool]] = None,
              room_wait: Optional[float] = None,
              span: Optional[SharedSpan] = None) -> StoreEntry:
        """The store entry of ``url``, downloaded once if missing.

        Bytes that fail their checksum (see
        :meth:`~mmdata_plugin.remote.RemoteBackend.download`) are never
        published: counted as ``corrupt`` and downloaded again, up to
        ``CORRUPT_ATTEMPTS`` in all, then :class:`RemoteCorruptError`.

        ``wanted`` is asked when the download would start (after waiting
        for another process producing the same file): False raises
        :class:`DownloadNotWanted` instead of downloading.
        ``room_wait`` seconds are waited for room in a full budget instead
        of downloading a private copy (for a download nobody reads now; see
        :meth:`~mmdata_plugin.cache.node_store.NodeStore.get_or_produce`).
        ``span``: a :class:`~.coalesced_reads.SharedSpan` holding ``url``
        (a tar member), whose one request brings its bytes.
        """
        # A reservation that outgrows the hint is grown while writing.
        hint = min(self.size_hint if size_hint is None else size_hint,
                   self.store.limit)
        produce = self._producer(url, wanted, span)
        try:
            return self._retrying_corrupt(
                lambda: self.store.get_or_produce(
                    NAMESPACE, url, produce, hint, admit=admit,
                    room_wait=room_wait, holds=span and span.holds))
        except KeyNotHeld:
            # Another producer has it (a span's claim let it be).
            raise DownloadNotWanted(url) from None
        finally:
            self._let_go(url, span)

    def _let_go(self, url: str, span: Optional[SharedSpan]) -> None:
        """Release ``url``'s key if ``span`` held it: its readers go on."""
        if span is not None and span.holds is not None:
            span.holds.let_go(self.entry_digest(url))

    @contextlib.contextmanager
    def claimed(self, span: SharedSpan, urls: List[str],
                hold_for: float) -> Iterator[None]:
        """Hold the keys of those of ``span``'s members ``urls`` that have
        no entry and no other producer, at most ``hold_for`` seconds (see
        :meth:`~.coalesced_reads.SharedSpan.claim`), while the span's
        downloads run in the block."""
        holds = None
        try:
            holds = self.store.hold_keys(NAMESPACE, urls)
            span.claim(holds, [
                url for url in urls if holds.holds(self.entry_digest(url))
            ], hold_for)
        except Exception as error:  # e.g. no file descriptor left
            if holds is not None:  # before the downloads: no reader waits
                holds.close()
            self._read_unclaimed(span, error)
        try:
            yield
        finally:
            if holds is not None:
                holds.close()

    def _read_unclaimed(self, span: SharedSpan, error: Exception) -> None:
        """The span is read and produced as before claims (right bytes; a
        reader reaching a member first may read it again): better than
        losing its downloads. Said once per process."""
        if self._unclaimed_said:
            return
        self._unclaimed_said = True
        print_log(
            f'Could not hold the keys of the coalesced request {span.path} '
            f'({error!r}); it is read without them.',
            logger='current',
            level=logging.WARNING)

    def fetch_into(self,
                   url: str,
                   reservation: Reservation,
                   room_wait: float,
                   wanted: Callable[[], bool],
                   span: Optional[SharedSpan] = None) -> Optional[StoreEntry]:
        """:meth:`fetch` into ``reservation`` (see
        :meth:`~mmdata_plugin.cache.node_store.NodeStore.produce_into`);
        None when another process was downloading ``url`` and left no
        entry, or has it now (a member ``span`` did not claim).
        ``wanted``, ``room_wait`` and ``span`` as for :meth:`fetch`; the
        reservation is released unless used."""
        produce = self._producer(url, wanted, span)
        try:
            return self._retrying_corrupt(
                lambda: self.store.produce_into(NAMESPACE, url, produce,
                                                reservation, room_wait,
                                                span and span.holds))
        finally:
            self._let_go(url, span)
            reservation.release()

    def _producer(self, url: str, wanted: Optional[Callable[[], bool]],
                  span: Optional[SharedSpan]):
        """What downloads ``url`` into a store's file."""

        def produce(file) -> None:
            if wanted is not None and not wanted():
                raise DownloadNotWanted(url)
            backend = self.remote(url)
            if span is not None:
                try:
                    file.write(span.member_bytes(url, backend.get))
                finally:
                    # What came from the remote: a coalesced request's
                    # whole span, gaps included, counted once.
                    self.store.count(NAMESPACE, 'produced_bytes',
                                     span.take_read_bytes())
                return
            # Our remote backends stream into the file (and resume a cut
            # body); any other fileio backend hands over the bytes.
            if callable(getattr(backend, 'download', None)):
                backend.download(url, file)
            else:
                file.write(backend.get(url))
            self.store.count(NAMESPACE, 'produced_bytes', file.tell())

        return produce

    def _retrying_corrupt(self, fetch: Callable[[], Any]) -> Any:
        """``fetch()``, again while its bytes fail their checksum (the
        store keeps nothing of them), ``CORRUPT_ATTEMPTS`` times in all."""
        attempts = 1
        while True:
            try:
                return fetch()
            except RemoteCorruptError:
                self.store.count(NAMESPACE, 'corrupt')
                if attempts == CORRUPT_ATTEMPTS:
                    raise
            attempts += 1


@register_backend('node_cache')
class NodeCacheBackend(BaseStorageBackend):
    """Read remote files through a bounded cache shared by the node.

    Args:
        cache_dir (str): Node-local cache directory (empty or already a
            node store).
        cache_limit (int | str): Hard byte budget of the directory, e.g.
            ``'200GB'``; every process of the node must use the same.
        remote (dict, optional): ``backend_args`` of the backend that reads
            the remote files; None infers it from the path prefix.
        size_hint (int): Bytes reserved before a download of unknown size
            (it grows to the bytes written). Defaults to 0.
    """

    def __init__(self,
                 cache_dir: str,
                 cache_limit: Union[int, str],
                 remote: Optional[dict] = None,
                 size_hint: int = 0) -> None:
        self.store = NodeStore(cache_dir, cache_limit)
        self.store.eviction_policy = PlannedEviction(self.store)
        self.reader = RemoteReader(self.store, remote, size_hint)
        self.marks = ReadOnceMarks(self.store.cache_dir)

    @contextlib.contextmanager
    def _local(self, filepath) -> Iterator[str]:
        """A local path holding ``filepath``'s bytes while in the block,
        even if the store evicts the file meanwhile; once read, a file the
        plan does not keep may go."""
        url = str(filepath)
        for _ in range(_EVICTED_RETRIES):
            path = self.store.lookup(NAMESPACE, url)
            if path is not None:
                with _pinned(path) as pinned:
                    if pinned is not None:
                        self.store.count(READS, 'hits')
                        yield pinned
                        self.marks.report_read(os.path.basename(path))
                        return
            start = time.perf_counter()
            with self.reader.fetch(url) as entry, \
                    _pinned(entry.path) as pinned:
                if pinned is None:
                    continue  # evicted as soon as it was published
                self.store.count(READS, 'misses')
                self.store.count(READS, 'wait_us',
                                 (time.perf_counter() - start) * 1e6)
                yield pinned
                if entry.admitted:
                    self.marks.report_read(os.path.basename(entry.path),
                                           waited=True)
                return
        raise FileNotFoundError(
            f'{url}: its node cache copy was evicted before it could be '
            f'opened, {_EVICTED_RETRIES} times (cache_limit too small for '
            'the files read at once?)')

    def get(self, filepath) -> bytes:
        """The file's bytes (from the node cache when it holds them)."""
        with self._local(filepath) as path:
            with open(path, 'rb') as file:
                return file.read()

    def get_text(self, filepath, encoding: str = 'utf-8') -> str:
        return self.get(filepath).decode(encoding)

    @contextlib.contextmanager
    def get_local_path(self, filepath) -> Iterator[str]:
        """A local copy of ``filepath`` (the cache entry itself)."""
        with self._local(filepath) as path:
            yield path

    def exists(self, filepath) -> bool:
        url = str(filepath)
        if self.store.lookup(NAMESPACE, url) is not None:
            return True
        return self.reader.remote(url).exists(url)

    def isfile(self, filepath) -> bool:
        return self.exists(filepath)

    def join_path(self, filepath, *filepaths) -> str:
        url = str(filepath)
        return self.reader.remote(url).join_path(url, *filepaths)

    def stat(self, filepath):
        """Size and ETag of the remote object (what CachedPipelineHead keys
        its entries on), asked of the remote: the cached copy's age says
        nothing about whether the object changed since."""
        url = str(filepath)
        stat = getattr(self.reader.remote(url), 'stat', None)
        if not callable(stat):
            raise TypeError(
                f'the remote backend of {url} '
                f'({type(self.reader.remote(url)).__name__}) has no stat()')
        return stat(url)
