"""Subprocesses started by the tests and tools see what their caller sees.

Where mmengine is found through ``PYTHONPATH`` (``pip install --target``),
a command given only the repository as its ``PYTHONPATH`` fails with "No
module named mmengine": the caller's entries must stay behind ours.
"""
import glob
import os
import os.path as osp
import re
import sys

from helpers import REPO_ROOT

from mmdata_plugin.testing import python_path, run_command

# A keyword argument or dict entry that sets PYTHONPATH to anything but
# python_path(...).
_REPLACED_PYTHONPATH = re.compile(r'\bPYTHONPATH\s*=\s*(?!python_path\()')


def test_subprocess_keeps_the_callers_python_path(tmp_path, monkeypatch):
    outer = tmp_path / 'outer'
    outer.mkdir()
    (outer / 'outer_only.py').write_text('NAME = "outer"\n')
    # prepended: the caller's own path may be where mmengine is
    monkeypatch.setenv('PYTHONPATH', str(outer), prepend=os.pathsep)
    out = run_command(
        [
            sys.executable, '-c',
            'import mmdata_plugin, outer_only; print(mmdata_plugin.__file__)'
        ],
        env=dict(PYTHONPATH=python_path(REPO_ROOT))).stdout
    assert out.strip() == osp.join(REPO_ROOT, 'mmdata_plugin', '__init__.py')


def test_no_inherited_path_adds_no_empty_entry(monkeypatch):
    # An empty entry would put the current directory on sys.path.
    monkeypatch.delenv('PYTHONPATH', raising=False)
    assert python_path('/a', '/b') == f'/a{os.pathsep}/b'
    monkeypatch.setenv('PYTHONPATH', '/c')
    assert python_path('/a') == f'/a{os.pathsep}/c'


def test_tests_and_tools_prepend_to_python_path():
    sources = glob.glob(osp.join(REPO_ROOT, 'tests', '**', '*.py'),
                        recursive=True) + glob.glob(
                            osp.join(REPO_ROOT, 'tools', '*.py'))
    replacing = []
    for path in sources:
        with open(path, encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                if _REPLACED_PYTHONPATH.search(line):
                    replacing.append(
                        f'{osp.relpath(path, REPO_ROOT)}:{number}: '
                        f'{line.strip()}')
    assert not replacing, (
        'PYTHONPATH replaced instead of prepended to (use '
        'mmdata_plugin.testing.python_path):\n' + '\n'.join(replacing))
