"""A file is downloaded once per plan decision, whatever its size hint."""
import threading
import time

import numpy as np
import pytest
import test_prefetcher as prefetching
from test_download_processes import REMOTE, SIZE, reads_per_file

import mmdata_plugin  # noqa: F401  (registers the remote backends)
from mmdata_plugin.cache.node_store import NodeStore
from mmdata_plugin.remote_cache.node_cache_backend import (NAMESPACE,
                                                           NodeCacheBackend,
                                                           RemoteReader)
from mmdata_plugin.testing import LoopbackHTTPServer


def test_a_download_that_outgrows_its_hint_waits_for_room(tmp_path):
    # The reproduction: the budget is full of files nobody may
    # evict (the policy yields nothing) until a timer frees one.
    data = np.random.default_rng(0).bytes(45_000)
    with LoopbackHTTPServer({'obj.jpg': data}) as server:
        cache_dir = str(tmp_path / 'cache')
        store = NodeStore(cache_dir, 100_000, eviction_policy=lambda n: ())
        store.publish_bytes(NAMESPACE, 'other', b'x' * 60_000)
        timer = threading.Timer(0.3, store.evict, (NAMESPACE, 'other'))
        timer.start()
        reader = RemoteReader(store, dict(backend='remote_http'))
        with reader.fetch(server.url('obj.jpg'), 30_000) as entry:
            assert entry.admitted
        timer.join()
        backend = NodeCacheBackend(cache_dir, 100_000,
                                   remote=dict(backend='remote_http'))
        assert backend.get(server.url('obj.jpg')) == data
        assert server.stats().requests_per_path['obj.jpg'] == 1



def _read_racing_a_polling_planner(tmp_path, seed, processes):
    """The budget-pressure run of test_download_processes with the planner
    polled on a thread of its own, as the prefetch process polls it, while
    the reader reads batch after batch (ahead of the plan at the start,
    just in time later): the server's downloads per file."""
    objects = prefetching._serve_varying_sizes(80, SIZE, seed)
    with LoopbackHTTPServer(objects) as server:
        urls = lambda sample: [server.url(f'{sample}.bin')]  # noqa: E731
        prefetcher, writer, _, cache_dir, limit = prefetching.build(
            tmp_path, count=80, limit=12 * SIZE, reserve=6 * SIZE,
            epochs=2, urls=urls, remote=REMOTE,
            download_processes=processes)
        stream, stop = prefetcher.stream, prefetcher.stop
        done = threading.Event()

        def planner():
            while not done.is_set():
                prefetcher.poll()
                prefetcher.write_victims(cache_dir)
                time.sleep(0.002)

        backend = NodeCacheBackend(cache_dir, limit, remote=REMOTE)
        writer.publish(*stream.epoch_of(0))
        polling = threading.Thread(target=planner, daemon=True)
        polling.start()
        try:
            for tick in range(0, stop, 4):
                writer.publish(*stream.epoch_of(tick))
                for sample in stream.ids(tick, min(tick + 4, stop)).tolist():
                    assert backend.get(urls(sample)[0]) == objects[
                        f'{sample}.bin']
            writer.publish(*stream.epoch_of(stop))
        finally:
            done.set()
            polling.join()
            prefetcher.close()
        return server.stats().downloads, reads_per_file(prefetcher)


@pytest.mark.parametrize('processes', [1, 2])
def test_readers_racing_the_polling_planner_never_download_twice(
        tmp_path, processes):
    # A reader ahead of the plan downloads a file and lets it go; the
    # plan's download of it for that same read (decided before the read,
    # started after) or for its next read (then dropped before it) was a
    # second one. About 1-2 reads a seed cost one before.
    repeats = {}
    for seed in range(4):
        downloads, reads = _read_racing_a_polling_planner(
            tmp_path / str(seed), seed, processes)
        repeats.update({(seed, path): count
                        for path, count in downloads.items()
                        if count > reads[path]})
    assert repeats == {}


def _read_and_evict(backend, store, url):
    """A reader ahead of the plan reads ``url`` (downloading it, reporting
    the read) and the budget's pressure evicts it then."""
    backend.get(url)
    store.evict(NAMESPACE, url)


def test_the_start_up_probe_skips_a_file_read_ahead_of_the_plan(tmp_path):
    # The plan's first poll probes the first samples for their size; a
    # reader that read one of them before (and whose copy is gone) has
    # reported it, so it is not downloaded again for that read.
    objects = prefetching._serve_varying_sizes(40, SIZE, 0)
    with LoopbackHTTPServer(objects) as server:
        urls = lambda sample: [server.url(f'{sample}.bin')]  # noqa: E731
        prefetcher, writer, _, cache_dir, limit = prefetching.build(
            tmp_path, count=40, epochs=1, urls=urls, remote=REMOTE)
        first = prefetcher.stream.ids(0, 1).tolist()[0]
        backend = NodeCacheBackend(cache_dir, limit, remote=REMOTE)
        writer.publish(*prefetcher.stream.epoch_of(0))
        _read_and_evict(backend, prefetcher.store, urls(first)[0])
        try:
            prefetcher.poll()
        finally:
            prefetcher.close()
        assert server.stats().downloads[f'{first}.bin'] == 1


def test_a_queued_job_for_a_file_read_meanwhile_is_cancelled(tmp_path):
    # Two download processes, one thread each: the window's jobs wait in
    # turn behind a slow first one in each. A reader ahead of the plan reads a waiting
    # job's file, which is evicted. The plan keeps that file for its next
    # epoch, so nothing marks it to go at this read: only the plan knows
    # the job is not wanted, and the download process cannot see its
    # books. Once the plan has taken the reader's report, the job must be
    # cancelled, not downloaded a second time.
    objects = prefetching._serve_varying_sizes(40, SIZE, 1)
    with LoopbackHTTPServer(objects) as server:
        urls = lambda sample: [server.url(f'{sample}.bin')]  # noqa: E731
        prefetcher, writer, _, cache_dir, limit = prefetching.build(
            tmp_path, count=40, epochs=2, urls=urls, remote=REMOTE,
            max_inflight=2, download_processes=2)
        stream, store = prefetcher.stream, prefetcher.store
        order = stream.ids(0, stream.epoch_ticks_of(0)).tolist()
        # A file on disk tells the plan the sizes (no start-up probe).
        store.publish_bytes(NAMESPACE, urls(order[-1])[0],
                            objects[f'{order[-1]}.bin'])
        backend = NodeCacheBackend(cache_dir, limit, remote=REMOTE)
        writer.publish(*stream.epoch_of(0))
        waiting = order[3]
        try:
            server.latency = 1.0  # the first job's request, and the next
            prefetcher.poll()
            assert waiting in prefetcher._downloading
            assert waiting in prefetcher.planner.cache  # kept: unmarked
            time.sleep(0.1)  # the download process has started its first
            server.latency = 0.0
            _read_and_evict(backend, store, urls(waiting)[0])
            prefetcher.poll()
            deadline = time.monotonic() + 30
            while prefetcher.status()['inflight']:
                assert time.monotonic() < deadline, prefetcher.status()
                time.sleep(0.01)
                prefetcher.poll()
        finally:
            prefetcher.close()
        assert server.stats().downloads[f'{waiting}.bin'] == 1
