"""tools/train.py with the node cache: 2 ranks x 2 workers over HTTP."""
import json
import os
import re

import pytest
from cache_usage import UsageSampler, disk_bytes, run_env
from helpers import REPO_ROOT, TRAIN_SCRIPT, quick_cfg_options

from mmdata_plugin.cache.node_store import NodeStore
from mmdata_plugin.testing import LoopbackHTTPServer, run_ranks, run_script
from mmdata_plugin.utils import make_demo_dataset

CONFIG = f'{REPO_ROOT}/configs/demo/tinycnn_demo-jpeg-http-nodecache.py'


@pytest.fixture(scope='module')
def bigger_demo(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('nodecache_demo'))
    make_demo_dataset(root, num_train=200, num_val=8, max_side=96)
    return root


def test_two_ranks_two_workers_hold_the_budget(bigger_demo, train_env,
                                               tmp_path):
    data_bytes = sum(
        os.path.getsize(os.path.join(directory, name))
        for directory, _, names in os.walk(os.path.join(bigger_demo, 'train'))
        for name in names)
    limit = data_bytes * 6 // 10
    cache_dir = str(tmp_path / 'cache')
    sampler = UsageSampler(cache_dir, limit)
    with LoopbackHTTPServer(bigger_demo, latency=0.01) as srv:
        env = dict(
            run_env(train_env, srv, tmp_path),
            MMDATA_NODE_CACHE=cache_dir,
            MMDATA_NODE_CACHE_LIMIT=str(limit))
        # 2 ranks x batch 4 x 50 iterations = two passes over the 200.
        with sampler:
            out = run_ranks(
                TRAIN_SCRIPT, [
                    CONFIG, '--work-dir',
                    str(tmp_path / 'work'), '--launcher', 'pytorch'
                ] + quick_cfg_options(
                    max_iters=50,
                    interval=50,
                    **{
                        'train_dataloader.num_workers': 2,
                        'train_dataloader.prefetch_factor': 1,
                    }),
                env=env).stdout
        stats = srv.stats()
    assert 'Iter(train) [50/50]' in out
    assert 'node prefetcher started for ranks 0..1' in out
    # DataMonitorHook's report has the node cache's figures.
    assert 'Remote node cache (' in out and '% of reads local' in out
    with open(os.path.join(cache_dir, 'planner', 'status.json')) as file:
        status = json.load(file)
    # The hard budget, downloads in flight included, held all along, and
    # what is on disk is what the ledger counts.
    assert 0 < sampler.peak <= limit
    usage = NodeStore(cache_dir, limit).usage()
    assert disk_bytes(cache_dir) == usage.committed_bytes <= limit
    downloads = {
        path: n
        for path, n in stats.downloads.items() if path.startswith('train/')
    }
    # Two passes over 200 images, and the pipeline's CachedPipelineHead
    # serves the second: the plan downloads none of what the head serves
    # (without the head's links ~250 here, the plan keeping a part).
    # A link can come a moment after the read it is for (the head stores
    # after its transforms ran), so a sample read again right away may
    # be downloaded twice, rarely.
    assert len(downloads) == 200
    assert sum(downloads.values()) <= 205
    assert status['planned_hits'] > 0 and status['failed'] == 0


GROWING_CONFIG = (f'{REPO_ROOT}/configs/demo/'
                  'tinycnn_demo-jpeg-http-growingwindow.py')


def test_growing_window_downloads_each_entering_image_once(
        demo_root, train_env, tmp_path):
    # Windows of 16, 24, 32, 32, 32 of the 64 demo images (48 arrive in 5
    # epochs): 136 reads, 34 iterations of batch 4, one rank, workers.
    data_bytes = sum(
        os.path.getsize(os.path.join(directory, name))
        for directory, _, names in os.walk(os.path.join(demo_root, 'train'))
        for name in names)
    cache_dir = str(tmp_path / 'cache')
    options = {
        'train_dataloader.sampler.initial': 16,
        'train_dataloader.sampler.growth': 8,
        'train_dataloader.sampler.capacity': 32,
        'train_dataloader.batch_size': 4,
        'train_dataloader.num_workers': 2,
        'val_dataloader.batch_size': 8,
        'train_cfg.max_epochs': 5,
        'train_cfg.val_interval': 5,
        'default_hooks.logger.interval': 1,
    }
    with LoopbackHTTPServer(demo_root, latency=0.01) as srv:
        env = dict(
            run_env(train_env, srv, tmp_path),
            MMDATA_NODE_CACHE=cache_dir,
            # A quarter is the prefetch reserve: the plan keeps 48 images'
            # worth, the window and the next epoch's entering ones fit.
            MMDATA_NODE_CACHE_LIMIT=str(data_bytes))
        out = run_script(TRAIN_SCRIPT, [
            GROWING_CONFIG, '--work-dir',
            str(tmp_path / 'work'), '--cfg-options'
        ] + [f'{key}={value}' for key, value in options.items()],
                          env=env).stdout
        stats = srv.stats()
    assert 'node prefetcher started for ranks 0..0' in out
    # All 34 iterations (mmengine's max_iters, from epoch 0's length, says
    # 20: docs/growing_window.md, Limits).
    assert re.search(r'Iter\(train\) +\[34/', out), out[-3000:]
    with open(os.path.join(cache_dir, 'planner', 'status.json')) as file:
        status = json.load(file)
    # The plan followed every read of the five epochs of different
    # lengths, and fetched entering images of the next epoch ahead (the
    # rest of the 4 x 8 the plan's window reached first: these epochs are
    # short next to the DataLoaders' read-ahead).
    assert status['planned_to'] == 16 + 24 + 32 + 32 + 32
    assert 0 < status['entering_fetched'] <= 4 * 8
    assert status['failed'] == status['entering_dropped'] == 0
    downloads = {
        path: n
        for path, n in stats.downloads.items() if path.startswith('train/')
    }
    # Each image that entered the window was downloaded once.
    assert len(downloads) == 48
    assert set(downloads.values()) == {1}
