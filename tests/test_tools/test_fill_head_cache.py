"""tools/fill_head_cache.py fills the demo's head cache ahead of training."""
import os.path as osp
import sys

from helpers import DEMO_CONFIG, REPO_ROOT

from mmdata_plugin.cache import NodeStore
from mmdata_plugin.testing import run_command

TOOL = osp.join(REPO_ROOT, 'tools', 'fill_head_cache.py')


def test_fill_then_refill_skips_what_is_cached(train_env, tmp_path):
    cache_dir = str(tmp_path / 'cache')
    env = dict(train_env, MMDATA_CACHE_DIR=cache_dir)
    command = [sys.executable, TOOL, DEMO_CONFIG, '--limit', '12']
    out = run_command(command + ['--workers', '2'], env=env).stdout
    assert (f'12 samples of the train dataset of {DEMO_CONFIG} into '
            f'{cache_dir} (2 processes)') in out
    assert 'stored 12 new entries, 0 were already there' in out
    usage = NodeStore(cache_dir, '2GB').usage()
    assert usage.entries == 12 and usage.inflight_bytes == 0
    out = run_command(command + ['--workers', '1'], env=env).stdout
    assert 'stored 0 new entries, 12 were already there' in out
