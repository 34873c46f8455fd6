"""tools/analyze_data_monitor.py and tools/benchmark_monitor_overhead.py."""
import os.path as osp
import sys

import pytest
from helpers import REPO_ROOT
from monitor_helpers import SleepyCollate, SleepyDataset, sleepy_pipeline
from torch.utils.data import DataLoader

from mmdata_plugin.data_monitor import measure_dataloader, save_report
from mmdata_plugin.testing import ProcessFailed, run_command

ANALYZE = osp.join(REPO_ROOT, 'tools', 'analyze_data_monitor.py')
BENCHMARK = osp.join(REPO_ROOT, 'tools', 'benchmark_monitor_overhead.py')


def test_analyze_rerenders_tables_and_plot(tmp_path, train_env):
    loader = DataLoader(
        SleepyDataset(num=24, pipeline=sleepy_pipeline((1, 2))),
        batch_size=2,
        collate_fn=SleepyCollate(1))
    report_path = str(tmp_path / 'data_monitor.json')
    save_report(measure_dataloader(loader, 12, warmup_iters=0), report_path)

    out = run_command([sys.executable, ANALYZE, report_path],
                      env=train_env).stdout
    assert 'Where the data time goes (rank 0, 11 steps' in out
    assert '  02_Sleep' in out
    assert 'Per worker (rank 0, ms per batch):' in out
    assert 'Input-bound: HIGH' in out
    assert osp.getsize(tmp_path / 'data_monitor.png') > 10_000

    with pytest.raises(ProcessFailed, match='the report has no rank 3'):
        run_command(
            [sys.executable, ANALYZE, report_path, '--rank', '3', '--no-plot'],
            env=train_env)


def test_overhead_benchmark_prints_the_median_ratio(demo_root, train_env):
    out = run_command([
        sys.executable, BENCHMARK, '--data-root', demo_root, '--rounds', '1',
        '--batches', '3', '--warmup', '1', '--fetch-rounds', '2',
        '--cfg-options', 'train_dataloader.batch_size=4'
    ],
                      env=train_env).stdout
    assert 'batch_size=4, num_workers=2; 1 rounds' in out
    assert 'round  1: plain' in out
    assert 'median ratio monitored/plain, samples per second: ' in out
    assert 'CPU per sample (workers + training process): plain' in out
    assert 'per sample in one process (2 alternating passes of 100)' in out
