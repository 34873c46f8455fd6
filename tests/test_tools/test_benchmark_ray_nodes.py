"""tools/benchmark_ray_nodes.py end to end, shrunk to tiny batches on a
2-node loopback cluster it starts and stops itself."""
import re

import pytest
from helpers import REPO_ROOT

from mmdata_plugin.testing import python_path, run_script

pytest.importorskip(
    'ray', reason='Ray is not installed: pip install "mmdata_plugin[ray]" '
    '(the tests extra installs it)')

NUMBER = r'\d+\.\d+'


def test_benchmark_prints_its_three_tables():
    # A fork of the warm interpreter: the tool's own imports are done.
    out = run_script(f'{REPO_ROOT}/tools/benchmark_ray_nodes.py', [
        '--batch-size', '4', '--size', '16', '--batches', '2', '--rounds',
        '1', '--idle', '0.05', '--data-nodes', '1', '--scale-k', '1',
        '--scale-batch-size', '4', '--wait-ms', '1', '--object-store-mb',
        '80', '--mix-workers', '1', '--mix-actors', '1'
    ],
                     env=dict(PYTHONPATH=python_path(REPO_ROOT)),
                     timeout=300).stdout
    assert re.search(r'^cluster of 2 nodes up in [\d.]+ s$', out,
                     re.MULTILINE), out
    assert 'Per batch of 4x3x16x16 uint8 (0.0 MB)' in out
    for path in ('local_workers', 'ray_same_node', 'ray_other_node'):
        assert re.search(rf'^{path}\s+' + r'\s+'.join([NUMBER] * 5) + '$',
                         out, re.MULTILINE), out
    assert re.search(r'^local_workers\s+\S+\s+\S+\s+1\.00\s', out,
                     re.MULTILINE), out
    assert ('Throughput vs actors on the data nodes, 4 samples per batch, '
            '1 ms wait per sample:') in out
    assert re.search(r'^\s+1\s+' + r'\s+'.join([NUMBER] * 2) + r'\s+1\.00$',
                     out, re.MULTILINE), out
    assert re.search(
        r'^Mixed production, 4 samples per batch, 1 ms wait per sample '
        r'\(4 batches per run; local share of the mixed run: \d+%\):$', out,
        re.MULTILINE), out
    for producers in ('1 local workers', '1 actors', 'mixed'):
        assert re.search(rf'^{producers}\s+{NUMBER}\s+{NUMBER}$', out,
                         re.MULTILINE), out
