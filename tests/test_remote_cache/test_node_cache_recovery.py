"""The node cache end to end through tools/train.py: kill -9 and resume.

Observable behaviour only (the prefetcher's internals change): batches
(sample indices and augmented pixels), the pixels each DataLoader worker
decoded next to the source file's, downloads per path counted by the
loopback server, bytes on disk next to the store's ledger, and errors.

How each test was checked to fail when its feature is broken is said in
its docstring ("Broken:").
"""
import contextlib
import glob
import hashlib
import json
import os
import os.path as osp
import signal
import subprocess
import time
from urllib.parse import unquote

import mmcv
import pytest
from cache_usage import UsageSampler, run_env
from helpers import REPO_ROOT, TRAIN_SCRIPT

from mmdata_plugin.cache.node_store import NodeStore
from mmdata_plugin.cache.process_owner import owner_from_file_name
from mmdata_plugin.cache.store_ledger import StoreLedger
from mmdata_plugin.remote_cache.node_cache_backend import (NodeCacheBackend,
                                                           write_victims)
from mmdata_plugin.testing import (LoopbackHTTPServer, cpu_env, descendants,
                                   kill_after_checkpoint, python_path,
                                   run_ranks, run_script, start_script,
                                   torchrun_command)
from mmdata_plugin.utils import make_demo_dataset

HERE = osp.dirname(osp.abspath(__file__))
CONFIG = f'{REPO_ROOT}/configs/demo/tinycnn_demo-jpeg-http-nodecache.py'
BATCH = 4
NUM_TRAIN = 160
# A hung run fails the test well before pytest's own timeout.
RUN_TIMEOUT = 150


# -- data, configs, runs ---------------------------------------------------


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('recovery_demo'))
    make_demo_dataset(root, num_train=NUM_TRAIN, num_val=8, max_side=96)
    return root


@pytest.fixture(scope='module')
def cache_limit(demo):
    """60 % of the train images: the plan must choose what it keeps."""
    data_bytes = sum(
        osp.getsize(osp.join(directory, name))
        for directory, _, names in os.walk(osp.join(demo, 'train'))
        for name in names)
    return data_bytes * 6 // 10


@pytest.fixture(scope='module')
def probe_env(train_env):
    return dict(train_env, PYTHONPATH=python_path(REPO_ROOT, HERE))


def write_config(path, cache_dir, cache_limit, loaded_dir, max_iters,
                 interval, delay=0.0, download_processes=2):
    """The node-cache demo without its head cache (every read goes through
    the node cache) and with the probes; 2 workers, prefetch_factor 1."""
    path.write_text(f"""
_base_ = [{CONFIG!r}]
custom_imports = dict(
    imports=['mmdata_plugin', 'node_cache_probe'], allow_failed_imports=False)
custom_hooks = [
    dict(type='RemoteCachePrefetchHook', cache_dir={str(cache_dir)!r},
         cache_limit={cache_limit},
         download_processes={download_processes}),
    dict(type='CacheProbeHook', delay={delay}),
]
train_cfg = dict(max_iters={max_iters}, val_begin=10**6)
default_hooks = dict(
    checkpoint=dict(interval={interval}, max_keep_ckpts=-1),
    logger=dict(interval=1))
train_dataloader = dict(
    batch_size={BATCH}, num_workers=2, prefetch_factor=1,
    persistent_workers=True,
    dataset=dict(pipeline=[
        dict(type='LoadImageFromFile'),
        dict(type='RecordLoadedImage', out_dir={str(loaded_dir)!r}),
        dict(type='Resize', scale=(87, 4096), keep_ratio=True),
        dict(type='RandomResize', scale=(72, 4096), ratio_range=(0.9, 1.2),
             keep_ratio=True),
        dict(type='RandomImageCrop', crop_size=64),
        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
        dict(type='PackImageLabelInputs'),
    ]))
""")
    return str(path)


def train(config, work_dir, env, *extra, nproc=1):
    args = [config, '--work-dir', str(work_dir), *extra]
    if nproc > 1:
        return run_ranks(TRAIN_SCRIPT, args + ['--launcher', 'pytorch'],
                            nproc=nproc, env=env, timeout=RUN_TIMEOUT).stdout
    return run_script(TRAIN_SCRIPT, args, env=env,
                      timeout=RUN_TIMEOUT).stdout


def start_training(config, work_dir, env, log):
    """tools/train.py in a session of its own (one killpg ends it all)."""
    return start_script(TRAIN_SCRIPT, [config, '--work-dir', str(work_dir)],
                        log.name, env=env, new_session=True)


def wait_for(condition, what, proc=None, timeout=RUN_TIMEOUT,
             step=0.005):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f'the run ended ({proc.returncode}) before '
                                 f'{what}')
        if time.monotonic() > deadline:
            raise AssertionError(f'no {what} after {timeout} s')
        time.sleep(step)


# -- what the runs did -----------------------------------------------------


def records(work_dir, rank=0):
    """``{iteration: record}`` of one rank (a later run's record wins)."""
    with open(osp.join(work_dir, f'probe_rank{rank}.jsonl')) as file:
        return {r['iter']: r for r in map(json.loads, file)}


def samples_by_position(work_dir, world_size, first_iter=0, start=0):
    """``{global position: (index, digest)}`` in mmengine's rank layout."""
    out = {}
    for rank in range(world_size):
        for it, record in records(work_dir, rank).items():
            if it < first_iter:
                continue
            for slot, sample in enumerate(
                    zip(record['index'], record['digest'])):
                local = (it - first_iter) * BATCH + slot
                out[start + local * world_size + rank] = tuple(sample)
    return out


def pixels_digest(img):
    """As node_cache_probe.pixels_digest (not imported here: it registers
    test components in this process's registries)."""
    digest = hashlib.sha1(repr((img.shape, str(img.dtype))).encode())
    digest.update(img.tobytes())
    return digest.hexdigest()


def relative(url, srv):
    assert url.startswith(srv.base_url), url
    return unquote(url[len(srv.base_url):]).lstrip('/')


def loaded_paths(loaded_dir, demo, srv):
    """Paths (relative to the remote root) that the workers decoded; each
    decoded image equals the source file decoded the same way."""
    expected, paths = {}, set()
    for name in glob.glob(osp.join(loaded_dir, 'loaded_*.jsonl')):
        with open(name) as file:
            for record in map(json.loads, file):
                path = relative(record['path'], srv)
                if path not in expected:
                    with open(osp.join(demo, path), 'rb') as source:
                        expected[path] = mmcv.imfrombytes(source.read())
                assert record['digest'] == pixels_digest(expected[path]), (
                    f'{path}: the pipeline decoded other bytes than the '
                    'source file')
                paths.add(path)
    assert paths, f'no image was recorded in {loaded_dir}'
    return paths


def train_downloads(srv):
    return {
        path: n
        for path, n in srv.stats().downloads.items()
        if path.startswith('train/')
    }


def leftovers(cache_dir):
    """Temp files and reservations in the store now (read without opening
    a NodeStore, which would reclaim them)."""
    temps = os.listdir(osp.join(cache_dir, 'tmp'))
    ledger = StoreLedger(osp.join(cache_dir, 'ledger.sqlite'))
    with ledger.transaction():
        reservations = ledger.reservations()
    return temps, reservations


def check_store(cache_dir, limit, demo, srv):
    """What the run left: the ledger's entries are the files on disk (same
    sizes, bytes of the source), within the budget; once a store opens,
    nothing of a dead process is left (temp files, reservations)."""
    ledger = StoreLedger(osp.join(cache_dir, 'ledger.sqlite'))
    with ledger.transaction():
        rows = {row.digest: row for row in ledger.entries()}
        committed = ledger.committed_bytes()
    on_disk = {
        name: osp.getsize(osp.join(directory, name))
        for directory, _, names in os.walk(osp.join(cache_dir, 'entries'))
        for name in names
    }
    assert on_disk == {digest: row.size for digest, row in rows.items()}
    assert committed == sum(on_disk.values()) <= limit
    for row in rows.values():
        entry = osp.join(cache_dir, 'entries', row.namespace, row.digest[:2],
                         row.digest)
        with open(osp.join(demo, relative(row.key, srv)), 'rb') as source, \
                open(entry, 'rb') as copy:
            assert copy.read() == source.read(), f'{row.key}: partial entry'
    usage = NodeStore(cache_dir, limit).usage()
    assert usage.inflight_bytes == 0
    assert usage.committed_bytes == committed
    assert os.listdir(osp.join(cache_dir, 'tmp')) == []


def prefetcher_pid(cache_dir, parent):
    """The pid in planner/status.json, once it is a child of ``parent``."""
    try:
        with open(osp.join(cache_dir, 'planner', 'status.json')) as file:
            pid = json.load(file)['pid']
        with open(f'/proc/{pid}/stat') as stat:
            ppid = int(stat.read().rsplit(')', 1)[1].split()[1])
    except (FileNotFoundError, ValueError, KeyError):
        return None
    return pid if ppid == parent else None


def temps_of(cache_dir, pid):
    """Temp files (downloads in flight) written by process ``pid``."""
    return [
        name for name in os.listdir(osp.join(cache_dir, 'tmp'))
        if (owner_from_file_name(name) or '').split(':')[1:2] == [str(pid)]
    ]


def stopped_mid_download(cache_dir, pid):
    """Whether process ``pid``, now stopped (SIGSTOP), has a download in
    flight; it runs on where it has none. Stopped, a download seen cannot
    finish (and rename its temp file) before the kill that follows."""
    os.kill(pid, signal.SIGSTOP)
    if temps_of(cache_dir, pid):
        return True
    os.kill(pid, signal.SIGCONT)
    return False


# -- 1. kill -9 of the prefetch process ------------------------------------


def test_prefetcher_killed_stops_training_then_resume_completes(
        demo, cache_limit, probe_env, tmp_path):
    """The node's prefetch process dies (kill -9 while it downloads):
    training stops at once with the hook's error naming the prefetcher;
    ``--resume`` on the same (warm, with the dead process's temp files and
    reservations) cache runs to the end and never serves a partial file.

    Broken (checked): without the hook's liveness check in
    before_train_iter the killed run trains on with every read on demand
    (28 of 30 iterations, then a worker's CacheBudgetError and, before the
    pipe fix in prefetch_process.py, a hang at exit): no hook error, the
    wait times out. With NodeStore._reclaim_abandoned disabled the restart
    leaves the dead prefetcher's reservation (inflight_bytes != 0).
    """
    cache_dir, work_dir = tmp_path / 'cache', tmp_path / 'work'
    loaded = tmp_path / 'loaded'
    # Downloading on its own threads, so that the kill lands mid-download
    # of the process killed (a download process killed mid-download, and
    # download processes outliving a killed prefetch process: see
    # test_download_processes.py).
    config = write_config(tmp_path / 'cfg.py', cache_dir, cache_limit,
                          loaded, max_iters=30, interval=5, delay=0.1,
                          download_processes=1)
    with LoopbackHTTPServer(demo, latency=0.05) as srv:
        env = run_env(probe_env, srv, tmp_path)
        with open(tmp_path / 'killed.log', 'w') as log:
            proc = start_training(config, work_dir, env, log)
            try:
                wait_for(lambda: osp.exists(work_dir / 'iter_5.pth'),
                         'iter_5.pth', proc)
                pid = wait_for(lambda: prefetcher_pid(cache_dir, proc.pid),
                               'prefetcher pid', proc)
                # Mid-download: one of its temp files is being written.
                wait_for(lambda: stopped_mid_download(cache_dir, pid),
                         'download of the prefetcher in flight', proc)
                trained = len(records(work_dir))
                os.kill(pid, signal.SIGKILL)
                code = proc.wait(timeout=RUN_TIMEOUT)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        out = (tmp_path / 'killed.log').read_text()
        assert code != 0, out[-3000:]
        assert ('The node cache prefetcher exited (code -9)' in out
                and 'it stops here' in out), out[-3000:]
        # It stopped at once, not after training on with on-demand reads.
        assert len(records(work_dir)) <= trained + 2
        assert len(records(work_dir)) < 30
        # What the restart finds: the dead prefetcher's download in flight
        # (its temp file, its reservation).
        temps, reservations = leftovers(str(cache_dir))
        assert temps_of(str(cache_dir), pid) or any(
            row.owner.split(':')[1] == str(pid) for row in reservations)

        srv.latency = 0.005
        out = train(config, work_dir, env, '--resume')
        assert 'Iter(train) [30/30]' in out
        assert 'node prefetcher started' in out
        assert sorted(records(work_dir)) == list(range(30))
        loaded_paths(loaded, demo, srv)
        check_store(str(cache_dir), cache_limit, demo, srv)


def test_prefetcher_killed_in_the_last_iteration_does_not_hang_the_run(
        demo, cache_limit, probe_env, tmp_path):
    """The prefetch process dies after the last iteration's check: the
    run ends (the hook's shutdown does not wait on the dead process).

    Broken: with the stop signal a multiprocessing Event (as before this
    test) the run hangs in PrefetchProcess.stop(): a process killed inside
    Event.wait() stays counted as a sleeper of the Event's condition and
    Event.set() waits for it forever (wait below times out).
    """
    cache_dir, work_dir = tmp_path / 'cache', tmp_path / 'work'
    config = write_config(tmp_path / 'cfg.py', cache_dir, cache_limit,
                          tmp_path / 'loaded', max_iters=6, interval=6,
                          delay=0.5)
    with LoopbackHTTPServer(demo, latency=0.005) as srv:
        env = run_env(probe_env, srv, tmp_path)
        with open(tmp_path / 'train.log', 'w') as log:
            proc = start_training(config, work_dir, env, log)
            try:
                pid = wait_for(lambda: prefetcher_pid(cache_dir, proc.pid),
                               'prefetcher pid', proc)
                # The last iteration's after_train_iter sleeps 0.5 s.
                wait_for(lambda: osp.exists(work_dir / 'probe_rank0.jsonl')
                         and 5 in records(work_dir), 'iteration 5', proc)
                os.kill(pid, signal.SIGKILL)
                code = proc.wait(timeout=RUN_TIMEOUT)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    out = (tmp_path / 'train.log').read_text()
    assert code == 0, out[-3000:]
    assert 'Iter(train) [6/6]' in out


def test_reader_evicts_past_a_dead_prefetchers_victims_list(tmp_path):
    """A reader that needs room while the victims list of a prefetcher
    that just died (or one whose listed files are gone already) frees
    nothing falls back to the least recently used, as documented, instead
    of failing the read.

    Found when the hook's liveness check was disabled: the killed
    prefetcher's list (under 10 s old) named only evicted files and a
    DataLoader worker's read raised CacheBudgetError ("eviction frees only
    0 B"). Broken (PlannedEviction: LRU only when the list is empty): the
    get() below raises CacheBudgetError.
    """
    files = {f'train/{i}.bin': bytes([i]) * 1000 for i in range(6)}
    cache_dir = str(tmp_path / 'cache')
    with LoopbackHTTPServer(files) as srv:
        backend = NodeCacheBackend(cache_dir, 4000)
        for i in range(4):
            assert backend.get(srv.url(f'train/{i}.bin')) == files[
                f'train/{i}.bin']
        # The list a killed prefetcher left: files evicted since.
        write_victims(cache_dir, [srv.url('train/8.bin'),
                                  srv.url('train/9.bin')])
        assert backend.get(srv.url('train/4.bin')) == files['train/4.bin']
        usage = NodeStore(cache_dir, 4000).usage()
    assert usage.committed_bytes + usage.inflight_bytes <= 4000
    assert usage.entries == 4


# -- 2. kill -9 of the whole run mid-download ------------------------------


def kill_tree_mid_download(proc, cache_dir, timeout=RUN_TIMEOUT):
    """SIGKILL ``proc`` and every descendant (torchrun starts its ranks in
    sessions of their own: a killpg would miss them) at a moment a download
    is in flight. The tree is frozen (SIGSTOP) while the temp files are
    looked at, so the kill finds what was seen. Returns the temp files."""
    deadline = time.monotonic() + timeout
    while True:
        pids = descendants([proc.pid])
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        temps = os.listdir(osp.join(cache_dir, 'tmp'))
        if temps or time.monotonic() > deadline:
            for pid in descendants([proc.pid]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
            assert temps, f'no download in flight within {timeout} s'
            return temps
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        time.sleep(0.005)


def test_whole_run_killed_mid_download_then_restart(demo, cache_limit,
                                                    probe_env, tmp_path):
    """2 ranks x 2 workers and the prefetcher all die (kill -9) while
    downloads are in flight; the restart (``--resume``, same cache_dir)
    is not blocked by what they left (temp files, reservations, lock files),
    serves no partial file and holds the budget.

    Broken (checked): with NodeStore._reclaim_abandoned disabled the dead
    processes' reservations stay (inflight_bytes != 0) and their temp files
    too. A store writing into the entry's final path (no temp + rename)
    fails even earlier: the first run reads torn files.
    """
    cache_dir, work_dir = tmp_path / 'cache', tmp_path / 'work'
    loaded = tmp_path / 'loaded'
    config = write_config(tmp_path / 'cfg.py', cache_dir, cache_limit,
                          loaded, max_iters=16, interval=4, delay=0.05)
    args = [config, '--work-dir', str(work_dir), '--launcher', 'pytorch']
    with LoopbackHTTPServer(demo, latency=0.05) as srv:
        env = run_env(probe_env, srv, tmp_path)
        with open(tmp_path / 'killed.log', 'w') as log:
            proc = subprocess.Popen(
                torchrun_command(TRAIN_SCRIPT, args, nproc=2),
                env=cpu_env(env), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
            try:
                wait_for(lambda: osp.exists(work_dir / 'iter_4.pth'),
                         'iter_4.pth', proc, timeout=RUN_TIMEOUT)
                temps = kill_tree_mid_download(proc, str(cache_dir))
            finally:
                if proc.poll() is None:
                    for pid in descendants([proc.pid]):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    proc.wait()
        assert not os.path.exists(work_dir / 'iter_16.pth')
        # The dead processes' downloads are still there to be reclaimed.
        assert set(temps) <= set(leftovers(str(cache_dir))[0])

        srv.latency = 0.005
        with UsageSampler(str(cache_dir), cache_limit) as usage:
            out = train(config, work_dir, env, '--resume', nproc=2)
        assert 'Iter(train) [16/16]' in out
        assert 0 < usage.peak <= cache_limit
        assert sorted(records(work_dir, 0)) == list(range(16))
        loaded_paths(loaded, demo, srv)
        check_store(str(cache_dir), cache_limit, demo, srv)
        assert not set(temps) & set(os.listdir(cache_dir / 'tmp'))


# -- 3. exact resume with a cold and a warm cache --------------------------

RESUME_ITERS, RESUME_AT = 44, 12


def paths_of(demo):
    """Sample index -> path relative to the remote root (train.txt)."""
    with open(osp.join(demo, 'train.txt')) as file:
        return [line.rsplit(' ', 1)[0] for line in file.read().splitlines()]


@pytest.fixture(scope='module')
def reference_run(tmp_path_factory, demo, cache_limit, probe_env):
    """One rank, uninterrupted, with its own cache."""
    tmp = tmp_path_factory.mktemp('reference')
    config = write_config(tmp / 'cfg.py', tmp / 'cache', cache_limit,
                          tmp / 'loaded', max_iters=RESUME_ITERS,
                          interval=RESUME_AT)
    with LoopbackHTTPServer(demo, latency=0.005) as srv:
        train(config, tmp / 'work', run_env(probe_env, srv, tmp))
    return tmp / 'work'


def check_resumed(out, work_dir, reference, downloads, loaded, demo):
    """Same batches as the uninterrupted run from RESUME_AT on; nothing
    downloaded that the resumed run did not read."""
    assert (f'Fast resume: skipped {RESUME_AT} batches '
            f'({RESUME_AT * BATCH} samples on all ranks)') in out
    resumed, full = records(work_dir), records(reference)
    assert sorted(resumed) == list(range(RESUME_AT, RESUME_ITERS))
    for it in resumed:
        assert (resumed[it]['index'], resumed[it]['digest']) == (
            full[it]['index'], full[it]['digest']), f'iteration {it} differs'
    paths = paths_of(demo)
    # The index -> path map is the one the workers read by.
    assert {paths[i] for it in resumed for i in resumed[it]['index']} <= \
        loaded
    before = {
        paths[i]
        for it in range(RESUME_AT) for i in full[it]['index']
    }
    # Read before the checkpoint and never again by the resumed run (its
    # DataLoaders' read-ahead past the last iteration included): not one
    # download of them.
    assert not {p: n for p, n in downloads.items() if p in before - loaded}
    # Nor of anything else the resumed run did not read.
    assert set(downloads) <= loaded


def test_resume_with_a_cold_cache(reference_run, demo, cache_limit,
                                  probe_env, tmp_path):
    """Resume the uninterrupted run's iter_12.pth onto an empty cache_dir:
    the same batches, downloads only of what is read from there on.

    Broken (checked): a planner that starts at tick 0 instead of the
    resumed position (prefetcher.poll: self.start(0)) downloads samples of
    iterations 0..11 that the resumed run never reads.
    """
    config = write_config(tmp_path / 'cfg.py', tmp_path / 'cache',
                          cache_limit, tmp_path / 'loaded',
                          max_iters=RESUME_ITERS, interval=RESUME_AT)
    with LoopbackHTTPServer(demo, latency=0.005) as srv:
        out = train(config, tmp_path / 'work',
                    run_env(probe_env, srv, tmp_path), '--resume',
                    str(reference_run / f'iter_{RESUME_AT}.pth'))
        downloads = train_downloads(srv)
        loaded = loaded_paths(tmp_path / 'loaded', demo, srv)
    check_resumed(out, tmp_path / 'work', reference_run, downloads, loaded,
                  demo)
    # Cold: every file it read was downloaded, none twice within the pass.
    assert set(downloads) == loaded


def test_resume_with_a_warm_cache(reference_run, demo, cache_limit,
                                  probe_env, tmp_path):
    """A run killed (kill -9) after iter_12.pth resumes on the cache it
    left: the same batches as the uninterrupted run, no download of what is
    read only before the checkpoint, and the warm files save downloads.

    Broken (checked): as the cold-cache test (planner from tick 0).
    """
    cache_dir, work_dir = tmp_path / 'cache', tmp_path / 'work'
    config = write_config(tmp_path / 'cfg.py', cache_dir, cache_limit,
                          tmp_path / 'loaded_killed', max_iters=RESUME_ITERS,
                          interval=RESUME_AT, delay=0.05)
    with LoopbackHTTPServer(demo, latency=0.005) as srv:
        env = run_env(probe_env, srv, tmp_path)
        with open(tmp_path / 'killed.log', 'w') as log:
            code = kill_after_checkpoint(
                start_script(TRAIN_SCRIPT,
                             [config, '--work-dir', str(work_dir / 'killed')],
                             log.name, env=env, new_session=True),
                str(work_dir / 'killed'), f'iter_{RESUME_AT}.pth',
                extra_delay=0.5, timeout=RUN_TIMEOUT)
        assert code == -9
        warm = {
            row.key
            for row in StoreLedger(str(cache_dir / 'ledger.sqlite')).entries()
        }
        srv.reset_stats()
        config = write_config(tmp_path / 'resume.py', cache_dir, cache_limit,
                              tmp_path / 'loaded', max_iters=RESUME_ITERS,
                              interval=RESUME_AT)
        out = train(config, work_dir / 'resumed', env, '--resume',
                    str(work_dir / 'killed' / f'iter_{RESUME_AT}.pth'))
        downloads = train_downloads(srv)
        loaded = loaded_paths(tmp_path / 'loaded', demo, srv)
        warm = {relative(url, srv) for url in warm}
        check_store(str(cache_dir), cache_limit, demo, srv)
    check_resumed(out, work_dir / 'resumed', reference_run, downloads,
                  loaded, demo)
    # The killed run had downloaded ahead of its checkpoint: the resume
    # reads some of those files from disk.
    assert warm & loaded
    assert len(downloads) < len(loaded)


# -- 4. world-size change with the cache -----------------------------------


def test_two_ranks_then_one_rank_on_the_same_cache(demo, cache_limit,
                                                   probe_env, tmp_path):
    """2 ranks (torchrun, gloo) train 16 iterations; resuming their
    iter_6.pth with 1 rank on the same cache_dir continues the global
    stream (the samples and pixels the 2-rank run had at each position),
    downloads nothing it does not read, within the budget.

    Broken (checked): a planner from tick 0 (as above) downloads samples
    of the first 48 positions that the resumed run never reads.
    """
    cache_dir, loaded = tmp_path / 'cache', tmp_path / 'loaded'
    config = write_config(tmp_path / 'cfg.py', cache_dir, cache_limit,
                          tmp_path / 'loaded_two', max_iters=16, interval=6)
    with LoopbackHTTPServer(demo, latency=0.005) as srv:
        env = run_env(probe_env, srv, tmp_path)
        train(config, tmp_path / 'two', env, nproc=2)
        srv.reset_stats()
        config = write_config(tmp_path / 'one.py', cache_dir, cache_limit,
                              loaded, max_iters=16, interval=6)
        with UsageSampler(str(cache_dir), cache_limit) as usage:
            out = train(config, tmp_path / 'one', env, '--resume',
                        str(tmp_path / 'two' / 'iter_6.pth'))
        downloads = train_downloads(srv)
        read = loaded_paths(loaded, demo, srv)
        check_store(str(cache_dir), cache_limit, demo, srv)
    assert 'world_size x batch_size changed from 2 x 4 to 1 x 4' in out
    reference = samples_by_position(tmp_path / 'two', 2)
    after = samples_by_position(tmp_path / 'one', 1, first_iter=6, start=48)
    assert sorted(after) == list(range(48, 88))
    assert after == {p: reference[p] for p in after}
    assert 0 < usage.peak <= cache_limit
    paths = paths_of(demo)
    before = {paths[reference[p][0]] for p in range(48)}
    assert not {p: n for p, n in downloads.items() if p in before - read}
    assert set(downloads) <= read
