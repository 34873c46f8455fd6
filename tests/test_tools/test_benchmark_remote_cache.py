"""tools/benchmark_remote_cache.py end to end, shrunk to seconds."""
import importlib.util
import json

import numpy as np
import pytest
from helpers import REPO_ROOT, load_tool

from mmdata_plugin.testing import cpu_env, python_path, run_script


def test_harness_measures_remote_readers(tmp_path):
    # Two measured configurations (each costs a torchrun start) and one
    # reported, not run (LitData reads packed data only, when installed).
    out = run_script(f'{REPO_ROOT}/tools/benchmark_remote_cache.py', [
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


def test_tar_shards_are_read_per_member_and_coalesced(tmp_path):
    out = run_script(f'{REPO_ROOT}/tools/benchmark_remote_cache.py', [
        '--tar-shards', '30', '--samples', '120', '--sample-kb', '4',
        '--latency', '0.01', '--epochs', '2', '--workers', '1',
        '--batch-size', '8', '--budgets', '50', '--repeats', '1',
        '--tar-orders', 'window', '--work-dir',
        str(tmp_path)
    ],
                      env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
                      timeout=600).stdout
    runs = json.loads((tmp_path / 'results_tar.json').read_text())['runs']
    assert set(runs) == {'window@50%', 'window@50%+coalesced'}
    for name, (result, ) in runs.items():
        for epoch in result['epochs']:
            assert (epoch['samples'], epoch['wrong']) == (120, 0), name
    # Nothing on disk at the start: each member a GET of its own.
    assert runs['window@50%'][0]['epochs'][0]['downloads'] >= 120
    assert '\nwindow@50%+coalesced' in out and 'GETs' in out
    # Every run gets the shuffle figures (here one window holds the 4
    # shards: a batch of 8 has at least 2 from one shard).
    (window, ) = runs['window@50%+coalesced']
    for epoch in window['epochs']:
        assert 0.25 <= epoch['batch_shard_share'] <= 1
        assert 0 < epoch['spread'] < 1.5
    assert 'spread' in out and '1-shard' in out


def test_shuffle_quality_of_known_orders():
    tool = load_tool('benchmark_remote_cache')
    samples, per_shard = 12000, 100
    # The source order: neighbours 1 apart, every batch of 20 from one
    # shard.
    source = np.arange(samples).reshape(-1, 20).tolist()
    quality = tool.shuffle_quality([source], samples, per_shard)
    assert quality['spread'] == pytest.approx(3 / (samples + 1))
    assert quality['batch_shard_share'] == 1.0
    # A uniform permutation: spread ~1; 20 draws from 120 shards rarely
    # share one (mean top share ~0.09).
    shuffled = np.random.default_rng(0).permutation(samples)
    quality = tool.shuffle_quality([shuffled.reshape(-1, 20).tolist()],
                                   samples, per_shard)
    assert quality['spread'] == pytest.approx(1.0, abs=0.03)
    assert 0.05 < quality['batch_shard_share'] < 0.15
    # Two ranks: pairs within a rank only; batches of any size.
    quality = tool.shuffle_quality([[[0, 2], [4]], [[10, 11, 12]]], 30, 10)
    assert quality['spread'] == pytest.approx((2 + 2 + 1 + 1) / 4 / (31 / 3))
    assert quality['batch_shard_share'] == pytest.approx((1 + 1 + 1) / 3)


def test_rereads_count_bytes_read_again_within_an_epoch():
    rereads = load_tool('benchmark_remote_cache').rereads
    # Whole files: the second download of a is one re-read of its bytes.
    assert rereads([('a', 100, 0), ('b', 50, 0), ('a', 100, 0)]) == (1, 100)
    # Ranges of one shard: disjoint reads are no re-read; a coalesced span
    # over two members read before re-reads both, once each byte.
    got = [('s', 10, 0), ('s', 10, 20), ('s', 30, 0), ('s', 10, 40)]
    assert rereads(got) == (1, 20)
    # Another path's bytes are its own.
    assert rereads([('s', 10, 0), ('t', 10, 0)]) == (0, 0)


@pytest.mark.skipif(
    not (importlib.util.find_spec('litdata')
         and importlib.util.find_spec('streaming')),
    reason='LitData and MosaicML Streaming are not installed (python '
    'tools/bootstrap.py --extras bench; not in the tests extra)')
def test_litdata_and_mosaic_read_the_same_samples(tmp_path):
    out = run_script(f'{REPO_ROOT}/tools/benchmark_remote_cache.py', [
        '--tar-shards', '10', '--samples', '120', '--sample-kb', '4',
        '--latency', '0.01', '--epochs', '2', '--workers', '1', '--ranks',
        '1', '--batch-size', '8', '--budgets', '50', '--repeats', '1',
        '--tar-orders', 'litdata,mosaic-b20', '--work-dir',
        str(tmp_path)
    ],
                      env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
                      timeout=600).stdout
    runs = json.loads((tmp_path / 'results_tar.json').read_text())['runs']
    assert set(runs) == {'litdata@50%', 'mosaic-b20@50%'}
    for name, (result, ) in runs.items():
        for epoch in result['epochs']:
            # Every sample once an epoch, each its own bytes.
            assert (epoch['samples'], epoch['wrong']) == (120, 0), name
            assert 0 < epoch['spread'] < 1 and epoch['downloads'] > 0
        # Whole chunks / shards of 10 samples: a batch from few of them.
        assert result['epochs'][0]['batch_shard_share'] > 0.3, name
    assert '\nlitdata@50%' in out and '\nmosaic-b20@50%' in out


def test_planner_scale_is_measured_against_belady():
    # A look-ahead of 1/40 of an epoch still keeps Belady's 25%.
    out = run_script(f'{REPO_ROOT}/tools/benchmark_remote_cache.py', [
        '--planner-scale', '2e4', '--planner-horizon', '512'
    ],
                      env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
                      timeout=300).stdout
    row = out.strip().splitlines()[-1].split('|')
    assert row[1].strip() == '2e+04' and float(row[5]) >= 0.95


def test_window_state_is_the_kept_set_of_a_whole_run():
    # The simulated windows start from the kept set that a run from tick 0
    # has there: at epoch starts, within the samples kept from the epoch
    # before, across their end and past it.
    tool = load_tool('benchmark_remote_cache')
    from mmdata_plugin.remote_cache.stream_planner import StreamPlanner
    stream = tool._scale_stream(2000, 1, 3)
    planner = StreamPlanner(stream, 500, lambda sample: 1)
    for tick in (2000, 2001, 2300, 2499, 2500, 2501, 3200, 3999, 4000,
                 5100):
        planner.hits(tick)
        samples, untils = tool.one_node_belady_state(stream, 500, tick)
        kept = planner.cache.kept()
        assert sorted(zip(samples.tolist(), untils.tolist())) == [
            (sample, planner.cache.next_use(sample))
            for sample in kept.tolist()
        ], tick


def test_planner_windows_reach_belady():
    row = load_tool('benchmark_remote_cache').planner_window(4000, 3000)
    assert row['ticks'] == 3000 and row['hit_rate'] == row['belady']
    assert 0 < row['belady'] < 1 and row['kept_bytes'] > 0


def test_prefetcher_windows_reach_belady():
    # The prefetcher's books on the plan, downloads instant: within the
    # samples kept from epoch 1 every read hits, past them none.
    row = load_tool('benchmark_remote_cache').books_window(20_000, 2000, 1000)
    assert row['ticks'] == 1000 and row['hit_rate'] == row['belady'] == 0.5
    assert row['held'] > 0 and row['decisions_per_s'] > 0


def test_download_cpu_is_measured_clean_and_with_corrupt_bodies(tmp_path):
    out = run_script(f'{REPO_ROOT}/tools/benchmark_remote_cache.py', [
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
