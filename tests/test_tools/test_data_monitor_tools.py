"""tools/analyze_data_monitor.py and tools/benchmark_monitor_overhead.py."""
import os.path as osp
import re
import sys

import pytest
from helpers import REPO_ROOT
from monitor_helpers import SleepyCollate, SleepyDataset, sleepy_pipeline
from torch.utils.data import DataLoader

from mmdata_plugin.data_monitor import measure_dataloader, save_report
from mmdata_plugin.testing import ProcessFailed, run_command, run_script

ANALYZE = osp.join(REPO_ROOT, 'tools', 'analyze_data_monitor.py')
BENCHMARK = osp.join(REPO_ROOT, 'tools', 'benchmark_monitor_overhead.py')


def test_analyze_rerenders_tables_and_plot(tmp_path, train_env):
    loader = DataLoader(
        SleepyDataset(num=24, pipeline=sleepy_pipeline((1, 2))),
        batch_size=2,
        collate_fn=SleepyCollate(1))
    report_path = str(tmp_path / 'data_monitor.json')
    save_report(measure_dataloader(loader, 12, warmup_iters=0), report_path)

    out = run_script(ANALYZE, [report_path],
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
    out = run_script(BENCHMARK, ['--data-root', demo_root, '--rounds', '1',
        '--chunk-seconds', '0.02', '--warmup', '2', '--process-rounds', '2',
        '--steady-rounds', '1', '--steady-batches', '3', '--steady-warmup',
        '4', '--steady-seconds', '0.05', '--idle-seconds', '0.01',
        '--cold-steps', '50', '--sweep-mb', '1',
        '--cfg-options', 'train_dataloader.batch_size=4'
    ],
                      env=train_env).stdout
    assert 'cheap: batch_size=32, 2 workers per loader; 1 rounds' in out
    assert 'demo: batch_size=4, 2 workers per loader; 1 rounds' in out
    assert out.count('throughput ratio monitored/plain per round: ') == 2
    assert out.count('CPU per sample (workers + training process)') == 2
    # Chunks sized from the warm-up's rate.
    assert len(re.findall(r'^  \d+ batches per chunk; timed batches: ', out,
                          re.M)) == 2
    assert out.count('batch fetch per sample, CPU: plain') == 2
    # The monitor's work counted: an untimed batch's calls do not depend on
    # the pipeline (a test of the loader monitor checks they do not grow
    # with the batch), a timed batch's do.
    untimed = re.findall(
        r"^  the monitor's calls \(its functions and the builtins they "
        r'call\) per batch: untimed (\d+), timed (\d+)$', out, re.M)
    assert len(untimed) == 2 and untimed[0][0] == untimed[1][0], out
    assert all(int(timed) > int(plain) for plain, timed in untimed)
    assert len(re.findall(
        r'^  monitor per batch of zero-cost samples: [-\d.]+ us CPU '
        r'\([-\d.]+ us per sample at batch \d+\)$', out, re.M)) == 2
    # Per sample over a run (one batch in K timed), the demo config's too:
    # accounted from its parts and measured on the whole path.
    assert len(re.findall(
        r'^  monitor per sample, accounted \(K=\d+\): [-\d.]+ us = per '
        r'batch [-\d.]+ \+ timed batch [-\d.]+$', out, re.M)) == 2
    assert len(re.findall(
        r'^  monitor per sample, measured in one process, 2 rounds of K=\d+ '
        r'batch pairs: [-+\d.]+ us of [\d.]+ us \(IQR [-+\d.]+\.\.'
        r'[-+\d.]+ us\); two plain loaders the same way: [-+\d.]+ us '
        r'\(IQR [-+\d.]+\.\.[-+\d.]+ us\)$', out, re.M)) == 2
    # The whole hook at steady state (here: a few batches past 4).
    assert len(re.findall(
        r'^  steady state, DataMonitorHook\(.*\) past the sampling ramp '
        r'\(K=\d+\), 1 rounds of 3-batch chunks, 6 monitored batches, \d+ '
        r'refreshes: [-+\d.]+ us CPU per sample of [\d.]+ us \(IQR of the '
        r'rounds [-+\d.]+\.\.[-+\d.]+ us\), wall [-+\d.]+ us; longest '
        r'after_train_iter [\d.]+ ms, longest refreshing one [\d.]+ ms '
        r"\([\d.]+ ms of its thread's CPU\), longest before_train_iter "
        r"\(it sends the timeline's points\) [\d.]+ ms \([\d.]+ ms of its "
        r"thread's CPU\); garbage collections: plain "
        r'\d+ \([\d.]+ ms\), monitored \d+ \([\d.]+ ms\)$',
        out, re.M)) == 2, out
    assert len(re.findall(
        r'^  steady state accounted, 0.05 s uninterrupted \(\d+ batches, '
        r"\d+ refreshes\): the hook's calls [-\d.]+ us \(of which the "
        r"visualizer's backends [\d.]+ us; the clock's own [\d.]+ us "
        r'subtracted\) \+ its writer thread [\d.]+ us = [-\d.]+ '
        r'us CPU per sample$', out, re.M)) == 2, out
    # The hook's calls with the caches swept before each, against
    # mmengine's Hook, whose calls do nothing.
    assert len(re.findall(
        r'^  per step with cold caches \(1 MB swept before each call; 50 '
        r"steps\), CPU: DataMonitorHook [\d.]+ us, mmengine's Hook \(its "
        r'calls do nothing\) [\d.]+ us in the median step: [-+\d.]+ us; '
        r'amortised \(steps in groups of 50, the median group\) [\d.]+ and '
        r'[\d.]+ us: [-+\d.]+ us a step, [-+\d.]+ us per sample at batch '
        r'(32|4)$', out, re.M)) == 2, out
    assert re.search(
        r'^this machine: a small call after 0.01 s idle costs [\d.]+ ms of '
        r'CPU, again at once [\d.]+ us \(median of 3\)', out, re.M), out
    for case in ('cheap', 'demo'):
        assert re.search(
            rf'^{case} +\d+\.\d{{3}} \(\d+\.\d{{3}}\.\.\d+\.\d{{3}}\) '
            r'>=0\.99 +\d+\.\d{3} +[\d.]+ us +[-\d.]+ us \(K=\d+ *\) +'
            r'[-+\d.]+ us \([-+\d.]+\.\.[-+\d.]+ us; plain/plain '
            r'[-+\d.]+ us\) +[-\d.]+ us +[\d.]+ us CPU +[-+\d.]+ us +'
            r'[\d.]+ us +[\d.]+ ms$', out, re.M), out
