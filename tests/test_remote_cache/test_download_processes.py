"""One plan, several download processes (``download_processes=2``)."""
import contextlib
import json
import multiprocessing
import os
import signal
import time
from collections import Counter

import pytest
import test_prefetcher as prefetching
from cache_usage import disk_bytes, run_env
from helpers import REPO_ROOT, TRAIN_SCRIPT, quick_cfg_options

from mmdata_plugin.cache.node_store import NodeStore
from mmdata_plugin.remote_cache.cache_simulator import simulate
from mmdata_plugin.remote_cache.download_processes import ProcessDownloads
from mmdata_plugin.remote_cache.node_cache_backend import (NAMESPACE, READS,
                                                           RemoteReader)
from mmdata_plugin.remote_cache.prefetcher import _SIZE_PROBES
from mmdata_plugin.testing import LoopbackHTTPServer, run_script

SIZE = prefetching.SIZE
REMOTE = dict(backend='remote_http', backoff=0.001)


def served(objects):
    return lambda url: objects[url.rsplit('/', 1)[1]]


def reads_per_file(prefetcher):
    return Counter(
        f'{sample}.bin'
        for sample in prefetcher.stream.ids(0, prefetcher.stop).tolist())


def assert_store_consistent(cache_dir, limit):
    """What a reopened store finds: no reservation or temp file left, the
    ledger counts what is on disk, within the budget."""
    usage = NodeStore(cache_dir, limit).usage()
    assert usage.inflight_bytes == 0
    assert os.listdir(os.path.join(cache_dir, 'tmp')) == []
    assert disk_bytes(cache_dir) == usage.committed_bytes <= limit


def test_the_plan_is_followed_as_with_one_process(tmp_path):
    # Every answer of the download processes is booked: the readers find
    # every sample downloaded ahead, no more downloads than Belady's.
    prefetcher, writer, urls, cache_dir, limit = prefetching.build(
        tmp_path, download_processes=2)
    peak = prefetching.consume(prefetcher, writer, urls, cache_dir, limit, 0,
                               prefetcher.stop)
    status = prefetcher.status()
    prefetcher.close()
    assert peak <= limit
    assert status['download_processes'] == 2
    assert status['inflight'] == 0 and status['failed'] == 0
    counts = prefetcher.store.counters()
    offline = simulate(prefetcher.stream.ids(0, prefetcher.stop), SIZE,
                       limit - prefetcher.reserve)['belady_bypass']
    assert counts[NAMESPACE]['produced'] <= offline.reads - offline.hits
    assert status['planned_hits'] == offline.hits + _SIZE_PROBES
    assert status['downloads'] + _SIZE_PROBES == counts[NAMESPACE]['produced']
    assert counts[READS]['misses'] == 0
    assert_store_consistent(cache_dir, limit)


@pytest.mark.parametrize('seed', range(3))
def test_no_repeat_download_under_budget_pressure(tmp_path, seed):
    # Sizes varying around the hint, a tight budget, readers racing the
    # plan: every read right, none costs a second download.
    objects = prefetching._serve_varying_sizes(80, SIZE, seed)
    with LoopbackHTTPServer(objects) as server:
        urls = lambda sample: [server.url(f'{sample}.bin')]  # noqa: E731
        prefetcher, writer, _, cache_dir, limit = prefetching.build(
            tmp_path, count=80, limit=12 * SIZE, reserve=6 * SIZE,
            epochs=2, urls=urls, remote=REMOTE, download_processes=2)
        peak = prefetching.consume(prefetcher, writer, urls, cache_dir,
                                   limit, 0, prefetcher.stop, settle=False,
                                   remote=REMOTE, expected=served(objects))
        prefetcher.close()
        stats = server.stats()
    reads = reads_per_file(prefetcher)
    assert {path: count for path, count in stats.downloads.items()
            if count > reads[path]} == {}
    counts = prefetcher.store.counters(NAMESPACE)
    assert sum(stats.downloads.values()) == (counts['produced'] +
                                             counts['bypassed'])
    assert prefetcher.stats['downloads'] > 0
    assert prefetcher.stats['failed'] == 0
    assert peak <= limit
    assert_store_consistent(cache_dir, limit)


def test_a_download_process_killed_mid_download_loses_nothing(tmp_path):
    # kill -9 of a download process with downloads in flight: its jobs go
    # to the process forked in its place, the store reclaims what it
    # left; every read is right, and only a file it was downloading may
    # be downloaded again.
    objects = prefetching._serve_varying_sizes(120, SIZE, 7)
    with LoopbackHTTPServer(objects, latency=0.02) as server:
        urls = lambda sample: [server.url(f'{sample}.bin')]  # noqa: E731
        prefetcher, writer, _, cache_dir, limit = prefetching.build(
            tmp_path, count=120, limit=40 * SIZE, reserve=12 * SIZE,
            epochs=2, urls=urls, remote=REMOTE, max_inflight=8,
            download_processes=2)
        processes = prefetcher._processes
        writer.publish(0, 0)
        deadline = time.monotonic() + 10
        while not (processes.workers[0] and processes.workers[0].jobs):
            assert time.monotonic() < deadline
            prefetcher.poll()
        killed = processes.workers[0]
        in_flight = {
            url.rsplit('/', 1)[1]
            for job in killed.jobs.values() for url in job.urls
        }
        os.kill(killed.pid, signal.SIGKILL)
        prefetching.consume(prefetcher, writer, urls, cache_dir, limit, 0,
                            prefetcher.stop, remote=REMOTE,
                            expected=served(objects))
        status = prefetcher.status()
        prefetcher.close()
        stats = server.stats()
    assert status['download_processes_lost'] == 1
    assert status['inflight'] == 0 and status['failed'] == 0
    assert processes.workers == [None, None]  # all stopped with it
    with pytest.raises(ChildProcessError):
        os.waitpid(killed.pid, os.WNOHANG)  # reaped
    reads = reads_per_file(prefetcher)
    repeats = {path for path, count in stats.downloads.items()
               if count > reads[path]}
    assert repeats <= in_flight
    assert_store_consistent(cache_dir, limit)


def test_hook_with_two_download_processes_trains(demo_root, train_env,
                                                 tmp_path):
    # The documented hook block with download_processes=2, through
    # tools/train.py: 64 images in a budget that holds them all, each
    # downloaded once.
    cache_dir = str(tmp_path / 'cache')
    config = (f'{REPO_ROOT}/configs/demo/'
              'tinycnn_demo-jpeg-http-nodecache.py')
    with LoopbackHTTPServer(demo_root, latency=0.01) as server:
        env = dict(run_env(train_env, server, tmp_path),
                   MMDATA_NODE_CACHE=cache_dir,
                   MMDATA_NODE_CACHE_LIMIT='50MB')
        out = run_script(
            TRAIN_SCRIPT, [config, '--work-dir',
             str(tmp_path / 'work')] + quick_cfg_options(
                 max_iters=24, interval=24, **{
                     'train_dataloader.num_workers': 2,
                     'custom_hooks.2.download_processes': 2,
                 }),
            env=env).stdout
        stats = server.stats()
    assert 'Iter(train) [24/24]' in out, out[-3000:]
    assert '2 download process(es)' in out
    with open(os.path.join(cache_dir, 'planner', 'status.json')) as file:
        status = json.load(file)
    assert status['download_processes'] == 2
    assert status['downloads'] > 0 and status['failed'] == 0
    downloads = [count for path, count in stats.downloads.items()
                 if path.startswith('train/')]
    assert downloads and set(downloads) == {1}


def _planner(cache_dir, pipe):
    """A planner's side of two download processes; sends their pids and
    waits to be killed."""
    store = NodeStore(cache_dir, 10 * SIZE)
    downloads = ProcessDownloads(RemoteReader(store), 2, 4, 2.0, 0)
    downloads.poll(lambda sample, url: True)
    pipe.send([worker.pid for worker in downloads.workers])
    time.sleep(60)


def _running(pid):
    """Whether ``pid`` runs (a zombie that nobody reaped does not)."""
    try:
        with open(f'/proc/{pid}/stat') as stat:
            return stat.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except FileNotFoundError:
        return False


def test_download_processes_stop_when_the_prefetch_process_is_killed(
        tmp_path):
    context = multiprocessing.get_context('fork')
    ours, theirs = context.Pipe()
    planner = context.Process(target=_planner,
                              args=(str(tmp_path / 'cache'), theirs))
    planner.start()
    pids = ours.recv()
    assert all(_running(pid) for pid in pids)
    os.kill(planner.pid, signal.SIGKILL)
    planner.join()
    deadline = time.monotonic() + 10
    try:
        while any(_running(pid) for pid in pids):
            assert time.monotonic() < deadline, pids
            time.sleep(0.05)
    finally:
        for pid in pids:  # none left behind by a failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
