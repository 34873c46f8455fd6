"""`mim train mmdata_plugin CONFIG` from an unrelated directory.

The package is installed (not linked) into a fresh target folder, as a user's
`pip install` would, so the test also checks that tools/ and configs/ ship in
the package's .mim folder.
"""
import os.path as osp
import shutil
import subprocess
import sys

import pytest
from helpers import REPO_ROOT, quick_cfg_options

from mmdata_plugin.testing import cpu_env, python_path, run_command

mim = shutil.which('mim')


@pytest.mark.skipif(
    mim is None, reason='openmim not installed (extra "mim"; make test has it)')
def test_mim_train_from_any_directory(tmp_path, demo_root):
    site = tmp_path / 'site'
    subprocess.run([
        sys.executable, '-m', 'pip', 'install', '-q', '--no-deps',
        '--no-build-isolation', '--target',
        str(site), REPO_ROOT
    ],
                   check=True)
    assert osp.isfile(site / 'mmdata_plugin' / '.mim' / 'tools' / 'train.py')
    cwd = tmp_path / 'elsewhere'
    cwd.mkdir()
    out = run_command(
        [
            mim, 'train', 'mmdata_plugin', 'tinycnn_demo-jpeg.py',
            '--work-dir',
            str(tmp_path / 'work')
        ] + quick_cfg_options(max_iters=2, interval=2),
        env=cpu_env(
            dict(
                PYTHONPATH=python_path(str(site)),
                MMDATA_DEMO_ROOT=demo_root)),
        cwd=str(cwd)).stdout
    assert str(site / 'mmdata_plugin' / '.mim' / 'tools' / 'train.py') in out
    assert osp.isfile(tmp_path / 'work' / 'iter_2.pth')
