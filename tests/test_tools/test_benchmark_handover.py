"""tools/benchmark_handover.py end to end, shrunk to tiny batches."""
import re

from helpers import REPO_ROOT

from mmdata_plugin.testing import cpu_env, python_path, run_script


def test_benchmark_reports_each_collate_and_the_fed_model():
    out = run_script(f'{REPO_ROOT}/tools/benchmark_handover.py', [
        '--device', 'cpu', '--batch-size', '8', '--size', '32',
        '--batches', '2', '--rounds', '1', '--samples', 'ready', '--feed',
        '--preprocess', '1'
    ],
                      env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
                      timeout=300).stdout
    assert 'batch 8 of 3x32x32 uint8 + a labelled data sample (ready)' in out
    for collate in ('pseudo_collate', 'default_collate', 'block_collate'):
        row = re.search(rf'^{collate}\s+(\d+)\s+[\d.]+\s+([\d.]+)\s+\d+\s+'
                        r'[\d.]+$', out, re.MULTILINE)
        assert row and int(row.group(1)) > 0, out
        fed = re.search(
            rf'^{collate} loader\s+(\d+)\s+[\d.]+%\s+[\d.]+% of the loader '
            'alone$', out, re.MULTILINE)
        assert fed and int(fed.group(1)) > 0, out
    assert re.search(r'^model alone \(batch in memory\)\s+\d+\s+100\.0%$',
                     out, re.MULTILINE), out
    assert re.search(r'^block batches placed beforehand\s+\d+\s+[\d.]+%$',
                     out, re.MULTILINE), out


def test_decoded_samples_are_jpegs_decoded_in_the_workers():
    out = run_script(f'{REPO_ROOT}/tools/benchmark_handover.py', [
        '--device', 'cpu', '--batch-size', '4', '--size', '32',
        '--batches', '2', '--rounds', '1', '--samples', 'decoded',
        '--jpeg-size', '96x64', '--collates', 'block'
    ],
                      env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
                      timeout=300).stdout
    assert '(decoded)' in out
    assert re.search(r'^block_collate\s+\d+\s+[\d.]+\s+1\.00$', out,
                     re.MULTILINE), out
