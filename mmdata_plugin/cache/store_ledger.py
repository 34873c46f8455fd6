"""The byte ledger of a node store: a SQLite database in WAL mode.

It holds one row per published entry (size, last access), one row per
in-flight reservation (owner process, bytes, the entry it will become) and
the committed byte total. Every change goes through :meth:`transaction`
(``BEGIN IMMEDIATE``: one writer at a time on the node, readers never
blocked), so a process killed mid-change leaves the ledger as it was before
the change. SQLite releases its locks when a process dies, so no stale lock
can block a later run.

A published entry's row is written with the process's next transaction
(:meth:`StoreLedger.defer_publish`, at most ``PUBLISH_DELAY`` later): its
file is in place and its reservation, committed before the file was
written, names it and holds its bytes until then, so a ``kill -9`` in
between leaves what the store's recovery adopts, and a download costs one
transaction instead of two.

Each process opens its own connection; it is closed before any fork and
reopened on first use, so none crosses a fork. Threads of a process share
it, always under the ledger's lock (a query of one thread never runs inside
another thread's transaction or while it commits).
"""
import contextlib
import multiprocessing.util
import os
import sqlite3
import threading
import time
import weakref
from typing import (Dict, Iterator, List, NamedTuple, Optional, Sequence,
                    Tuple)

# No SQLite connection may cross a fork. SQLite keeps per-process state for
# every open database file (the POSIX locks it believes it holds, the WAL
# index mapping) and a forked child inherits that state without the locks:
# a connection the child opens then skips locks it does not hold, and one it
# closes may checkpoint and delete the WAL under the other processes' feet
# ("database disk image is malformed", "file is not a database"). So before
# any fork (DataLoader workers, the remote-cache prefetch process, ...) every
# ledger of the process is locked, which waits for a transaction or a read
# in another thread to finish, and its connection is closed; the parent and
# the child each reopen one on first use. Only when the forking thread is
# itself inside a transaction can the connection not be closed; the child
# then parks it for good (never uses, never closes it).
_LEDGERS: 'weakref.WeakSet[StoreLedger]' = weakref.WeakSet()
_INHERITED: list = []
_FORK_LOCK_SECONDS = 60
#: Digests per ``IN (...)`` statement (SQLite allows 999 variables in old
#: builds).
_IN_CHUNK = 500
#: What the WAL is cut back to once a checkpoint has emptied it. SQLite's
#: checkpoint every 1000 pages keeps it at about 4 MB, but a reader holding
#: a snapshot during a burst of writes lets it grow, and SQLite reuses a WAL
#: file without shrinking it: without the limit the ledger keeps that size
#: outside ``cache_limit`` for good.
WAL_SIZE_LIMIT = 4 << 20
_HELD_AT_FORK: list = []
#: Seconds a published entry may wait for its row (see
#: :meth:`StoreLedger.defer_publish`); other processes cannot evict it
#: meanwhile, its bytes count as in flight.
PUBLISH_DELAY = 0.05


def _close_before_fork() -> None:
    for ledger in list(_LEDGERS):
        if not ledger._ledger_lock.acquire(timeout=_FORK_LOCK_SECONDS):
            continue  # the child parks it (see _park_inherited_connections)
        _HELD_AT_FORK.append(ledger)
        if ledger._depth == 0:
            # the child forgets them; written here, they are not lost for
            # as long as the parent lives
            ledger.flush_published()
        if (ledger._depth == 0 and ledger._connection is not None
                and ledger._pid == os.getpid()):
            ledger._connection.close()
            ledger._connection = None
            ledger._pid = None


def _release_after_fork_in_parent() -> None:
    while _HELD_AT_FORK:
        _HELD_AT_FORK.pop()._ledger_lock.release()


def _park_inherited_connections() -> None:
    _HELD_AT_FORK.clear()
    for ledger in list(_LEDGERS):
        if ledger._connection is not None:
            _INHERITED.append(ledger._connection)
            ledger._connection = None
            ledger._pid = None
        # a parent thread may have held it at the fork
        ledger._ledger_lock = threading.RLock()
        ledger._depth = 0
    # the parent's to write; their timer threads did not cross the fork
    _PUBLISHED.clear()


def _flush_at_exit() -> None:
    for ledger in list(_LEDGERS):
        with contextlib.suppress(sqlite3.Error):
            ledger.flush_published()


_FLUSH_AT_EXIT_PID: Optional[int] = None


def _flush_at_exit_of_this_process() -> None:
    """Write published rows when this process exits normally: through
    multiprocessing's exit functions, which run at interpreter exit and at
    the end of a multiprocessing child (that skips ``atexit``; they are
    cleared when it starts, so each process registers its own)."""
    global _FLUSH_AT_EXIT_PID
    if _FLUSH_AT_EXIT_PID != os.getpid():
        _FLUSH_AT_EXIT_PID = os.getpid()
        multiprocessing.util.Finalize(None, _flush_at_exit, exitpriority=10)


os.register_at_fork(before=_close_before_fork,
                    after_in_parent=_release_after_fork_in_parent,
                    after_in_child=_park_inherited_connections)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    digest TEXT PRIMARY KEY, namespace TEXT NOT NULL, key TEXT NOT NULL,
    size INTEGER NOT NULL, last_access REAL NOT NULL);
CREATE INDEX IF NOT EXISTS entries_by_access ON entries (last_access);
CREATE TABLE IF NOT EXISTS reservations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL,
    nbytes INTEGER NOT NULL, created REAL NOT NULL,
    digest TEXT, namespace TEXT, key TEXT);
CREATE TABLE IF NOT EXISTS totals (name TEXT PRIMARY KEY, value INTEGER);
INSERT OR IGNORE INTO totals VALUES ('committed', 0);
CREATE TABLE IF NOT EXISTS retired_counters (
    namespace TEXT, name TEXT, value INTEGER,
    PRIMARY KEY (namespace, name));
"""


class EntryRow(NamedTuple):
    """One published entry as the ledger records it."""
    digest: str
    namespace: str
    key: str
    size: int
    last_access: float


class ReservationRow(NamedTuple):
    """One in-flight reservation."""
    id: int
    owner: str
    nbytes: int
    created: float
    digest: Optional[str]
    namespace: Optional[str]
    key: Optional[str]


class _PublishedRows:
    """Entries this process published whose rows are not written yet, of
    one ledger file (shared by every :class:`StoreLedger` of it, so that
    another store object of the directory sees them with its next
    transaction)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # (reservation id, entry row, entry file)
        self.rows: List[Tuple[int, EntryRow, str]] = []
        self.timer: Optional[threading.Timer] = None

    def taken(self) -> List[Tuple[int, EntryRow, str]]:
        with self.lock:
            return list(self.rows)

    def written(self, rows: List[Tuple[int, EntryRow, str]]) -> None:
        done = {reservation_id for reservation_id, _, _ in rows}
        with self.lock:
            self.rows = [row for row in self.rows if row[0] not in done]


#: Ledger file -> this process's published rows not written yet.
_PUBLISHED: Dict[str, _PublishedRows] = {}


class StoreLedger:
    """Connection to ``<cache_dir>/ledger.sqlite``.

    Args:
        path (str): Database file.
    """

    def __init__(self, path: str):
        self.path = path
        self._pid = None
        self._connection = None
        self._ledger_lock = threading.RLock()
        self._depth = 0
        _LEDGERS.add(self)

    def __getstate__(self):
        return {'path': self.path}

    def __setstate__(self, state):
        self.__init__(state['path'])

    @property
    def connection(self) -> sqlite3.Connection:
        """This process's connection (use it under :attr:`lock`)."""
        if self._pid != os.getpid():
            self._connection = self._connect()
            self._pid = os.getpid()
            self._depth = 0
        return self._connection

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path, timeout=120, isolation_level=None,
            check_same_thread=False)
        for attempt in range(50):
            try:
                connection.execute('PRAGMA journal_mode=WAL')
                break
            except sqlite3.OperationalError:  # another process converts it
                time.sleep(0.05 * (attempt + 1))
        connection.execute('PRAGMA synchronous=NORMAL')
        connection.execute(f'PRAGMA journal_size_limit={WAL_SIZE_LIMIT}')
        with self._begin(connection):
            for statement in _SCHEMA.split(';'):
                if statement.strip():
                    connection.execute(statement)
        return connection

    @contextlib.contextmanager
    def _begin(self, connection):
        connection.execute('BEGIN IMMEDIATE')
        try:
            yield connection
        except BaseException:
            connection.execute('ROLLBACK')
            raise
        connection.execute('COMMIT')

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Exclusive write transaction; nested calls join the outer one."""
        with self._ledger_lock:
            connection = self.connection
            if self._depth:
                self._depth += 1
                try:
                    yield connection
                finally:
                    self._depth -= 1
                return
            self._depth = 1
            try:
                with self._begin(connection):
                    written = self._write_published()
                    yield connection
                # kept for the next transaction if this one rolled back
                self._published().written(written)
            finally:
                self._depth = 0

    def _published(self) -> _PublishedRows:
        return _PUBLISHED.setdefault(self.path, _PublishedRows())

    def defer_publish(self, reservation_id: int, row: EntryRow,
                      path: str) -> None:
        """Record the entry ``row`` (its file ``path`` already in place)
        and drop the reservation that held its bytes, with this process's
        next transaction on the ledger or within ``PUBLISH_DELAY`` s."""
        _flush_at_exit_of_this_process()
        published = self._published()
        with published.lock:
            published.rows.append((reservation_id, row, path))
            if published.timer is None:
                published.timer = threading.Timer(
                    PUBLISH_DELAY, self._flush_on_timer, (published, ))
                published.timer.daemon = True
                published.timer.start()

    def flush_published(self) -> None:
        """Write the published entries' rows now."""
        if self._published().rows:
            with self.transaction():
                pass

    def _flush_on_timer(self, published: _PublishedRows) -> None:
        with published.lock:
            published.timer = None
        self.flush_published()

    def _write_published(self) -> List[Tuple[int, EntryRow, str]]:
        """Write the published entries' rows (inside a transaction); the
        ones written. Each replaces its reservation if its file is still
        there (another process may remove a file the ledger did not list
        yet). A reservation the ledger no longer has (the ledger file was
        lost and made anew) leaves a file nothing counts: it goes."""
        rows = self._published().taken()
        for reservation_id, row, path in rows:
            if not self.delete_reservation(reservation_id):
                if self.entry(row.digest) is None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            elif os.path.exists(path):
                self.insert_entry(row)
        return rows

    def _rows(self, sql: str, args=()) -> list:
        """Run one statement under the lock; all its rows."""
        with self._ledger_lock:
            return self.connection.execute(sql, args).fetchall()

    # -- queries (inside or outside a transaction) -------------------------

    def committed_bytes(self) -> int:
        return self._rows(
            "SELECT value FROM totals WHERE name='committed'")[0][0]

    def inflight_bytes(self) -> int:
        return self._rows(
            'SELECT COALESCE(SUM(nbytes), 0) FROM reservations')[0][0]

    def used_bytes(self) -> int:
        """Committed plus in-flight bytes, in one statement (asked on
        every reservation)."""
        return self._rows(
            "SELECT (SELECT value FROM totals WHERE name='committed') + "
            '(SELECT COALESCE(SUM(nbytes), 0) FROM reservations)')[0][0]

    def entry_count(self) -> int:
        return self._rows('SELECT COUNT(*) FROM entries')[0][0]

    def entry(self, digest: str) -> Optional[EntryRow]:
        rows = self._rows('SELECT * FROM entries WHERE digest=?', (digest, ))
        return EntryRow(*rows[0]) if rows else None

    def entries_of(self, digests: Sequence[str]) -> Dict[str, EntryRow]:
        """The entries of ``digests`` that exist, by digest (one statement
        per ``_IN_CHUNK`` digests)."""
        found = {}
        for first in range(0, len(digests), _IN_CHUNK):
            chunk = digests[first:first + _IN_CHUNK]
            marks = ','.join('?' * len(chunk))
            for row in self._rows(
                    f'SELECT * FROM entries WHERE digest IN ({marks})',
                    tuple(chunk)):
                entry = EntryRow(*row)
                found[entry.digest] = entry
        return found

    def entries(self, namespace: Optional[str] = None,
                by_access: bool = False) -> Iterator[EntryRow]:
        query = 'SELECT * FROM entries'
        args = ()
        if namespace is not None:
            query += ' WHERE namespace=?'
            args = (namespace, )
        if by_access:
            query += ' ORDER BY last_access'
        # taken whole under the lock: no cursor stays open across commits
        for row in self._rows(query, args):
            yield EntryRow(*row)

    def reservations(self) -> List[ReservationRow]:
        return [
            ReservationRow(*row)
            for row in self._rows('SELECT * FROM reservations')
        ]

    def reservation_bytes(self, reservation_id: int) -> Optional[int]:
        rows = self._rows('SELECT nbytes FROM reservations WHERE id=?',
                          (reservation_id, ))
        return rows[0][0] if rows else None

    def retired_counters(self) -> Dict[str, Dict[str, int]]:
        counts: Dict[str, Dict[str, int]] = {}
        for namespace, name, value in self._rows(
                'SELECT * FROM retired_counters'):
            counts.setdefault(namespace, {})[name] = value
        return counts

    # -- changes (inside a transaction) ------------------------------------

    def add_committed(self, delta: int) -> None:
        self._rows("UPDATE totals SET value=value+? WHERE name='committed'",
                   (delta, ))

    def insert_entry(self, row: EntryRow) -> None:
        """Insert or replace an entry, keeping the committed total right
        (two statements: one per download, so each counts)."""
        with self._ledger_lock:
            self._rows(
                "UPDATE totals SET value=value+?-COALESCE((SELECT size FROM "
                "entries WHERE digest=?), 0) WHERE name='committed'",
                (row.size, row.digest))
            self._rows('INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?)',
                       row)

    def delete_entries(self, rows: Sequence[EntryRow]) -> int:
        """Delete the entries ``rows``, read in this transaction (so all of
        them exist: nobody else writes in it); their total size."""
        with self._ledger_lock:
            deleted = self.connection.executemany(
                'DELETE FROM entries WHERE digest=?',
                [(row.digest, ) for row in rows]).rowcount
            if deleted != len(rows):
                raise RuntimeError(
                    f'{self.path}: {len(rows) - deleted} of {len(rows)} '
                    'entries read in this transaction were gone')
            total = sum(row.size for row in rows)
            if total:
                self.add_committed(-total)
            return total

    def touch(self, accesses: Dict[str, float]) -> None:
        with self._ledger_lock:
            self.connection.executemany(
                'UPDATE entries SET last_access=max(last_access, ?) '
                'WHERE digest=?', [(t, d) for d, t in accesses.items()])

    def insert_reservation(self, owner: str, nbytes: int,
                           digest: Optional[str], namespace: Optional[str],
                           key: Optional[str]) -> int:
        with self._ledger_lock:
            cursor = self.connection.execute(
                'INSERT INTO reservations (owner, nbytes, created, digest, '
                'namespace, key) VALUES (?, ?, ?, ?, ?, ?)',
                (owner, nbytes, time.time(), digest, namespace, key))
            return cursor.lastrowid

    def resize_reservation(self, reservation_id: int, nbytes: int) -> None:
        self._rows('UPDATE reservations SET nbytes=? WHERE id=?',
                   (nbytes, reservation_id))

    def delete_reservation(self, reservation_id: int) -> bool:
        """Delete a reservation's row; whether it was there."""
        with self._ledger_lock:
            return self.connection.execute(
                'DELETE FROM reservations WHERE id=?',
                (reservation_id, )).rowcount > 0

    def add_retired_counters(self, counts: Dict[str, Dict[str, int]]) -> None:
        with self._ledger_lock:
            self.connection.executemany(
                'INSERT INTO retired_counters VALUES (?, ?, ?) '
                'ON CONFLICT (namespace, name) DO UPDATE SET value=value+?',
                [(namespace, name, value, value)
                 for namespace, values in counts.items()
                 for name, value in values.items() if value])
