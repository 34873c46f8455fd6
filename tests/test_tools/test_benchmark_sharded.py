"""tools/benchmark_sharded.py end to end, shrunk to a few thousand lines."""
import json

from helpers import REPO_ROOT

from mmdata_plugin.testing import cpu_env, python_path, run_script


def test_benchmark_runs_every_approach_and_reports_ratios(tmp_path):
    out = run_script(f'{REPO_ROOT}/tools/benchmark_sharded.py', ['--lines',
        '3000', '--workers', '1', '--batch-size', '100', '--epoch-starts',
        '1', '--index-repeats', '1', '--work-dir',
        str(tmp_path)
    ],
                      env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
                      timeout=300).stdout
    assert 'Index build:' in out and 'MB/s' in out
    results = json.loads((tmp_path / 'results.json').read_text())['results']
    assert set(results) == {
        'baseline', 'ours', 'ours+shards', 'basedataset', 'rank_dataset'
    }
    for name, result in results.items():
        assert result['samples'] == 3000, name  # one full epoch, 2 ranks
        assert result['pss_mb'] > 0 and result['uss_mb'] > 0
    for name in ('ours', 'ours+shards', 'rank_dataset'):
        # Ratios to BaseDataset, net of the baseline run.
        assert {'pss_ratio', 'uss_ratio', 'net_pss_mb'} <= set(results[name])
        assert f'\n{name} ' in out
