"""tools/benchmark_dataloader.py on the demo config, run for real."""
import json
import os.path as osp
import re
import statistics

from helpers import DEMO_CONFIG, REPO_ROOT

from mmdata_plugin.data_monitor import recommend_workers
from mmdata_plugin.testing import run_script

TOOL = osp.join(REPO_ROOT, 'tools', 'benchmark_dataloader.py')


def _row(out, name):
    match = re.search(rf'^{re.escape(name)}\s+(.*)$', out, re.MULTILINE)
    assert match, f'no row {name!r} in\n{out}'
    return match.group(1).split()


def test_one_worker_count_prints_throughput_and_stage_breakdown(
        train_env, tmp_path):
    # an empty head cache: reads and decodes happen, so they are measured
    train_env = dict(train_env, MMDATA_CACHE_DIR=str(tmp_path / 'cache'))
    out = run_script(TOOL, [DEMO_CONFIG, '--num-batches', '6', '--warmup',
        '1', '--repeats', '1', '--cfg-options', 'train_dataloader.batch_size=4'
    ],
                      env=train_env).stdout
    assert ('RankShardedDataset: 64 samples' in out
            and 'batch_size=4, sampler RankShardedInfiniteSampler' in out)
    assert 'num_workers=2 (the median run' in out  # the config's count
    samples, batches = re.search(
        r'^Throughput: ([\d.]+) samples/s, ([\d.]+) batches/s', out,
        re.MULTILINE).groups()
    assert float(batches) > 0
    assert abs(float(samples) - 4 * float(batches)) < 0.1  # rounding
    assert 'Where the data time goes (rank 0, 6 steps;' in out
    # Read, decode, every transform (the demo's cached head), collate,
    # and the training process's wait and transfer.
    for stage in ('file read (io)', 'image decode',
                  '  00_CachedPipelineHead', '  01_RandomResize',
                  '  04_PackImageLabelInputs',
                  'collate', 'transfer (training process)',
                  'wait (training process)'):
        mean, p50, p90 = (float(v) for v in _row(out, stage)[:3])
        assert mean >= 0 and p90 >= p50 >= 0
    per_worker = re.findall(r'^([01]) +\d+ +(\d+) ', out, re.MULTILINE)
    assert sum(int(batches) for _, batches in per_worker) == 6
    assert re.search(r'^Bottleneck: .* of (worker|step) time\)\.$', out,
                     re.MULTILINE)


def test_worker_sweep_table_and_recommendation(tmp_path, train_env):
    results = tmp_path / 'sweep.json'
    out = run_script(TOOL, [DEMO_CONFIG, '--split', 'val', '--workers',
        '1,0', '--num-batches', '5', '--warmup', '1', '--repeats', '2',
        '--out',
        str(results), '--cfg-options', 'val_dataloader.batch_size=8'
    ],
                      env=train_env).stdout
    assert 'val_dataloader of' in out and 'batch_size=8' in out
    rows = json.loads(results.read_text())['rows']
    assert [row['workers'] for row in rows] == [0, 1]
    for row in rows:
        assert row['runs'] == 2 and len(row['batches_per_s_runs']) == 2
        assert row['batches_per_s'] == statistics.median(
            row['batches_per_s_runs'])
        cells = _row(out, str(row['workers']))
        assert float(cells[1]) == round(row['batches_per_s'], 2)
        assert cells[3].endswith('%')  # the training process's wait share
    best = recommend_workers({r['workers']: r['batches_per_s'] for r in rows})
    assert (f'Recommended: num_workers={best}, the smallest count within 5% '
            'of the best') in out
    assert f'num_workers={best} (the median run' in out
