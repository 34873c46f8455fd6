"""The node prefetcher driven by hand: plan, downloads, pins, budget."""
import os
import time
from collections import Counter
from unittest import mock

import numpy as np
import pytest
from torch.utils.data import BatchSampler

from mmdata_plugin.cache.node_store import NodeStore
from mmdata_plugin.datasets import GrowingWindowSampler, RankShardedSampler
from mmdata_plugin.remote_cache.belady import BeladyCache
from mmdata_plugin.remote_cache.cache_simulator import simulate
from mmdata_plugin.remote_cache.consumption_cursors import (CursorReader,
                                                            CursorWriter)
from mmdata_plugin.remote_cache.node_cache_backend import (NAMESPACE, READS,
                                                           NodeCacheBackend,
                                                           RemoteReader)
import mmdata_plugin.remote_cache.prefetcher as prefetcher_module
from mmdata_plugin.remote_cache.prefetcher import _SIZE_PROBES, NodePrefetcher
from mmdata_plugin.sample_order import NodeStream, sample_order_of
from mmdata_plugin.testing import LoopbackHTTPServer

SIZE = 1000


def make_source(root, count):
    os.makedirs(root)
    rng = np.random.default_rng(0)
    for sample in range(count):
        with open(os.path.join(root, f'{sample}.bin'), 'wb') as file:
            file.write(rng.bytes(SIZE))
    return lambda sample: [os.path.join(root, f'{sample}.bin')]


def make_stream(count, world_size=1):
    with mock.patch(
            'mmdata_plugin.datasets.rank_sharded_sampler.get_dist_info',
            return_value=(0, world_size)):
        sampler = RankShardedSampler(list(range(count)), seed=3)
    return NodeStream(sample_order_of(BatchSampler(sampler, 4, False),
                                      world_size), world_size, 0, world_size)


def build(tmp_path, count=120, limit=40 * SIZE, reserve=10 * SIZE,
          readahead=8, epochs=3, token=1, start_stream=None, urls=None,
          remote=None, max_inflight=4, download_processes=1, coalesce=None):
    urls = urls or make_source(str(tmp_path / 'remote'), count)
    cache_dir = str(tmp_path / 'cache')
    store = NodeStore(cache_dir, limit)
    stream = start_stream or make_stream(count)
    writer = CursorWriter(cache_dir, 0, token)
    prefetcher = NodePrefetcher(
        RemoteReader(store, remote, size_hint=SIZE), stream, urls,
        CursorReader(cache_dir, [0], token), reserve=reserve,
        readahead=readahead, max_inflight=max_inflight,
        stop=stream.epoch_start(epochs),
        horizon=2 * stream.epoch_ticks_of(epochs - 1),
        download_processes=download_processes, coalesce=coalesce)
    store.eviction_policy = prefetcher.victims
    return prefetcher, writer, urls, cache_dir, limit


def read_file(path):
    with open(path, 'rb') as file:
        return file.read()


def consume(prefetcher, writer, urls, cache_dir, limit, start, stop, batch=4,
            settle=True, remote=None, expected=read_file):
    """A loop that reads a batch through the backend per iteration;
    ``settle``: after the prefetcher's downloads of the window are done;
    ``expected(url)``: the bytes a read must return."""
    backend = NodeCacheBackend(cache_dir, limit, remote=remote)
    stream = prefetcher.stream
    peak = 0
    for tick in range(start, stop, batch):
        writer.publish(*stream.epoch_of(tick))
        prefetcher.poll()
        prefetcher.write_victims(cache_dir)
        deadline = time.monotonic() + 30
        while settle and (prefetcher.status()['inflight']
                          or prefetcher.planner.tick < min(tick + batch,
                                                           stop)):
            assert time.monotonic() < deadline, prefetcher.status()
            time.sleep(0.001)
            prefetcher.poll()
        for sample in stream.ids(tick, min(tick + batch, stop)).tolist():
            for url in urls(sample):
                assert backend.get(url) == expected(url)
        usage = prefetcher.store.usage()
        peak = max(peak, usage.committed_bytes + usage.inflight_bytes)
    writer.publish(*stream.epoch_of(stop))
    prefetcher.poll()
    return peak


def test_plan_is_followed_within_the_budget_and_without_duplicates(tmp_path):
    prefetcher, writer, urls, cache_dir, limit = build(tmp_path)
    stop = prefetcher.stop
    peak = consume(prefetcher, writer, urls, cache_dir, limit, 0, stop)
    prefetcher.close()
    assert peak <= limit
    counts = prefetcher.store.counters()
    # Every download is one the plan asked for: none twice.
    offline = simulate(prefetcher.stream.ids(0, stop), SIZE,
                       limit - prefetcher.reserve)['belady_bypass']
    misses = offline.reads - offline.hits
    # A file dropped by the plan but still on disk for a read within the
    # window is read again for free: at most Belady's downloads.
    assert counts[NAMESPACE]['produced'] <= misses
    assert counts[NAMESPACE]['produced_bytes'] == counts[NAMESPACE][
        'produced'] * SIZE
    # The first samples are downloaded before planning (to learn the
    # size) and then count as kept.
    assert prefetcher.stats['planned_hits'] == offline.hits + _SIZE_PROBES
    assert prefetcher.stats['refetched'] == 0
    # The readers found every sample downloaded ahead.
    assert counts[READS]['misses'] == 0
    assert prefetcher.stats['failed'] == 0
    # Readers found the hits on disk.
    assert counts[READS]['hits'] >= offline.hits
    # Nothing the plan does not need is left once training is over.
    assert prefetcher.store.usage().committed_bytes <= limit


def test_samples_sharing_a_file_or_reading_none(tmp_path):
    # Two sample ids per file (a repeated dataset, one sample per person of
    # a picture), and samples whose path keys hold no file.
    files = make_source(str(tmp_path / 'remote'), 60)

    def urls(sample):
        return [] if sample % 7 == 3 else files(sample % 60)

    prefetcher, writer, urls, cache_dir, limit = build(tmp_path, urls=urls)
    half = prefetcher.stop // 2
    peak = consume(prefetcher, writer, urls, cache_dir, limit, 0, half)
    # Each file is named once for eviction, and none that a sample still
    # on the books reads soon.
    victims = [url for _, url in prefetcher.victims()]
    assert len(victims) == len(set(victims))
    peak = max(peak, consume(prefetcher, writer, urls, cache_dir, limit,
                             half, prefetcher.stop))
    prefetcher.close()
    assert peak <= limit
    # No file a kept sample shares is evicted when another sample that
    # reads it is dropped; the readers found every read downloaded ahead.
    assert prefetcher.stats['refetched'] == 0
    assert prefetcher.stats['failed'] == 0
    assert prefetcher.store.counters()[READS]['misses'] == 0


@pytest.mark.parametrize('chunk', [2, 4096])
def test_kept_files_are_evicted_needed_furthest_ahead_first(
        tmp_path, monkeypatch, chunk):
    # Belady: when a download needs room, the kept sample read last goes
    # first; taking the one needed soonest would cost a download within
    # the next ticks. The kept order is asked of the plan a chunk at a
    # time (2: many chunks).
    monkeypatch.setattr(prefetcher_module, '_VICTIMS_CHUNK', chunk)
    prefetcher, writer, urls, cache_dir, limit = build(tmp_path)
    consume(prefetcher, writer, urls, cache_dir, limit, 0,
            prefetcher.stop // 2)
    prefetcher.close()
    cache = prefetcher.planner.cache
    next_read = {
        url: cache.next_use(sample)
        for sample in cache.kept().tolist()
        for url in prefetcher.booked_files(sample)
    }
    order = [
        next_read[url] for _, url in prefetcher.victims()
        if url in next_read
    ]
    assert len(order) > 1
    assert order == sorted(order, reverse=True)
    # All of them, but those read within the window or with a read there.
    soon = prefetcher.position + prefetcher.window()
    assert len(order) == sum(
        len(prefetcher.booked_files(sample))
        for sample in cache.kept().tolist()
        if cache.next_use(sample) >= soon
        and not prefetcher._reads.get(sample))


def test_a_shared_file_stays_staged_for_its_other_reader(tmp_path):
    files = make_source(str(tmp_path / 'remote'), 1)

    def urls(sample):
        return files(0)  # two persons of one picture

    prefetcher, *_ = build(tmp_path, urls=urls)
    prefetcher.planner = mock.Mock(cache=BeladyCache(0))
    prefetcher.marks.reset()
    for sample in (0, 1):  # both read ahead, neither kept
        prefetcher._book(sample)
        prefetcher._reads[sample] = 1
        prefetcher._settle(sample)
    del prefetcher._reads[0]  # sample 0's read has passed
    assert prefetcher._settle(0) == []  # sample 1 still reads the file
    assert prefetcher._staged_bytes > 0
    assert prefetcher._still_needed(1, files(0)[0])
    # Its reader alone now: the file goes at that read.
    assert list(prefetcher._marked.values()) == [(1, files(0)[0])]
    prefetcher.close()


def test_files_read_ahead_are_freed_at_their_read(tmp_path):
    # The DataLoaders read 32 ticks ahead of the loop, more than the 6
    # samples of reserve: each file the plan does not keep goes once a
    # reader has read it, not when the loop passes its tick. (Before, the
    # reserve had to hold the read-ahead twice over: 64 of 40 samples,
    # refused at start.)
    prefetcher, writer, urls, cache_dir, limit = build(
        tmp_path, reserve=6 * SIZE, readahead=32)
    stop = prefetcher.stop
    peak = consume(prefetcher, writer, urls, cache_dir, limit, 0, stop)
    prefetcher.close()
    assert prefetcher.reserve == 6 * SIZE
    assert peak <= limit
    assert prefetcher.stats['freed_at_read'] > 0
    offline = simulate(prefetcher.stream.ids(0, stop), SIZE,
                       limit - prefetcher.reserve)['belady_bypass']
    counts = prefetcher.store.counters()
    # The plan's hits, and no download beyond its misses: a file freed at
    # its read was never needed again before its next planned download.
    assert prefetcher.stats['planned_hits'] == offline.hits + _SIZE_PROBES
    assert counts[NAMESPACE]['produced'] <= offline.reads - offline.hits
    assert prefetcher.stats['refetched'] == 0
    assert counts[READS]['misses'] == 0
    # Marks of reads still ahead were taken back or used: none is left.
    assert not os.listdir(prefetcher.marks.once_dir)


def test_reads_ahead_of_the_plan_are_not_downloaded_again(tmp_path):
    # The readers run 100 ticks ahead of what the plan has decided (it
    # lags, or its reserve is full) and download on demand; the budget
    # (40 samples) cannot keep those files until the plan gets there. The
    # plan learns of those reads and downloads nothing for them.
    prefetcher, writer, urls, cache_dir, limit = build(tmp_path, count=400,
                                                       epochs=1)
    writer.publish(0, 0)
    prefetcher.poll()
    while prefetcher.status()['inflight']:
        time.sleep(0.001)
    decided = prefetcher.planner.tick
    ahead = decided + 100
    backend = NodeCacheBackend(cache_dir, limit)
    for sample in prefetcher.stream.ids(0, ahead).tolist():
        (url, ) = urls(sample)
        backend.get(url)
    produced = prefetcher.store.counters(NAMESPACE)['produced']
    consume(prefetcher, writer, urls, cache_dir, limit, ahead,
            prefetcher.stream.epoch_ticks)
    prefetcher.close()
    # One epoch reads every sample once: one download each.
    counts = prefetcher.store.counters(NAMESPACE)
    assert produced == ahead
    assert counts['produced'] == prefetcher.stream.epoch_ticks
    assert prefetcher.stats['read_before_planned'] == 100


def test_a_queued_download_of_a_file_already_read_is_dropped(tmp_path):
    # A download waits for a thread while a reader ahead of the plan
    # downloads, reads and reports the file, and the plan frees it: the
    # queued download must not fetch it again.
    prefetcher, writer, urls, *_ = build(tmp_path)
    writer.publish(0, 0)
    prefetcher.poll()
    while prefetcher.status()['inflight']:
        time.sleep(0.001)
    unbooked = next(s for s in range(120) if s not in prefetcher._books)
    produced = prefetcher.store.counters(NAMESPACE)['produced']
    # As _download_of does when it queues one.
    prefetcher._inflight += 1
    prefetcher._requests += 1
    prefetcher._download(unbooked, urls(unbooked), SIZE, None)
    prefetcher.close()
    assert prefetcher.store.counters(NAMESPACE)['produced'] == produced
    assert prefetcher.stats['read_before_download'] == 1


def test_the_store_never_evicts_a_kept_file_before_a_read_ahead(tmp_path):
    # A sample kept for a read in the next epoch whose read in this window
    # is still ahead: when a download needs room, the store must not take
    # it (the reader would find nothing and download it again).
    prefetcher, writer, *_ = build(tmp_path, limit=60 * SIZE)
    writer.publish(0, 0)
    prefetcher.poll()
    while prefetcher.status()['inflight']:
        time.sleep(0.001)
    prefetcher.close()
    soon = prefetcher.position + prefetcher.window()
    cache = prefetcher.planner.cache
    waiting = {
        url
        for sample in cache.kept().tolist()
        if cache.next_use(sample) >= soon and prefetcher._reads.get(sample)
        for url in prefetcher.booked_files(sample)
    }
    assert waiting
    offered = {url for _, url in prefetcher.victims(SIZE)}
    assert not offered & waiting


def test_auto_reserve_is_what_the_window_needs(tmp_path):
    prefetcher, writer, *_ = build(tmp_path, reserve=None,
                                   limit=2000 * SIZE)
    writer.publish(0, 0)
    prefetcher.poll()
    # Nothing measured: the window (8 read ahead + 64 lead) all missing,
    # plus two samples of margin.
    assert prefetcher.reserve == 74 * SIZE
    assert prefetcher.planner.cache.capacity == 1926 * SIZE
    # (Downloads still running would measure their own latency over the
    # one set below.)
    prefetcher._pool.shutdown(wait=True)
    # Measured: 1000 ticks/s, 50 ms per download, 1 in 4 a miss: a window
    # of 8 + 150 ticks, 40 of them downloads.
    prefetcher._rate, prefetcher._latency = 1000.0, 0.05
    prefetcher._miss_share = 0.25
    assert prefetcher._resize_reserve() == []
    assert prefetcher.reserve == 42 * SIZE
    assert prefetcher.planner.cache.capacity == 1958 * SIZE
    # Four times faster: capped at 5% of the budget; the kept sample read
    # furthest ahead makes room.
    prefetcher._rate = 4000.0
    cache = prefetcher.planner.cache
    cache.keep(10**6, 10**9, cache.capacity - cache.used)
    prefetcher._book(10**6, [])
    prefetcher._resize_reserve()
    assert prefetcher.reserve == 100 * SIZE
    assert 10**6 not in cache and cache.used <= 1900 * SIZE
    prefetcher.close()


@pytest.mark.parametrize('budget_mb', [10, 25])
def test_auto_reserve_is_a_small_share_of_small_budgets(tmp_path, budget_mb):
    # 50 KB samples in a 10 MB / 25 MB budget, 64 downloads at most: the
    # reserve used to be 64 samples, capped at a quarter of the budget.
    limit = budget_mb * 20 * SIZE
    prefetcher, writer, urls, cache_dir, _ = build(
        tmp_path, reserve=None, limit=limit, max_inflight=64, epochs=1)
    shares = []
    for tick in range(0, prefetcher.stop, 16):
        writer.publish(*divmod(tick, prefetcher.stream.epoch_ticks))
        prefetcher.poll()
        shares.append(prefetcher.reserve / limit)
    prefetcher.close()
    assert max(shares) <= 0.05
    assert prefetcher.store.usage().committed_bytes <= limit


def restart(first, cache_dir, urls, limit, token):
    store = NodeStore(cache_dir, limit)
    stream = first.stream
    resumed = NodePrefetcher(
        RemoteReader(store, size_hint=SIZE), stream, urls,
        CursorReader(cache_dir, [0], token), reserve=first.reserve,
        readahead=first.readahead, max_inflight=4, stop=first.stop,
        horizon=first.horizon)
    store.eviction_policy = resumed.victims
    return resumed, CursorWriter(cache_dir, 0, token)


@pytest.mark.parametrize('warm', [True, False])
def test_restart_downloads_nothing_beyond_the_plan(tmp_path, warm):
    prefetcher, writer, urls, cache_dir, limit = build(tmp_path, token=1)
    stream, stop = prefetcher.stream, prefetcher.stop
    cut = stream.epoch_ticks + 40
    consume(prefetcher, writer, urls, cache_dir, limit, 0, cut)
    prefetcher.close()
    before = prefetcher.store.counters(NAMESPACE)['produced']
    if not warm:
        cache_dir = str(tmp_path / 'cold')
    resumed, writer = restart(prefetcher, cache_dir, urls, limit, token=2)
    consume(resumed, writer, urls, cache_dir, limit, cut, stop)
    resumed.close()
    after = resumed.store.counters(NAMESPACE)['produced'] - (
        before if warm else 0)
    capacity = limit - prefetcher.reserve
    if warm:
        # With the files on disk: no more downloads in all than one
        # uninterrupted run of the plan.
        whole = simulate(stream.ids(0, stop), SIZE, capacity)
        assert before + after <= (whole['belady_bypass'].reads -
                                  whole['belady_bypass'].hits)
    else:
        # Cold: exactly the plan of the rest of the run, nothing replayed.
        rest = simulate(stream.ids(cut, stop), SIZE,
                        capacity)['belady_bypass']
        assert after <= rest.reads - rest.hits + _SIZE_PROBES
    assert resumed.stats['refetched'] == 0


def test_a_world_size_change_on_one_node_keeps_the_node_stream(tmp_path):
    # Ranks take interleaved global positions, so a node that runs all the
    # ranks reads the global stream whatever their number: a resume with
    # another world size continues the same plan.
    two = make_stream(120, world_size=2)
    one = make_stream(120, world_size=1)
    assert two.ids(0, 500).tolist() == one.ids(0, 500).tolist()
    # 12 global samples consumed = tick 12 for both.
    assert two.tick_of(0, 12) == one.tick_of(0, 12) == 12


def _settle(prefetcher, done, seconds=20):
    """Poll until ``done()`` and no download is in flight."""
    deadline = time.monotonic() + seconds
    prefetcher.poll()
    while prefetcher.status()['inflight'] or not done():
        assert time.monotonic() < deadline, prefetcher.status()
        time.sleep(0.001)
        prefetcher.poll()


def growing_window_stream(count, batch):
    """A window of 40 samples growing by 20 up to 80 (one rank)."""
    with mock.patch(
            'mmdata_plugin.datasets.rank_sharded_sampler.get_dist_info',
            return_value=(0, 1)):
        sampler = GrowingWindowSampler(
            list(range(count)), initial=40, growth=20,
            cache_limit=100 * SIZE, sample_bytes=SIZE, seed=3)
    return sampler, NodeStream(
        sample_order_of(BatchSampler(sampler, batch, False), 1), 1, 0, 1)


@pytest.mark.parametrize('count', [200, 120])
def test_growing_window_later_epochs_read_only_local_files(tmp_path, count):
    # Windows of 40, 60, 80, 80, 80, 80 samples; the budget holds the
    # window and the next epoch's 20 entering samples besides the reserve.
    # Of 120 samples, epoch 5 reads arrivals 0..19 again (they left at
    # epoch 3): the plan may keep them meanwhile instead.
    epochs, batch = 6, 4
    sampler, stream = growing_window_stream(count, batch)
    assert sampler.capacity == 80
    urls = make_source(str(tmp_path / 'remote'), count)
    cache_dir = str(tmp_path / 'cache')
    reserve = 8 * SIZE
    limit = 100 * SIZE + reserve
    store = NodeStore(cache_dir, limit)
    writer = CursorWriter(cache_dir, 0, 1)
    prefetcher = NodePrefetcher(
        RemoteReader(store, size_hint=SIZE), stream, urls,
        CursorReader(cache_dir, [0], 1), reserve=reserve, readahead=batch,
        max_inflight=4, stop=stream.epoch_start(epochs),
        horizon=2 * stream.epoch_ticks_of(epochs - 1), min_lead=4)
    store.eviction_policy = prefetcher.victims
    # The test's loop has no real pace: the plan's window stays at its
    # floor (8 ticks), far shorter than an epoch, as when training is slow
    # next to the downloads.
    prefetcher._measure = lambda position: None
    backend = NodeCacheBackend(cache_dir, limit)

    def on_disk(samples):
        return [s for s in samples if prefetcher._present(urls(s))]

    def misses():
        return store.counters(READS).get('misses', 0)

    peak = left = 0
    for epoch in range(epochs):
        start, end = stream.epoch_start(epoch), stream.epoch_start(epoch + 1)
        before = misses()
        for tick in range(start, end, batch):
            writer.publish(epoch, tick - start)
            if epoch == 0:
                # Epoch 0 downloads its window: the readers wait for it.
                _settle(prefetcher,
                        lambda: prefetcher.planner.tick >= tick + batch)
            else:
                prefetcher.poll()
            for sample in stream.ids(tick, tick + batch).tolist():
                (url, ) = urls(sample)
                with open(url, 'rb') as file:
                    assert backend.get(url) == file.read()
            usage = store.usage()
            peak = max(peak, usage.committed_bytes + usage.inflight_bytes)
        # Before the loop passes the epoch's end: the downloads started
        # while it trained are done.
        _settle(prefetcher, lambda: not prefetcher.status()[
            'entering_pending'])
        if epoch:
            # Every read of this epoch found its file on disk.
            assert misses() == before, epoch
        if epoch + 1 < epochs:
            changes = sampler.window_changes(epoch + 1)
            following = set(stream.ids(end, stream.epoch_start(epoch + 2))
                            .tolist())
            assert len(changes.entering) == 20
            # The whole next epoch is local before it starts ...
            assert len(on_disk(following)) == len(following), epoch
            # ... and what leaves the window, never to be read again in
            # this run, is gone once read.
            later = set(stream.ids(end, prefetcher.stop).tolist())
            gone = set(changes.leaving.tolist()) - later
            assert on_disk(gone) == [], epoch
            left += len(gone)
    writer.publish(epochs, 0)
    prefetcher.poll()
    prefetcher.close()
    assert peak <= limit
    assert left >= 20
    # At most one download per sample entering a window (epoch 0: all of
    # it), at least one per sample read: exactly one each without a
    # return of the arrival order.
    entering = sum(
        len(sampler.window_changes(epoch).entering)
        for epoch in range(epochs))
    assert entering == 40 + 5 * 20
    produced = store.counters(NAMESPACE)['produced']
    read = len(set(stream.ids(0, prefetcher.stop).tolist()))
    assert read <= produced <= entering
    stats = prefetcher.stats
    if count == 200:
        assert produced == entering
        assert stats['entering_fetched'] == 5 * 20
    assert stats['entering_dropped'] == 0
    # The plan counts each read of epochs >= 1 as a hit (what entered was
    # booked for its first read); epoch 0 downloads all but the probes.
    assert stats['planned'] == prefetcher.stop
    assert stats['planned'] - stats['planned_hits'] == 40 - _SIZE_PROBES
    assert stats['refetched'] == stats['failed'] == 0
    assert stats['read_before_planned'] == 0


def _serve_varying_sizes(count, mean, seed):
    """Objects whose sizes vary around ``mean`` (the prefetcher's hint)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(mean // 2, mean * 3 // 2, count)
    return {f'{sample}.bin': rng.bytes(int(size))
            for sample, size in enumerate(sizes)}


@pytest.mark.parametrize('seed', range(6))
def test_no_object_is_downloaded_twice_under_budget_pressure(tmp_path, seed):
    # The plan at a tight budget, sizes varying around the hint, readers
    # racing the prefetcher: each read costs at most one download, and
    # every body downloaded is served (published or read privately).
    objects = _serve_varying_sizes(80, SIZE, seed)
    remote = dict(backend='remote_http')
    with LoopbackHTTPServer(objects) as server:
        urls = lambda sample: [server.url(f'{sample}.bin')]  # noqa: E731
        prefetcher, writer, _, cache_dir, limit = build(
            tmp_path, count=80, limit=12 * SIZE, reserve=6 * SIZE,
            epochs=2, urls=urls, remote=remote)
        consume(prefetcher, writer, urls, cache_dir, limit, 0,
                prefetcher.stop, settle=False, remote=remote,
                expected=lambda url: objects[url.rsplit('/', 1)[1]])
        prefetcher.close()
        stats = server.stats()
    reads = Counter(
        f'{sample}.bin'
        for sample in prefetcher.stream.ids(0, prefetcher.stop).tolist())
    repeats = {path: count for path, count in stats.downloads.items()
               if count > reads[path]}
    assert repeats == {}
    counts = prefetcher.store.counters(NAMESPACE)
    assert sum(stats.downloads.values()) == (counts['produced'] +
                                             counts['bypassed'])
    assert prefetcher.stats['failed'] == 0


def test_growing_window_under_faults_reads_right_bytes_once(tmp_path):
    # Windows of 40, 60, 80, 80 samples from a remote failing 15% of its
    # requests (5xx, cut bodies, flipped bytes): every read is right, no
    # file is downloaded more often than it is read but for its damaged
    # bodies.
    count = 120
    _, stream = growing_window_stream(count, 4)
    objects = _serve_varying_sizes(count, SIZE, 0)
    remote = dict(backend='remote_http', backoff=0.001)
    with LoopbackHTTPServer(objects, fault_rate=0.15,
                            fault_kinds=('5xx', 'truncated',
                                         'corrupt')) as server:
        urls = lambda sample: [server.url(f'{sample}.bin')]  # noqa: E731
        prefetcher, writer, _, cache_dir, limit = build(
            tmp_path, count=count, limit=108 * SIZE, reserve=8 * SIZE,
            epochs=4, start_stream=stream, urls=urls, remote=remote)
        consume(prefetcher, writer, urls, cache_dir, limit, 0,
                prefetcher.stop, remote=remote,
                expected=lambda url: objects[url.rsplit('/', 1)[1]])
        prefetcher.close()
        stats = server.stats()
    assert stats.faults['corrupt'] and stats.faults['truncated']
    reads = Counter(
        f'{sample}.bin'
        for sample in stream.ids(0, prefetcher.stop).tolist())
    # A corrupted body is sent whole (the server counts a download): the
    # only downloads beyond the reads.
    beyond = sum(max(0, count - reads[path])
                 for path, count in stats.downloads.items())
    assert beyond <= stats.faults['corrupt']
    assert prefetcher.store.counters(NAMESPACE)['corrupt'] > 0
    assert prefetcher.stats['entering_fetched'] > 0
