"""NodeStore: single flight, kill -9 safety, hard budget, restart reuse."""
import multiprocessing
import os
import os.path as osp
import signal
import sqlite3
import threading
import time

import pytest
from helpers import key_locked_elsewhere

from mmdata_plugin.cache import (CacheBudgetError, NodeStore, format_size,
                                 parse_size)
from mmdata_plugin.cache.node_store import KeyNotHeld

_FORK = multiprocessing.get_context('fork')


def _payload(key: str, size: int = 2000) -> bytes:
    return (key.encode() * (size // max(len(key), 1) + 1))[:size]


def _store_files_bytes(cache_dir: str) -> int:
    """Bytes of entries and temp files on disk (what the budget covers)."""
    total = 0
    for sub in ('entries', 'tmp'):
        for directory, _, names in os.walk(osp.join(cache_dir, sub)):
            for name in names:
                try:
                    total += os.path.getsize(osp.join(directory, name))
                except FileNotFoundError:
                    pass
    return total


def _produce_keys(cache_dir, limit, keys, log_path, barrier):
    store = NodeStore(cache_dir, limit)
    barrier.wait()
    for key in keys:

        def produce(file, key=key):
            with open(log_path, 'a') as log:
                log.write(key + '\n')
            time.sleep(0.02)  # widen the race window
            file.write(_payload(key))

        entry = store.get_or_produce('remote', key, produce, 2000)
        with open(entry.path, 'rb') as file:
            assert file.read() == _payload(key)


def test_bytes_written_past_the_writer_are_refused(tmp_path):
    # The writer keeps the file within its reservation by counting what it
    # is given; bytes that reach the file another way are not accounted
    # for, so the entry is refused rather than published.
    store = NodeStore(str(tmp_path / 'cache'), 10_000)

    def produce(writer):
        writer.write(b'x' * 100)
        writer._file.write(b'y' * 50)  # not through the writer

    with pytest.raises(OSError, match=r'100 bytes written but 150 on disk'):
        store.get_or_produce('remote', 'k', produce, 1000)
    assert not osp.exists(store.entry_path('remote', 'k'))
    assert _store_files_bytes(str(tmp_path / 'cache')) == 0
    usage = store.usage()
    assert usage.committed_bytes + usage.inflight_bytes == 0


def test_ledger_wal_shrinks_back_after_a_burst(tmp_path):
    # The ledger lives beside the entries, outside cache_limit: its WAL must
    # come back to its documented bound once a reader that held it open
    # (so that no checkpoint could empty it) is done.
    from mmdata_plugin.cache.store_ledger import WAL_SIZE_LIMIT
    cache_dir = str(tmp_path / 'cache')
    store = NodeStore(cache_dir, 10**9)
    store.publish_bytes('remote', 'first', b'x')
    wal = osp.join(cache_dir, 'ledger.sqlite-wal')
    reader = sqlite3.connect(osp.join(cache_dir, 'ledger.sqlite'))
    reader.execute('BEGIN')
    reader.execute('SELECT count(*) FROM entries').fetchall()
    key = 'k' * 2000  # large rows: a short burst outgrows the bound
    for index in range(1500):
        store.publish_bytes('remote', f'{key}{index}', b'x')
    assert os.path.getsize(wal) > 2 * WAL_SIZE_LIMIT
    reader.execute('COMMIT')
    reader.close()
    for index in range(1500):
        store.publish_bytes('remote', f'after{index}', b'x')
    assert os.path.getsize(wal) <= WAL_SIZE_LIMIT


def test_parse_size():
    assert parse_size('200GB') == 200 * 10**9
    assert parse_size('500MiB') == 500 * 2**20
    assert parse_size('1.5 gb') == 1_500_000_000
    assert parse_size(1234) == 1234
    with pytest.raises(ValueError, match='cache_limit'):
        parse_size('12 parsecs', 'cache_limit')
    with pytest.raises(ValueError, match='>= 0'):
        parse_size(-1)
    assert format_size(3 * 2**20) == '3.0 MiB'


@pytest.mark.compat
def test_single_flight_across_processes(tmp_path):
    cache_dir = str(tmp_path / 'store')
    log_path = str(tmp_path / 'produced.log')
    keys = [f'k{i}' for i in range(8)]
    barrier = _FORK.Barrier(4)
    workers = [
        _FORK.Process(target=_produce_keys,
                      args=(cache_dir, '10MB', keys[i:] + keys[:i], log_path,
                            barrier)) for i in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    with open(log_path) as log:
        produced = log.read().split()
    assert sorted(produced) == sorted(keys)  # exactly one produce per key
    store = NodeStore(cache_dir, '10MB')
    counts = store.counters('remote')
    assert counts['produced'] == len(keys)
    assert counts['hits'] + counts['waited'] == 3 * len(keys)
    # The keys' locks are bytes of one empty file: no file per key.
    assert os.listdir(osp.join(cache_dir, 'locks')) == ['keys.lock']
    assert os.path.getsize(osp.join(cache_dir, 'locks', 'keys.lock')) == 0


def test_key_locks_exclude_threads_of_one_process(tmp_path):
    store = NodeStore(str(tmp_path / 'store'), '10MB')
    with key_locked_elsewhere(store, 'ab' * 20):
        with store._key_lock('ab' * 20, blocking=False) as locked:
            assert not locked  # the other thread holds the key
        with store._key_lock('cd' * 20, blocking=False) as locked:
            assert locked  # another key's byte is free
    with store._key_lock('ab' * 20, blocking=False) as locked:
        assert locked  # released when the holder closed its description


def test_held_keys_are_let_go_one_by_one(tmp_path):
    # A coalesced request holds its members' keys from before its read and
    # lets each go once that member is published.
    store = NodeStore(str(tmp_path / 'store'), '10MB')
    store.get_or_produce('remote', 'present', lambda f: f.write(b'p'), 1)
    keys = ['a', 'b', 'c', 'present']
    digests = {key: store._digest('remote', key) for key in keys}

    def free(key):
        with store._key_lock(digests[key], blocking=False) as locked:
            return locked

    with key_locked_elsewhere(store, digests['c']):  # another producer
        holds = store.hold_keys('remote', keys)
        # present and c are not the holder's to produce
        assert sorted(holds.held()) == sorted([digests['a'], digests['b']])
    assert not free('a') and not free('b') and free('c')
    # A key not held, with no entry: never waited for, never produced.
    with pytest.raises(KeyNotHeld):
        store.get_or_produce('remote', 'c', lambda f: f.write(b'c'), 1,
                             holds=holds)
    reservation = store.reserve_entry('remote', 'c', 1)
    assert store.produce_into('remote', 'c', lambda f: f.write(b'c'),
                              reservation, holds=holds) is None
    assert store.usage().inflight_bytes == 0  # its reservation went back
    assert store.lookup('remote', 'c') is None
    # A held key is produced without waiting for its own lock.
    entry = store.get_or_produce('remote', 'a', lambda f: f.write(b'aa'), 2,
                                 holds=holds)
    assert open(entry.path, 'rb').read() == b'aa'
    assert not free('a')  # still held until let go
    holds.let_go(digests['a'])
    assert free('a') and not free('b')
    reservation = store.reserve_entry('remote', 'b', 1)
    entry = store.produce_into('remote', 'b', lambda f: f.write(b'b'),
                               reservation, holds=holds)
    assert open(entry.path, 'rb').read() == b'b'
    holds.close()
    assert free('b')
    assert holds.held() == [] and not holds.try_hold(digests['a'])


def _try_key(cache_dir, result, digest='ab' * 20):
    with NodeStore(cache_dir, '10MB')._key_lock(digest,
                                                blocking=False) as locked:
        result.put(locked)


@pytest.mark.parametrize('held', [False, True])
def test_a_forked_child_does_not_keep_a_key_lock_it_inherited(
        tmp_path, held):
    # The child gets a copy of the holder's descriptor; were it kept, the
    # key would stay locked for every process until the child exits. The
    # same for keys held across calls (a coalesced request's).
    cache_dir = str(tmp_path / 'store')
    store = NodeStore(cache_dir, '10MB')
    context = multiprocessing.get_context('fork')
    result = context.Queue()
    started = context.Event()
    digest = store._digest('remote', 'x') if held else 'ab' * 20
    lock = store.hold_keys('remote', ['x']) if held else store._key_lock(
        digest)
    with lock as locked:
        assert locked
        child = context.Process(target=_hold_inherited, args=(started, ))
        child.start()
        assert started.wait(30)
        probe = context.Process(target=_try_key,
                                args=(cache_dir, result, digest))
        probe.start()
        assert result.get(timeout=30) is False  # still ours
        probe.join(30)
    probe = context.Process(target=_try_key, args=(cache_dir, result, digest))
    probe.start()
    try:
        assert result.get(timeout=30) is True  # the child let go of it
    finally:
        probe.join(30)
        child.kill()
        child.join(30)


def _hold_inherited(started):
    started.set()
    time.sleep(60)


def _write_then_hang(cache_dir, started):

    def produce(file):
        file.write(b'x' * 1000)
        file.flush()
        started.set()
        time.sleep(60)

    NodeStore(cache_dir, 100_000).get_or_produce('remote', 'k', produce, 5000)


def _kill_after_rename(cache_dir):
    real_rename = os.rename

    def rename_then_die(src, dst):
        real_rename(src, dst)
        os.kill(os.getpid(), signal.SIGKILL)  # before the ledger commits

    os.rename = rename_then_die
    NodeStore(cache_dir, 100_000).get_or_produce(
        'remote', 'k', lambda file: file.write(_payload('k')), 2000)


def test_kill_mid_write_leaves_no_entry_and_is_cleaned(tmp_path):
    cache_dir = str(tmp_path / 'store')
    started = _FORK.Event()
    writer = _FORK.Process(target=_write_then_hang, args=(cache_dir, started))
    writer.start()
    assert started.wait(30)
    os.kill(writer.pid, signal.SIGKILL)
    writer.join(10)
    assert len(os.listdir(osp.join(cache_dir, 'tmp'))) == 1
    store = NodeStore(cache_dir, 100_000)  # opening reclaims
    assert store.lookup('remote', 'k') is None
    assert os.listdir(osp.join(cache_dir, 'tmp')) == []
    assert store.usage().inflight_bytes == 0
    entry = store.get_or_produce('remote', 'k',
                                 lambda file: file.write(_payload('k')), 2000)
    with open(entry.path, 'rb') as file:
        assert file.read() == _payload('k')
    assert store.usage()[:3] == (2000, 0, 1)


def test_kill_between_rename_and_commit_adopts_complete_entry(tmp_path):
    cache_dir = str(tmp_path / 'store')
    writer = _FORK.Process(target=_kill_after_rename, args=(cache_dir, ))
    writer.start()
    writer.join(30)
    assert writer.exitcode == -signal.SIGKILL
    store = NodeStore(cache_dir, 100_000)
    assert store.usage()[:3] == (2000, 0, 1)  # adopted, within budget
    assert store.read_bytes('remote', 'k') == _payload('k')


def _publish_then_die(cache_dir, keys):
    store = NodeStore(cache_dir, 100_000)
    for key in keys:
        store.get_or_produce('remote', key,
                             lambda file, key=key: file.write(_payload(key)),
                             2000)
    # before the ledger writes the entries' rows (a timer, PUBLISH_DELAY on)
    os.kill(os.getpid(), signal.SIGKILL)


def test_kill_before_the_batched_rows_are_written_adopts_every_entry(
        tmp_path):
    cache_dir = str(tmp_path / 'store')
    keys = [f'k{i}' for i in range(5)]
    writer = _FORK.Process(target=_publish_then_die, args=(cache_dir, keys))
    writer.start()
    writer.join(30)
    assert writer.exitcode == -signal.SIGKILL
    store = NodeStore(cache_dir, 100_000)
    assert store.usage()[:3] == (10_000, 0, 5)  # adopted, within budget
    for key in keys:
        assert store.read_bytes('remote', key) == _payload(key)
    assert _store_files_bytes(cache_dir) == 10_000


def test_a_produced_entry_tells_its_size_without_a_stat(tmp_path):
    store = NodeStore(str(tmp_path / 'store'), 10_000)
    produced = store.get_or_produce('remote', 'k',
                                    lambda file: file.write(b'x' * 1234), 10)
    private = store.get_or_produce('remote', 'p',
                                   lambda file: file.write(b'y' * 99), 10,
                                   admit=False)
    found = store.get_or_produce('remote', 'k', None, 10)
    assert (produced.size, private.size, found.size) == (1234, 99, None)
    private.release()


def _publish_then_wait(cache_dir, done, stop):
    store = NodeStore(cache_dir, 100_000)
    store.get_or_produce('remote', 'k', lambda file: file.write(_payload('k')),
                         2000)
    done.set()
    stop.wait(30)  # no further ledger transaction of this process


def test_a_publish_costs_one_transaction_and_its_row_follows_alone(
        tmp_path):
    cache_dir = str(tmp_path / 'store')
    store = NodeStore(cache_dir, 1_000_000)
    statements = []
    store._ledger.connection.set_trace_callback(statements.append)
    for i in range(20):
        store.get_or_produce('remote', f'k{i}',
                             lambda file: file.write(_payload('k')), 2000)
    # one reservation each; the entry rows join the next one
    assert statements.count('BEGIN IMMEDIATE') <= 21
    assert store.usage()[:3] == (40_000, 0, 20)
    # an idle publisher's rows are written within PUBLISH_DELAY
    done, stop = _FORK.Event(), _FORK.Event()
    idle = _FORK.Process(target=_publish_then_wait,
                         args=(str(tmp_path / 'idle'), done, stop))
    idle.start()
    try:
        assert done.wait(30)
        reader = NodeStore(str(tmp_path / 'idle'), 100_000)
        deadline = time.monotonic() + 10
        while reader.usage().entries == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reader.usage()[:3] == (2000, 0, 1)
    finally:
        stop.set()
        idle.join(30)


def _fill_randomly(cache_dir, limit, seed, barrier):
    store = NodeStore(cache_dir, limit)
    barrier.wait()
    for i in range(40):
        size = 1000 + (seed * 7919 + i * 104729) % 9000
        key = f'{seed}-{i}'

        def produce(file, size=size):
            for _ in range(4):  # a streaming writer that grows its reservation
                file.write(b'y' * (size // 4))

        entry = store.get_or_produce('remote', key, produce, size // 2,
                                     admit=i % 5 != 0)
        entry.release()


@pytest.mark.compat
def test_budget_never_exceeded_including_inflight(tmp_path):
    cache_dir = str(tmp_path / 'store')
    limit = 30_000
    NodeStore(cache_dir, limit)
    barrier = _FORK.Barrier(4)
    workers = [
        _FORK.Process(target=_fill_randomly,
                      args=(cache_dir, limit, seed, barrier))
        for seed in range(3)
    ]
    for worker in workers:
        worker.start()
    barrier.wait()
    store = NodeStore(cache_dir, limit)
    peak = 0
    while any(worker.is_alive() for worker in workers):
        usage = store.usage()
        assert usage.committed_bytes + usage.inflight_bytes <= limit
        # holding the ledger's write lock freezes publishes and evictions, so
        # the walk sees one moment; writers only write within reservations
        with store._ledger.transaction():
            peak = max(peak, _store_files_bytes(cache_dir))
        assert peak <= limit
        time.sleep(0.005)  # let the writers have the ledger
    for worker in workers:
        assert worker.exitcode == 0
    usage = store.usage()
    assert usage.inflight_bytes == 0
    assert usage.committed_bytes == _store_files_bytes(cache_dir) <= limit
    counts = store.counters('remote')
    assert counts['evicted_entries'] > 0 and counts['bypassed'] >= 24


@pytest.mark.compat
def test_restart_reuses_entries(tmp_path):
    cache_dir = str(tmp_path / 'store')
    store = NodeStore(cache_dir, '1MB')
    for key in ('a', 'b'):
        store.publish_bytes('head', key, _payload(key))
    reopened = NodeStore(cache_dir, '1MB')
    assert reopened.read_bytes('head', 'a') == _payload('a')
    assert reopened.usage()[:3] == (4000, 0, 2)
    calls = []
    reopened.get_or_produce('head', 'b', calls.append, 10)
    assert calls == []


def test_lost_ledger_drops_unaccounted_entries(tmp_path):
    cache_dir = str(tmp_path / 'store')
    NodeStore(cache_dir, '1MB').publish_bytes('head', 'a', b'abc')
    for name in os.listdir(cache_dir):
        if name.startswith('ledger.sqlite'):
            os.unlink(osp.join(cache_dir, name))
    store = NodeStore(cache_dir, '1MB')
    assert store.lookup('head', 'a') is None
    assert store.usage().committed_bytes == 0 == _store_files_bytes(cache_dir)


def test_refuses_foreign_directory(tmp_path):
    foreign = tmp_path / 'data'
    foreign.mkdir()
    (foreign / 'train.txt').write_text('precious')
    with pytest.raises(ValueError, match='train.txt'):
        NodeStore(str(foreign), '1MB')
    assert (foreign / 'train.txt').read_text() == 'precious'
    empty = tmp_path / 'empty'
    empty.mkdir()
    NodeStore(str(empty), '1MB')
    NodeStore(str(empty), '1MB')  # already a store


def test_opener_racing_another_on_a_new_directory(tmp_path, monkeypatch):
    # Ranks open a new cache_dir together: one finds no marker, then lists
    # the directory after the other created the marker and its subdirs.
    cache_dir = tmp_path / 'new'
    cache_dir.mkdir()
    listdir = os.listdir

    def other_opener_first(path):
        monkeypatch.setattr(os, 'listdir', listdir)
        NodeStore(str(cache_dir), '1MB')
        return listdir(path)

    monkeypatch.setattr(os, 'listdir', other_opener_first)
    NodeStore(str(cache_dir), '1MB')
    assert os.listdir is listdir  # the other opener did run in between


def test_a_victim_named_twice_is_freed_once(tmp_path):
    # Two samples that read one file: the plan's policy may name it twice.
    store = NodeStore(str(tmp_path / 'store'), 1000)
    store.publish_bytes('remote', 'a', _payload('a', 400))
    store.publish_bytes('remote', 'b', _payload('b', 400))
    store.eviction_policy = lambda nbytes: iter([('remote', 'a'),
                                                 ('remote', 'a'),
                                                 ('remote', 'b')])
    with store.reserve(700):
        usage = store.usage()
        assert usage.committed_bytes + usage.inflight_bytes <= 1000
    assert store.lookup('remote', 'b') is None


def test_lru_eviction_and_custom_policy(tmp_path):
    store = NodeStore(str(tmp_path / 'store'), 3000)
    for key in 'abc':
        store.publish_bytes('head', key, _payload(key, 1000))
    store.read_bytes('head', 'a')  # b is now the least recently used
    store.publish_bytes('head', 'd', _payload('d', 1000))
    assert [store.lookup('head', k) is not None for k in 'abcd'] == \
        [True, False, True, True]
    store.eviction_policy = lambda nbytes: iter([('head', 'd')])
    store.publish_bytes('head', 'e', _payload('e', 1000))
    assert store.lookup('head', 'd') is None
    assert store.lookup('head', 'a') is not None
    store.eviction_policy = lambda nbytes: iter([])
    with pytest.raises(CacheBudgetError, match='do not fit'):
        store.reserve(10)
    with pytest.raises(CacheBudgetError, match='cannot fit'):
        store.reserve(5000)


def test_validation_failure_publishes_nothing(tmp_path):
    store = NodeStore(str(tmp_path / 'store'), '1MB')

    def reject(path):
        raise ValueError(f'bad checksum for {path}')

    with pytest.raises(ValueError, match='checksum'):
        store.get_or_produce('remote', 'k', lambda f: f.write(b'zz'), 2,
                             validate=reject)
    assert store.lookup('remote', 'k') is None
    assert store.usage()[:2] == (0, 0)
    assert os.listdir(osp.join(store.cache_dir, 'tmp')) == []


def test_bypass_private_file_counts_until_released(tmp_path):
    store = NodeStore(str(tmp_path / 'store'), '1MB')
    entry = store.get_or_produce('remote', 'k', lambda f: f.write(b'q' * 99),
                                 99, admit=False)
    assert not entry.admitted and store.lookup('remote', 'k') is None
    assert store.usage().inflight_bytes == 99
    with entry:
        with open(entry.path, 'rb') as file:
            assert file.read() == b'q' * 99
    assert not osp.exists(entry.path)
    assert store.usage().inflight_bytes == 0


@pytest.mark.parametrize('size_hint, room_wait', [(0, None), (1000, 5.0)])
def test_a_write_into_a_full_budget_waits_for_room(tmp_path, size_hint,
                                                    room_wait):
    # With the budget held by what no policy may evict: a download of
    # unknown size (hint 0) outgrows its reservation and its growth waits
    # for room (it used to start again into a private file: a second
    # download); a producer for other readers (room_wait, the prefetcher)
    # waits for its reservation instead of producing a private copy.
    # Either is produced once and published.
    store = NodeStore(str(tmp_path / 'c'), 3000,
                      eviction_policy=lambda nbytes: iter(()))
    held = store.reserve(2500)
    threading.Timer(0.3, held.release).start()
    data = _payload('late', 1000)
    produced = []

    def produce(file):
        produced.append(1)
        file.write(data)

    with store.get_or_produce('remote', 'late', produce, size_hint,
                              room_wait=room_wait) as entry:
        assert entry.admitted
    assert produced == [1]
    assert store.read_bytes('remote', 'late') == data
    assert store.usage().inflight_bytes == 0
    assert store.counters('remote')['bypassed'] == 0


def test_threads_share_one_store(tmp_path):
    store = NodeStore(str(tmp_path / 'store'), '1MB')
    produced = []

    def produce(file):
        produced.append(1)
        time.sleep(0.05)
        file.write(b'v' * 10)

    threads = [
        threading.Thread(target=store.get_or_produce,
                         args=('remote', 'k', produce, 10)) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(produced) == 1
    with pytest.raises(ValueError, match='namespace'):
        store.lookup('Bad/Name', 'k')
    assert isinstance(store._ledger.connection, sqlite3.Connection)


def _fork_child_uses_store(cache_dir, limit, prefix, rounds, errors):
    try:
        store = NodeStore(cache_dir, limit)
        for i in range(rounds):
            key = f'{prefix}-{i}'
            store.get_or_produce('remote', key,
                                 lambda f, key=key: f.write(_payload(key)),
                                 2000)
            store.usage()
    except BaseException as error:  # reported to the parent
        errors.put(repr(error))
        raise


def test_fork_while_threads_use_the_store(tmp_path):
    """Processes forked while another thread of the parent writes the store
    (the prefetch process, DataLoader workers) keep the ledger sound: no
    SQLite connection or lock state crosses the fork (on the code before
    the fix a child hung on 'database is locked' and never exited; the
    benchmark's DataLoader workers got 'disk I/O error' / 'database disk
    image is malformed')."""
    cache_dir = str(tmp_path / 'store')
    limit = 400 * 2000
    store = NodeStore(cache_dir, limit)
    stop = threading.Event()
    thread_errors = []
    writing = threading.Barrier(3)

    def writer(name):
        i = 0
        try:
            while not stop.is_set():
                key = f'{name}-{i % 150}'
                store.get_or_produce(
                    'remote', key, lambda f, key=key: f.write(_payload(key)),
                    2000)
                store.usage()
                if i == 0:
                    writing.wait()
                i += 1
        except BaseException as error:
            thread_errors.append(error)

    threads = [
        threading.Thread(target=writer, args=(f't{n}', )) for n in range(2)
    ]
    for thread in threads:
        thread.start()
    # Fork once both threads write in a loop: one CI run saw the first
    # child, forked while the threads were still on their first write,
    # never exit (not reproduced in 24 runs since, under load or not).
    writing.wait(60)
    errors = _FORK.Queue()
    children = []
    try:
        for n in range(6):
            child = _FORK.Process(target=_fork_child_uses_store,
                                  args=(cache_dir, limit, f'c{n}', 40, errors))
            child.start()
            children.append(child)
            time.sleep(0.05)
        for child in children:
            child.join(120)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    reported = []
    while not errors.empty():
        reported.append(errors.get())
    assert not reported and not thread_errors, (reported, thread_errors)
    assert [child.exitcode for child in children] == [0] * len(children)
    store.usage()
    check = sqlite3.connect(osp.join(cache_dir, 'ledger.sqlite'))
    assert check.execute('PRAGMA integrity_check').fetchone()[0] == 'ok'
    check.close()
    assert _store_files_bytes(cache_dir) <= limit


def test_evict_many_frees_each_key_once_in_one_transaction(tmp_path):
    store = NodeStore(str(tmp_path / 'store'), 10_000)
    for key, size in (('a', 300), ('b', 500), ('c', 700)):
        store.publish_bytes('ns', key, b'x' * size)
    # A file on disk the ledger does not account for goes, uncounted.
    stray = store.entry_path('ns', 'stray')
    os.makedirs(osp.dirname(stray), exist_ok=True)
    with open(stray, 'wb') as file:
        file.write(b'y' * 50)
    freed = store.evict_many('ns', ['a', 'missing', 'a', 'c', 'stray'])
    assert freed == [300, 0, 0, 700, 0]
    assert store.usage().committed_bytes == 500
    assert [row.key for row in store.entries('ns')] == ['b']
    assert not any(
        osp.exists(store.entry_path('ns', key)) for key in 'ac') and \
        not osp.exists(stray)
    assert store.counters()['ns']['evicted_entries'] == 2
    assert store.counters()['ns']['evicted_bytes'] == 1000
