"""tools/benchmark_raw_arrays.py end to end, shrunk to a few small arrays."""
import re

from helpers import REPO_ROOT

from mmdata_plugin.testing import cpu_env, python_path, run_script


def test_benchmark_checks_bytes_and_reports_every_loader(tmp_path):
    out = run_script(f'{REPO_ROOT}/tools/benchmark_raw_arrays.py', [
        '--samples', '8', '--shape', '64,64,3', '--dtype', 'uint8',
        '--batch-size', '2', '--repeats', '1', '--work-dir',
        str(tmp_path)
    ],
                      env=cpu_env(dict(PYTHONPATH=python_path(REPO_ROOT))),
                      timeout=300).stdout
    assert '8 arrays of uint8 (64, 64, 3) (0.01 MB each' in out
    for loader in ('LoadNumpyFromFile', 'np.load', 'pickle.load',
                   'np.load+from_numpy', 'LoadNumpyFromFile, node cache'):
        # median, min, max MB/s, ratio; MB per CPU-second, ratio
        row = re.search(rf'^{re.escape(loader)}\s+([\d.]+)\s+[\d.]+\s+'
                        r'[\d.]+\s+[\d.]+x\s+(\d+)\s+[\d.]+x$', out,
                        re.MULTILINE)
        assert row and float(row.group(1)) > 0, out
    assert re.search(
        r'^goal: >= 600 MB/s with 2 workers -> \d+ MB/s from local files, '
        r'\d+ MB/s from the node cache, (NOT )?met; at \d+ '
        r'MB per CPU-second, \d+ idle CPUs would bound it at \d+ MB/s$', out,
        re.MULTILINE)
    assert len(list(tmp_path.glob('*.npy'))) == 8
