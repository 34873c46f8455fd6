"""The node store: one bounded cache directory shared by a node's processes.

Every rank and DataLoader worker on a node (separate processes, fork or
spawn; no daemon, no shared memory between them) opens the same
``cache_dir`` with a :class:`NodeStore` and shares its entries and its byte
budget. Entries live in namespaces (``'remote'`` for downloaded objects,
``'head'`` for decoded pipeline heads) under keys the caller builds; the
store hashes a key into a file name and keeps the key itself in its ledger.

Guarantees:

* **Hard budget.** Committed bytes plus in-flight reserved bytes never
  exceed ``cache_limit``: a producer reserves bytes *before* it writes, a
  writer that outgrows its reservation grows it first, and a reservation
  becomes the entry's bytes on publish or is released.
* **No partial entry.** A producer writes a temp file inside ``cache_dir``;
  the store checks its size (and the caller's ``validate``) and renames it
  into place; the entry's ledger row replaces its reservation (which names
  the entry) with the process's next ledger transaction, at most
  ``PUBLISH_DELAY`` later (batched: one transaction per download). A
  ``kill -9`` at any point leaves at most a temp file or a complete entry,
  and the dead writer's reservation; the next reservation by any process
  drops the temp file and adopts the entry (temp and counter files carry
  the writer's ``host:pid:start``; see :mod:`.process_owner`).
* **Single flight.** A per-key byte lock (``fcntl`` open-file-description
  lock on one byte of ``locks/keys.lock``): of all processes that miss the
  same key at once, exactly one produces it, the others wait and read the
  published entry. The kernel drops a dead process's locks, so no stale
  lock ever blocks a later run.
* **Restart reuse.** The ledger (:mod:`.store_ledger`, SQLite in WAL mode)
  persists; a new run sees every entry. Should the ledger be lost, the
  entry files it no longer accounts for are deleted when the store opens.
* **Only its own files.** The store deletes nothing outside its own layout
  and refuses a ``cache_dir`` that holds anything at its top level unless
  it already is a store (marker file ``.mmdata_node_store``).

Layout::

    cache_dir/.mmdata_node_store           marker
    cache_dir/ledger.sqlite(-wal, -shm)    byte ledger
    cache_dir/entries/<namespace>/<d[:2]>/<d>   published entries
    cache_dir/locks/keys.lock               per-key single-flight byte locks
    cache_dir/tmp/<owner>+<uuid>.tmp        writes in flight
    cache_dir/stats/<owner>+<uuid>.counters per-process counters

API (the roles every consumer relies on):

* :meth:`NodeStore.lookup` -- path of a complete entry or None. Hot path of
  a hit: one ``stat``, no lock, no ledger transaction (the access time for
  LRU is remembered in memory and written with the process's next ledger
  transaction). :meth:`NodeStore.read_bytes` reads it in one go.
* :meth:`NodeStore.get_or_produce` -- single-flight produce-and-publish,
  returning a :class:`StoreEntry` (``path``, ``admitted``); with
  ``admit=False`` or when the budget cannot be reserved even after eviction,
  the producer writes a private temp file that the caller reads and then
  ``release()``\\ s (its bytes stay reserved until then), or, given
  ``room_wait``, waits that long for room and publishes.
* :meth:`NodeStore.publish_bytes` -- publish bytes the caller already holds;
  never waits for another producer.
* :meth:`NodeStore.hold_keys` -- the single-flight locks of several keys,
  held across calls and let go one by one (:mod:`.key_locks`), for a
  producer that publishes them in turn from one read (``holds`` of
  :meth:`NodeStore.get_or_produce` and :meth:`NodeStore.produce_into`).
* :meth:`NodeStore.reserve` -- a :class:`Reservation` (context manager);
  raises :class:`CacheBudgetError` when impossible.
* :meth:`NodeStore.produce_into`, :meth:`NodeStore.reserve_entry` and
  :meth:`NodeStore.reserve_for` -- single flight for a producer whose room
  another process may make: it reserves what is free, and the process
  with the eviction policy reserves in its name when nothing is (the node
  prefetcher's download processes).
* :meth:`NodeStore.evict`, :meth:`NodeStore.usage` (:class:`StoreUsage`),
  :meth:`NodeStore.entries`, :meth:`NodeStore.counters`.
* ``eviction_policy(nbytes) -> Iterable[(namespace, key)]``: who to evict to
  free ``nbytes``, called inside the ledger transaction (it may call
  :meth:`NodeStore.entries`); default :meth:`NodeStore.least_recently_used`.
* Counters per namespace, summed over all processes: ``hits``, ``misses``,
  ``produced``, ``waited`` (served after waiting for another producer),
  ``bypassed``, ``evicted_entries``, ``evicted_bytes``; and two that callers
  add with :meth:`NodeStore.count`, since only they know the cost of
  producing: ``produced_bytes`` (e.g. bytes downloaded), ``wait_us``
  (microseconds readers waited for an entry) and ``corrupt`` (productions
  rejected for bytes that failed their checksum).

An entry found by :meth:`lookup` can be evicted by another process before the
caller opens it (POSIX keeps an opened file readable); callers treat
``FileNotFoundError`` on open as a miss (:meth:`read_bytes` does).
"""
import contextlib
import hashlib
import os
import re
import time
import uuid
from typing import (Any, BinaryIO, Callable, Dict, Iterable, Iterator, List,
                    NamedTuple, Optional, Sequence, Tuple, Union)

from .key_locks import KeyHolds, key_lock
from .process_owner import (current_owner, owner_file_name,
                            owner_from_file_name, owner_is_alive,
                            remove_files_of_dead_owners)
from .size_units import format_size, parse_size
from .store_counters import Counts, StoreCounters, merge_counts
from .store_ledger import EntryRow, StoreLedger

MARKER = '.mmdata_node_store'
_NAMESPACE = re.compile(r'^[a-z][a-z0-9_]{0,31}$')
# The file whose bytes are the per-key single-flight locks.
_KEYS_LOCK = 'keys.lock'
_TOUCH_FLUSH = 4096
# Seconds between two looks for what dead processes left (a reservation
# that does not fit looks at once).
_RECLAIM_INTERVAL = 10.0
# Seconds a write waits for room as readers release theirs (and the plan
# evicts what was read), before it fails with CacheBudgetError.
_ROOM_WAIT_SECONDS = 300.0


def default_cache_dir() -> str:
    """The node store used when a config gives no ``cache_dir``.

    ``$MMDATA_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/mmdata_plugin``
    (``~/.cache/mmdata_plugin``): outside any repository or work dir, and
    one per user and node, so every job of a node shares one budget.
    """
    configured = os.environ.get('MMDATA_CACHE_DIR')
    if configured:
        return configured
    cache_home = os.environ.get('XDG_CACHE_HOME') or os.path.join(
        os.path.expanduser('~'), '.cache')
    return os.path.join(cache_home, 'mmdata_plugin')


class CacheBudgetError(RuntimeError):
    """The store cannot reserve the bytes asked for, even after eviction."""


class KeyNotHeld(RuntimeError):
    """A producer holding keys asked to produce one it does not hold (and
    that has no entry): another producer has it, or it went."""


class StoreUsage(NamedTuple):
    """Bytes and entries of a store at one moment."""
    committed_bytes: int
    inflight_bytes: int
    entries: int
    limit: int


class StoreEntry:
    """What :meth:`NodeStore.get_or_produce` returns.

    ``admitted`` is True for a published entry (shared, stays until evicted)
    and False for a private temp file that only the caller sees: read it,
    then call :meth:`release` (or use the entry as a context manager), which
    deletes it and frees its reserved bytes. ``size`` is its bytes when this
    call produced it (None for an entry found or produced by another
    process: ask the file).
    """

    def __init__(self, path: str, admitted: bool,
                 reservation: Optional['Reservation'] = None,
                 size: Optional[int] = None):
        self.path = path
        self.admitted = admitted
        self.size = size
        self._reservation = reservation

    def release(self) -> None:
        if self._reservation is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._reservation.release()
        self._reservation = None

    def __enter__(self) -> 'StoreEntry':
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f'StoreEntry({self.path!r}, admitted={self.admitted})'


class Reservation:
    """Bytes held in the budget for a write in flight.

    Use as a context manager: leaving it releases what was not published.
    """

    def __init__(self, store: 'NodeStore', reservation_id: int, nbytes: int):
        self.store = store
        self.id = reservation_id
        self.nbytes = nbytes
        self.active = True

    def grow(self, nbytes: int) -> None:
        """Hold ``nbytes`` in total (evicting if needed) or raise."""
        if nbytes > self.nbytes:
            self.store._grow(self, nbytes)

    def release(self) -> None:
        if self.active:
            self.store._release(self)

    def __enter__(self) -> 'Reservation':
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class _ReservedWriter:
    """File-like object a producer writes into, kept within its reservation.

    Args:
        file (BinaryIO): The temp file.
        reservation (Reservation): Bytes held for it.
        wait (float): Seconds a growth may wait for room (releases by other
            processes) before :class:`CacheBudgetError`; 0 raises at once.
    """

    def __init__(self, file: BinaryIO, reservation: Reservation,
                 wait: float = 0) -> None:
        self._file = file
        self._reservation = reservation
        self._wait = wait
        self.written = 0

    def _grow(self, nbytes: int) -> None:
        deadline = time.monotonic() + self._wait
        delay = 0.01
        while True:
            try:
                return self._reservation.grow(nbytes)
            except CacheBudgetError:
                if (nbytes > self._reservation.store.limit
                        or time.monotonic() + delay > deadline):
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def will_write(self, nbytes: int) -> None:
        """Hold room for ``nbytes`` in all before writing them (a download
        that knows its length grows once, before its body is read)."""
        if nbytes > self._reservation.nbytes:
            self._grow(nbytes)

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if self.written + size > self._reservation.nbytes:
            # grow by at least a quarter so streaming writes rarely ask
            self._grow(
                max(self.written + size,
                    self._reservation.nbytes + self._reservation.nbytes // 4))
        self._file.write(data)
        self.written += size
        return size

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def flush(self) -> None:
        self._file.flush()


class NodeStore:
    """A bounded cache directory shared by the processes of one node.

    Args:
        cache_dir (str): The directory; created if missing. Must be empty or
            already a store.
        cache_limit (int | str): Hard byte budget, e.g. ``'200GB'`` or
            ``'500MiB'`` (see :func:`~.size_units.parse_size`). Every process
            sharing the directory should pass the same value: each enforces
            its own when it reserves.
        eviction_policy (callable, optional): ``f(nbytes)`` yielding
            ``(namespace, key)`` pairs to evict, best victim first. Defaults
            to :meth:`least_recently_used`.
        temp_max_age (float): Seconds after which a temp file or reservation
            of a process on another host (a store on a shared file system)
            counts as abandoned. Defaults to 6 hours.
    """

    def __init__(self,
                 cache_dir: str,
                 cache_limit: Union[int, str],
                 eviction_policy: Optional[Callable[[int], Iterable[Tuple[
                     str, str]]]] = None,
                 temp_max_age: float = 6 * 3600):
        self.cache_dir = os.path.abspath(os.path.expanduser(str(cache_dir)))
        self.limit = parse_size(cache_limit, 'cache_limit')
        self.eviction_policy = eviction_policy or self.least_recently_used
        self.temp_max_age = temp_max_age
        fresh_ledger = self._claim_directory()
        self._ledger = StoreLedger(os.path.join(self.cache_dir,
                                                'ledger.sqlite'))
        self._counters = StoreCounters(os.path.join(self.cache_dir, 'stats'))
        self._touched: Dict[str, float] = {}
        self._made_dirs = set()
        self._reclaimed_at = 0.0
        with self._ledger.transaction():
            self._reclaim_abandoned()
            if fresh_ledger:
                self._drop_unaccounted_entries()

    def __getstate__(self):
        state = self.__dict__.copy()
        state.update(_touched={}, _made_dirs=set(), _reclaimed_at=0.0)
        return state

    def __repr__(self) -> str:
        return (f'NodeStore({self.cache_dir!r}, '
                f'cache_limit={format_size(self.limit)!r})')

    # -- directory ----------------------------------------------------------

    def _claim_directory(self) -> bool:
        """Make ``cache_dir`` a store; True if its ledger does not exist yet.

        The marker is created before anything else. A concurrent opener
        may still find no marker, then list the directory after the other
        one created the marker and its subdirs: the marker is looked for
        again before the contents count as foreign.
        """
        os.makedirs(self.cache_dir, exist_ok=True)
        marker = os.path.join(self.cache_dir, MARKER)
        if not os.path.isfile(marker):
            foreign = sorted(name for name in os.listdir(self.cache_dir)
                             if name != MARKER)
            if foreign and not os.path.isfile(marker):
                shown = ', '.join(foreign[:5]) + (', ...'
                                                  if len(foreign) > 5 else '')
                raise ValueError(
                    f'cache_dir {self.cache_dir!r} is not empty and is not a '
                    f'node store (no {MARKER} file); it holds: {shown}. The '
                    'store deletes files in its directory, so give it an '
                    'empty or new directory of its own.')
            with contextlib.suppress(FileExistsError):
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        fresh = not os.path.exists(
            os.path.join(self.cache_dir, 'ledger.sqlite'))
        for sub in ('entries', 'locks', 'tmp', 'stats'):
            os.makedirs(os.path.join(self.cache_dir, sub), exist_ok=True)
        os.close(os.open(self._keys_lock_file, os.O_CREAT | os.O_RDWR, 0o644))
        return fresh

    @property
    def _keys_lock_file(self) -> str:
        return f'{self.cache_dir}/locks/{_KEYS_LOCK}'

    @staticmethod
    def _digest(namespace: str, key: str) -> str:
        if not _NAMESPACE.match(namespace or ''):
            raise ValueError(
                f'namespace {namespace!r} must be 1-32 lowercase letters, '
                'digits or "_", starting with a letter')
        if not isinstance(key, str):
            raise TypeError(f'a store key is a str, got {type(key).__name__}')
        return hashlib.sha256(f'{namespace}\0{key}'.encode()).hexdigest()[:40]

    def _entry_path(self, namespace: str, digest: str) -> str:
        # formatted, not os.path.join'ed: asked several times per download
        return f'{self.cache_dir}/entries/{namespace}/{digest[:2]}/{digest}'

    def entry_path(self, namespace: str, key: str) -> str:
        """Where the entry of ``key`` lives when present."""
        return self._entry_path(namespace, self._digest(namespace, key))

    # -- reading ------------------------------------------------------------

    def lookup(self, namespace: str, key: str) -> Optional[str]:
        """Path of the complete entry, else None (counts a hit or a miss)."""
        digest = self._digest(namespace, key)
        path = self._entry_path(namespace, digest)
        if os.path.exists(path):
            self._hit(namespace, digest)
            return path
        self._counters.add(namespace, 'misses')
        return None

    def read_bytes(self,
                   namespace: str,
                   key: str,
                   decode: Optional[Callable[[bytes], Any]] = None) -> Any:
        """The entry's bytes, else None (counts a hit or a miss).

        Args:
            namespace (str): Entry namespace.
            key (str): Entry key.
            decode (callable, optional): Turns the bytes into what is
                returned. A ``ValueError`` from it means the entry is
                damaged: it is evicted (so that the caller's next publish
                replaces it) and the read counts as the miss it was.
        """
        digest = self._digest(namespace, key)
        try:
            with open(self._entry_path(namespace, digest), 'rb') as file:
                data = file.read()
        except FileNotFoundError:
            self._counters.add(namespace, 'misses')
            return None
        if decode is not None:
            try:
                data = decode(data)
            except ValueError:
                self.evict(namespace, key)
                self._counters.add(namespace, 'misses')
                return None
        self._hit(namespace, digest)
        return data

    def _hit(self, namespace: str, digest: str) -> None:
        self._counters.add(namespace, 'hits')
        self._touched[digest] = time.time()
        if len(self._touched) >= _TOUCH_FLUSH:
            with self._ledger.transaction():
                self._flush_touched()

    def _flush_touched(self) -> None:
        if self._touched:
            touched, self._touched = self._touched, {}
            self._ledger.touch(touched)

    # -- producing ----------------------------------------------------------

    def get_or_produce(self,
                       namespace: str,
                       key: str,
                       produce: Callable[[BinaryIO], None],
                       size_hint: int,
                       validate: Optional[Callable[[str], None]] = None,
                       admit: bool = True,
                       room_wait: Optional[float] = None,
                       holds: Optional[KeyHolds] = None) -> StoreEntry:
        """Return the entry of ``key``, producing it once if missing.

        Args:
            namespace (str): Entry namespace.
            key (str): Entry key.
            produce (callable): Writes the entry into the file-like object it
                is given (``write`` only). Raising aborts the entry.
            size_hint (int): Expected size in bytes, reserved before
                ``produce`` runs; a writer that outgrows it grows its
                reservation (or gets :class:`CacheBudgetError`).
            validate (callable, optional): Called with the temp file's path
                once written; raise to reject it (nothing is published).
            admit (bool): False to produce into a private temp file that is
                not published (the planner's bypass).
            room_wait (float, optional): When the budget cannot hold
                ``size_hint`` even after eviction: None produces a private
                temp file for this caller; a number of seconds waits that
                long for room (then :class:`CacheBudgetError`) and
                publishes, for a caller that produces for other readers.
                A write that outgrows ``size_hint`` waits as long for the
                room it needs (``_ROOM_WAIT_SECONDS`` when None).
            holds (KeyHolds, optional): Keys the caller holds (see
                :meth:`hold_keys`) and lets go once this call ends (a retry
                may still need it): a held key is produced without waiting
                for its lock; a key not held is not produced
                (:class:`KeyNotHeld` when it has no entry), so a holder
                never waits for another producer.

        Returns:
            StoreEntry: ``admitted=True``: the published entry;
            ``admitted=False``: a private file to read and ``release()``.
        """
        digest = self._digest(namespace, key)
        path = self._entry_path(namespace, digest)
        if os.path.exists(path):
            self._hit(namespace, digest)
            return StoreEntry(path, admitted=True)
        if holds is not None and not holds.holds(digest):
            raise KeyNotHeld(f'{key}: its lock is not among those held')
        self._counters.add(namespace, 'misses')
        if not admit:
            return self._produce_private(namespace, produce, size_hint,
                                         validate)
        with self._locked(digest, holds):
            if os.path.exists(path):
                self._counters.add(namespace, 'waited')
                return StoreEntry(path, admitted=True)
            entry = (namespace, key, digest)
            try:
                reservation = self._reserve(size_hint, entry=entry)
            except CacheBudgetError:
                if room_wait is None:
                    return self._produce_private(namespace, produce,
                                                 size_hint, validate)
                reservation = self._reserve_waiting(size_hint, room_wait,
                                                    entry)
            with reservation:
                # A write that outgrows the hint waits for the room it needs
                # rather than starting again privately: the bytes are read
                # from the remote once.
                wait = _ROOM_WAIT_SECONDS if room_wait is None else room_wait
                return self._produce_entry(namespace, key, digest, produce,
                                           reservation, validate, wait)

    @contextlib.contextmanager
    def _locked(self, digest: str,
                holds: Optional[KeyHolds]) -> Iterator[None]:
        """The key's lock for a producer: its own, waited for; or, given
        ``holds``, the one held already (the caller lets it go)."""
        if holds is None:
            with self._key_lock(digest):
                yield
            return
        yield

    def _produce_entry(self, namespace: str, key: str, digest: str,
                       produce, reservation: Reservation, validate,
                       wait: float) -> StoreEntry:
        """Write and publish the entry (under its key lock) into
        ``reservation``; a failed ``produce`` leaves the reservation."""
        temp, size = self._write_temp(produce, reservation, validate, wait)
        self._publish(reservation, temp, EntryRow(
            digest, namespace, key, size, time.time()))
        self._counters.add(namespace, 'produced')
        return StoreEntry(self._entry_path(namespace, digest),
                          admitted=True, size=size)

    def produce_into(self,
                     namespace: str,
                     key: str,
                     produce: Callable[[BinaryIO], None],
                     reservation: Reservation,
                     wait: float = 0,
                     holds: Optional[KeyHolds] = None) -> Optional[StoreEntry]:
        """Return the entry of ``key``, producing it once if missing into
        ``reservation`` (from :meth:`reserve_entry`, or from another
        process's :meth:`reserve_for` in this one's name): for a producer
        whose room another process may make (the node prefetcher's
        download processes), which must not hold the key's lock while it
        waits for that (one that holds it already, ``holds``, bounds how
        long: the key's readers wait as long). A write that outgrows the
        reservation waits ``wait`` seconds for room; a ``produce`` that
        raises leaves the reservation to the caller (for another try).
        ``holds`` as for :meth:`get_or_produce`.

        Returns None, producing nothing, when another process was
        producing the key and left no entry, or, given ``holds``, when the
        key is not held and has no entry: whether it is still wanted is
        the caller's to ask (a reader that downloaded it may have read it,
        and the plan freed it). The reservation is released unless used.
        """
        digest = self._digest(namespace, key)
        path = self._entry_path(namespace, digest)
        if holds is not None:
            if holds.holds(digest):  # its lock is had
                return self._produce_free(namespace, key, digest, produce,
                                          reservation, wait)
            reservation.release()
            if os.path.exists(path):
                self._hit(namespace, digest)
                return StoreEntry(path, admitted=True)
            return None
        with self._key_lock(digest, blocking=False) as free:
            if free:
                return self._produce_free(namespace, key, digest, produce,
                                          reservation, wait)
        with self._key_lock(digest):
            reservation.release()
            if os.path.exists(path):
                self._counters.add(namespace, 'waited')
                return StoreEntry(path, admitted=True)
        return None

    def _produce_free(self, namespace: str, key: str, digest: str, produce,
                      reservation: Reservation, wait: float) -> StoreEntry:
        """:meth:`produce_into` under the key's lock, which it has."""
        path = self._entry_path(namespace, digest)
        if os.path.exists(path):
            reservation.release()
            self._hit(namespace, digest)
            return StoreEntry(path, admitted=True)
        self._counters.add(namespace, 'misses')
        return self._produce_entry(namespace, key, digest, produce,
                                   reservation, None, wait)

    def publish_bytes(self, namespace: str, key: str,
                      data: bytes) -> Optional[str]:
        """Publish ``data`` as the entry of ``key`` unless that is pointless.

        For a caller that already computed the entry (the pipeline head
        cache): returns the entry's path, or None without waiting when
        another process is producing the key right now or the budget cannot
        hold it (counted as ``bypassed``).
        """
        digest = self._digest(namespace, key)
        path = self._entry_path(namespace, digest)
        with self._key_lock(digest, blocking=False) as locked:
            if not locked:
                return None
            if os.path.exists(path):
                return path
            try:
                reservation = self._reserve(len(data),
                                            entry=(namespace, key, digest))
            except CacheBudgetError:
                self._counters.add(namespace, 'bypassed')
                return None
            with reservation:
                self._produce_entry(namespace, key, digest,
                                    lambda file: file.write(data),
                                    reservation, None, 0)
        return path

    def _produce_private(self, namespace, produce, size_hint,
                         validate) -> StoreEntry:
        self._counters.add(namespace, 'bypassed')
        reservation = self._reserve_waiting(size_hint)
        try:
            temp, size = self._write_temp(produce, reservation, validate,
                                          wait=_ROOM_WAIT_SECONDS)
        except BaseException:
            reservation.release()
            raise
        return StoreEntry(temp, admitted=False, reservation=reservation,
                          size=size)

    def _reserve_waiting(self, nbytes: int,
                         timeout: float = _ROOM_WAIT_SECONDS,
                         entry: Optional[Tuple[str, str, str]] = None) -> \
            'Reservation':
        """Reserve, first without evicting, then waiting for releases."""
        with contextlib.suppress(CacheBudgetError):
            return self._reserve(nbytes, evict=False, entry=entry)
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                return self._reserve(nbytes, entry=entry)
            except CacheBudgetError:
                if nbytes > self.limit or time.monotonic() > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _write_temp(self, produce, reservation: Reservation, validate,
                    wait: float = 0) -> Tuple[str, int]:
        """The temp file ``produce`` wrote and its size."""
        temp = (f'{self.cache_dir}/tmp/'
                f'{owner_file_name(current_owner(), uuid.uuid4().hex)}.tmp')
        try:
            with open(temp, 'wb') as file:
                writer = _ReservedWriter(file, reservation, wait)
                produce(writer)
                file.flush()
                size = os.fstat(file.fileno()).st_size
            if size != writer.written:
                raise OSError(f'{temp}: {writer.written} bytes written but '
                              f'{size} on disk')
            if validate is not None:
                validate(temp)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        return temp, size

    def _publish(self, reservation: Reservation, temp: str,
                 row: EntryRow) -> None:
        """Rename the temp file ``row`` describes into place; its ledger
        row follows with this process's next transaction (batched). A kill
        before that leaves the reservation, which names this entry, to
        :meth:`_reclaim_abandoned`, which adopts the complete file."""
        final = self._entry_path(row.namespace, row.digest)
        directory = os.path.dirname(final)
        if directory not in self._made_dirs:
            os.makedirs(directory, exist_ok=True)
            self._made_dirs.add(directory)
        try:
            if row.size > reservation.nbytes:
                raise RuntimeError('an entry outgrew its reservation')
            os.rename(temp, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise
        self._ledger.defer_publish(reservation.id, row, final)
        reservation.active = False

    def _key_lock(self, digest: str, blocking: bool = True):
        """The single-flight lock of the key of ``digest`` (see
        :mod:`.key_locks`); yields whether it was taken."""
        return key_lock(self._keys_lock_file, digest, blocking)

    def hold_keys(self, namespace: str, keys: Iterable[str]) -> KeyHolds:
        """The locks of those of ``keys`` that have no entry and that no
        other producer holds, held until let go (one by one, or all when
        the :class:`~.key_locks.KeyHolds` closes): for a producer that will
        publish them in turn from one read, so that their readers wait for
        it rather than read them again. Pass it as ``holds`` to
        :meth:`get_or_produce` or :meth:`produce_into`."""
        holds = KeyHolds(self._keys_lock_file)
        try:
            for key in keys:
                digest = self._digest(namespace, key)
                path = self._entry_path(namespace, digest)
                if os.path.exists(path) or not holds.try_hold(digest):
                    continue
                if os.path.exists(path):  # published before its lock was had
                    holds.let_go(digest)
        except BaseException:
            holds.close()  # no reader may wait for keys nobody will produce
            raise
        return holds

    # -- budget -------------------------------------------------------------

    def reserve(self, nbytes: int, evict: bool = True) -> Reservation:
        """Hold ``nbytes`` of the budget for a write in flight.

        Args:
            nbytes (int): Bytes to hold.
            evict (bool): Evict entries (by ``eviction_policy``) if needed.

        Raises:
            CacheBudgetError: ``nbytes`` does not fit even after eviction.
        """
        return self._reserve(nbytes, evict)

    def _reserve(self, nbytes: int, evict: bool = True,
                 entry: Optional[Tuple[str, str, str]] = None,
                 owner: Optional[str] = None) -> Reservation:
        """:meth:`reserve` for the entry ``(namespace, key, digest)``, in
        the name of ``owner`` (this process when None)."""
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f'cannot reserve {nbytes!r} bytes')
        namespace, key, digest = entry or (None, None, None)
        with self._ledger.transaction():
            if time.monotonic() - self._reclaimed_at > _RECLAIM_INTERVAL:
                self._reclaim_abandoned()
            self._make_room(nbytes, evict)
            reservation_id = self._ledger.insert_reservation(
                owner or current_owner(), nbytes, digest, namespace, key)
        return Reservation(self, reservation_id, nbytes)

    def reserve_entry(self, namespace: str, key: str,
                      nbytes: int) -> Reservation:
        """:meth:`reserve` for the entry of ``key`` (a kill after the
        entry's file is in place leaves what is adopted), for
        :meth:`produce_into`."""
        return self._reserve(nbytes,
                             entry=(namespace, key,
                                    self._digest(namespace, key)))

    def reserve_for(self, owner: str, namespace: str, key: str,
                    nbytes: int) -> Reservation:
        """:meth:`reserve_entry` in the name of the process ``owner`` (as
        :func:`~.process_owner.owner_of` names it) that will write the
        entry with :meth:`produce_into`: its death frees the bytes, and
        adopts the entry if it published it, as if it had reserved them
        itself (:meth:`_reclaim_abandoned`).

        Raises:
            CacheBudgetError: They do not fit even after eviction.
        """
        return self._reserve(nbytes,
                             entry=(namespace, key,
                                    self._digest(namespace, key)),
                             owner=owner)

    def _grow(self, reservation: Reservation, nbytes: int) -> None:
        with self._ledger.transaction():
            self._make_room(nbytes - reservation.nbytes, evict=True)
            self._ledger.resize_reservation(reservation.id, nbytes)
        reservation.nbytes = nbytes

    def _release(self, reservation: Reservation) -> None:
        with self._ledger.transaction():
            self._ledger.delete_reservation(reservation.id)
        reservation.active = False

    def _make_room(self, nbytes: int, evict: bool) -> None:
        """Evict until ``nbytes`` more fit (inside a transaction) or raise."""
        self._flush_touched()
        used = self._ledger.used_bytes()
        missing = used + nbytes - self.limit
        if missing > 0 and time.monotonic() - self._reclaimed_at > 1.0:
            # dead writers' reservations may be what is in the way
            self._reclaim_abandoned()
            used = self._ledger.used_bytes()
            missing = used + nbytes - self.limit
        if missing <= 0:
            return
        if nbytes > self.limit:
            raise CacheBudgetError(
                f'{format_size(nbytes)} cannot fit in cache_limit='
                f'{format_size(self.limit)} of {self.cache_dir}')
        victims = {}
        freed = 0
        if evict:
            for namespace, key in self.eviction_policy(missing):
                row = self._ledger.entry(self._digest(namespace, key))
                # A policy may name an entry twice (two samples that read
                # one file): its bytes are freed once.
                if row is None or row.digest in victims:
                    continue
                victims[row.digest] = row
                freed += row.size
                if freed >= missing:
                    break
        if freed < missing:
            raise CacheBudgetError(
                f'{format_size(nbytes)} do not fit in {self.cache_dir}: '
                f'{format_size(used)} of {format_size(self.limit)} are '
                f'committed or in flight and eviction frees only '
                f'{format_size(freed)}')
        self._ledger.delete_entries(list(victims.values()))
        for row in victims.values():
            self._remove_file(row.namespace, row.digest, row.size)

    def _remove_file(self, namespace: str, digest: str,
                     size: Optional[int]) -> None:
        """Unlink an entry's file; count it evicted when its row went
        (``size``: the row's bytes, None for a file no row accounts)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._entry_path(namespace, digest))
        if size is not None:
            self._counters.add(namespace, 'evicted_entries')
            self._counters.add(namespace, 'evicted_bytes', size)

    def evict(self, namespace: str, key: str) -> int:
        """Remove the entry of ``key``; returns the bytes freed (0 if none)."""
        return self.evict_many(namespace, [key])[0]

    def evict_many(self, namespace: str, keys: Sequence[str]) -> List[int]:
        """Remove the entries of ``keys`` in one ledger transaction; the
        bytes each freed (0 for a key with no entry)."""
        digests = [self._digest(namespace, key) for key in keys]
        freed = []
        with self._ledger.transaction():
            # Three statements for all of them, not three per key.
            rows = self._ledger.entries_of(digests)
            self._ledger.delete_entries(list(rows.values()))
            for digest in digests:
                # (a file the ledger does not account for yet goes too,
                # not counted)
                row = rows.pop(digest, None)
                size = None if row is None else row.size
                self._remove_file(namespace, digest, size)
                freed.append(size or 0)
        return freed

    def least_recently_used(self, nbytes: int) -> Iterator[Tuple[str, str]]:
        """Default eviction policy: entries by last access, oldest first."""
        for row in self._ledger.entries(by_access=True):
            yield row.namespace, row.key

    # -- recovery -----------------------------------------------------------

    def _reclaim_abandoned(self) -> None:
        """Undo what dead processes left (inside a transaction).

        A dead writer's reservation is dropped; if it died between renaming
        its entry into place and committing, the complete entry is adopted
        (its size fits the reservation it replaces). Its temp files and
        counter files go too (counts kept in the ledger).
        """
        self._reclaimed_at = time.monotonic()

        def dead(owner, created):
            return not owner_is_alive(owner, created, self.temp_max_age)

        for row in self._ledger.reservations():
            if not dead(row.owner, row.created):
                continue
            self._ledger.delete_reservation(row.id)
            if row.digest is None or self._ledger.entry(row.digest):
                continue
            path = self._entry_path(row.namespace, row.digest)
            if os.path.exists(path):
                self._ledger.insert_entry(EntryRow(
                    row.digest, row.namespace, row.key,
                    os.path.getsize(path), time.time()))
        remove_files_of_dead_owners(
            os.path.join(self.cache_dir, 'tmp'),
            foreign_max_age=self.temp_max_age,
            unowned=True)

        def counters_dead(name):
            owner = owner_from_file_name(name)
            return owner is not None and dead(owner, time.time())

        self._ledger.add_retired_counters(self._counters.retire(counters_dead))

    def _drop_unaccounted_entries(self) -> None:
        """Delete entry files the (new) ledger does not know (inside a tx)."""
        root = os.path.join(self.cache_dir, 'entries')
        for directory, _, names in os.walk(root):
            for name in names:
                if self._ledger.entry(name) is None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, name))

    # -- reporting ----------------------------------------------------------

    def usage(self) -> StoreUsage:
        """Committed and in-flight bytes, entry count and limit."""
        with self._ledger.transaction():  # one snapshot for all three
            return StoreUsage(self._ledger.committed_bytes(),
                              self._ledger.inflight_bytes(),
                              self._ledger.entry_count(), self.limit)

    def entries(self, namespace: Optional[str] = None) -> List[EntryRow]:
        """The published entries (``digest, namespace, key, size,
        last_access``); usable inside ``eviction_policy``.

        A snapshot taken under the ledger's lock: threads of one process
        share its SQLite connection, and a cursor left open while another
        thread commits on that connection reads garbage.
        """
        with self._ledger.transaction():
            return list(self._ledger.entries(namespace))

    def flush(self) -> None:
        """Write the ledger rows of the entries this process published now
        (they follow within ``PUBLISH_DELAY`` otherwise): for a process
        that leaves by ``os._exit``."""
        self._ledger.flush_published()

    def count(self, namespace: str, name: str, value: int = 1) -> None:
        """Add ``value`` to this process's counter ``name`` of
        ``namespace`` (see ``COUNTER_NAMES`` in :mod:`.store_counters`)."""
        self._counters.add(namespace, name, int(value))

    def counters(self, namespace: Optional[str] = None) -> Counts:
        """Counters summed over every process that used this directory.

        Returns ``{namespace: {counter: value}}`` (or one namespace's dict).
        """
        with self._ledger.transaction():
            # The counter files of dead processes are summed until they are
            # retired into the ledger, so looking for them changes no count:
            # a reader that polls (DataMonitor's reports) looks as seldom as
            # a writer does.
            if time.monotonic() - self._reclaimed_at > _RECLAIM_INTERVAL:
                self._reclaim_abandoned()
            total = merge_counts(self._ledger.retired_counters(),
                                 self._counters.live_counts())
        if namespace is not None:
            return merge_counts({}, {namespace: total.get(namespace, {})
                                     })[namespace]
        return total
