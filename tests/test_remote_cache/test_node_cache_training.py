"""tools/train.py with the node cache: 2 ranks x 2 workers over HTTP."""
import json
import os

import pytest
from cache_usage import UsageSampler, disk_bytes
from helpers import REPO_ROOT, TRAIN_SCRIPT, quick_cfg_options

from mmdata_plugin.cache.node_store import NodeStore
from mmdata_plugin.testing import LoopbackHTTPServer, run_torchrun
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
            train_env,
            MMDATA_REMOTE_ROOT=srv.base_url,
            MMDATA_REMOTE_FILES_DIR=str(tmp_path / 'remote_files'),
            MMDATA_INDEX_DIR=str(tmp_path / 'index'),
            MMDATA_NODE_CACHE=cache_dir,
            MMDATA_NODE_CACHE_LIMIT=str(limit))
        # 2 ranks x batch 4 x 50 iterations = two passes over the 200.
        with sampler:
            out = run_torchrun(
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
    # Two passes over 200 images: the plan keeps some for the second pass
    # (downloaded once); repeats beyond two passes stay rare.
    assert sum(downloads.values()) < 400 - status['planned_hits'] // 2
    repeats = sum(n - 2 for n in downloads.values() if n > 2)
    assert repeats <= 0.05 * sum(downloads.values())
    assert status['planned_hits'] > 0 and status['failed'] == 0
