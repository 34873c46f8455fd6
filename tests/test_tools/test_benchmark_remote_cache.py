"""tools/benchmark_remote_cache.py end to end, shrunk to seconds."""
import json
import sys

from helpers import REPO_ROOT

from mmdata_plugin.testing import cpu_env, python_path, run_command


def test_harness_measures_remote_readers(tmp_path):
    # Two measured configurations (each costs a torchrun start) and one
    # reported as not installable.
    out = run_command([
        sys.executable, f'{REPO_ROOT}/tools/benchmark_remote_cache.py',
        '--samples', '120', '--sample-kb', '4', '--latency', '0.01',
        '--epochs', '2', '--workers', '1', '--batch-size', '8',
        '--configs', 'remote_http,litdata,ours', '--budgets', '50',
        '--time-box', '30',
        '--work-dir',
        str(tmp_path)
    ],
                      env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
                      timeout=600).stdout
    saved = json.loads((tmp_path / 'results.json').read_text())
    results = {r['name']: r for r in saved['results']}
    assert set(results) == {'remote_http', 'ours@50%'}
    assert 'litdata' in saved['skipped'] and '\nlitdata ' in out
    for name, result in results.items():
        for epoch in result['epochs']:
            # 120 samples over 2 ranks, none cut, none wrong.
            assert (epoch['samples'], epoch['wrong'], epoch['cut']) == \
                (120, 0, False), name
            assert epoch['samples_per_s'] > 0
    for epoch in results['remote_http']['epochs']:
        # Uncached: every sample downloaded once per epoch, nothing twice.
        assert epoch['downloads'] == 120 and epoch['duplicates'] == 0
        assert epoch['hit_rate'] == 0.0
    # The node cache: epoch 2 reads what epoch 1 kept, and is compared
    # with the offline policies at the budget and at the capacity its plan
    # keeps samples in (the budget less the prefetch reserve).
    ours = results['ours@50%']
    budget = saved['data_bytes'] // 2
    assert ours['reserve'] + ours['keep_capacity'] == budget
    assert 0 < ours['epochs'][1]['hit_rate'] < 1
    assert ours['epochs'][1]['duplicates'] == 0
    for offline in (ours['offline'], ours['offline_keep']):
        assert offline['belady_bypass'][0]['hit_rate'] == 0
        assert 0 < offline['fixed_set'][1]['hit_rate'] < 1
    assert (ours['offline_keep']['belady_bypass'][1]['hit_rate'] <
            ours['offline']['belady_bypass'][1]['hit_rate'])
    assert "At the plan's capacity" in out and '\nours@50%' in out


def test_planner_scale_is_measured_against_belady():
    # A look-ahead of 1/40 of an epoch still keeps Belady's 25%.
    out = run_command([
        sys.executable, f'{REPO_ROOT}/tools/benchmark_remote_cache.py',
        '--planner-scale', '2e4', '--planner-horizon', '512'
    ],
                      env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
                      timeout=300).stdout
    row = out.strip().splitlines()[-1].split('|')
    assert row[1].strip() == '2e+04' and float(row[5]) >= 0.95


def test_download_cpu_is_measured_clean_and_with_corrupt_bodies(tmp_path):
    out = run_command([
        sys.executable, f'{REPO_ROOT}/tools/benchmark_remote_cache.py',
        '--download-cpu', '40', '--sample-kb', '4', '--work-dir',
        str(tmp_path)
    ],
                      env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
                      timeout=300).stdout
    clean, corrupt = (line.split('|')
                      for line in out.strip().splitlines()[-2:])
    assert float(clean[3].split('/')[0]) > 0 and float(clean[4]) > 0
    # Nothing wrong is served; with 5% of bodies damaged, some are caught.
    assert clean[5].strip() == corrupt[5].strip() == '0'
    assert int(corrupt[6]) > 0 and int(corrupt[8]) > 40
