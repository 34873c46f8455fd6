"""The stack check at import: what is refused, what is warned about."""
import subprocess
import sys

import pytest
from helpers import REPO_ROOT

from mmdata_plugin import supported_stack
from mmdata_plugin.supported_stack import (UnsupportedStackError, check_stack,
                                           parse_version, stack_problems)

SUPPORTED = dict(
    torch='2.13.0+cpu', numpy='2.4.6', mmengine='0.10.7', mmcv='2.2.0',
    cv2='4.11.0')


def _stack(monkeypatch, distributions=None, **versions):
    """Make ``module_version`` report ``versions`` (None: not installed)."""
    found = dict(SUPPORTED, **versions)
    monkeypatch.setattr(supported_stack, 'module_version', found.get)
    monkeypatch.setattr(supported_stack.importlib.util, 'find_spec',
                        lambda name, *args: None
                        if found.get(name) is None else object())
    if distributions is not None:
        monkeypatch.setattr(supported_stack, 'installed_distributions',
                            lambda module: distributions.get(module, []))


def test_versions_parse_with_local_and_pre_release_tags():
    assert parse_version('2.1.2+cu121') == (2, 1, 2)
    assert parse_version('2.0.0rc4') == (2, 0, 0)
    assert parse_version('0.10.12') == (0, 10, 12)
    with pytest.raises(ValueError, match='not a version'):
        parse_version('unknown')


def test_the_supported_stacks_pass(monkeypatch):
    for versions in (
            dict(torch='2.1.2', numpy='1.26.4', mmengine='0.10.3',
                 mmcv='2.1.0'),
            dict(torch='2.13.0', numpy='2.4.6', mmengine='0.10.12',
                 mmcv='2.3.6'),
            dict(torch='2.14.1', numpy='2.4.6', mmengine='0.10.7'),
    ):
        _stack(monkeypatch, **versions)
        assert stack_problems() == [], versions


@pytest.mark.parametrize('versions, named', [
    (dict(torch='2.0.1'), ['torch 2.0.1 is installed', '>= 2.1']),
    (dict(torch=None), ['torch is not installed']),
    (dict(torch='2.1.2', numpy='2.4.6'),
     ['numpy 2.4.6 is installed under torch 2.1.2', "'numpy<2'"]),
    (dict(mmengine='0.9.1'), ['mmengine 0.9.1', '>= 0.10.3, < 0.11']),
    (dict(mmengine='1.0.0'), ['mmengine 1.0.0']),
    (dict(mmengine=None), ['mmengine is not installed', 'onedl-mmengine']),
    (dict(mmcv='1.7.2'), ['mmcv 1.7.2', '>= 2.0.0, < 2.4']),
    (dict(mmcv=None), ['mmcv is not installed', '--no-deps mmcv-lite']),
    (dict(cv2=None), ['cv2 is not installed', 'opencv-python']),
])
def test_an_unsupported_stack_is_named_with_the_range_and_the_fix(
        monkeypatch, versions, named):
    _stack(monkeypatch, **versions)
    with pytest.raises(UnsupportedStackError) as error:
        check_stack()
    message = str(error.value)
    for text in named + ['docs/compatibility.md']:
        assert text in message, message


def test_every_problem_is_listed_at_once(monkeypatch):
    _stack(monkeypatch, torch='1.13.1', numpy='1.26.4', mmengine='0.8.0',
           cv2=None)
    with pytest.raises(UnsupportedStackError) as error:
        check_stack()
    assert str(error.value).count('\n  - ') == 3


def test_a_module_installed_by_two_distributions_is_warned_about(
        monkeypatch):
    _stack(
        monkeypatch,
        distributions=dict(
            mmengine=['mmengine 0.10.7', 'onedl-mmengine 0.10.12']))
    with pytest.warns(UserWarning,
                      match='mmengine is installed by mmengine 0.10.7 and '
                      'onedl-mmengine 0.10.12'):
        check_stack()


def test_a_newer_torch_than_tested_runs_with_a_warning(monkeypatch):
    _stack(monkeypatch, distributions={}, torch='2.15.0')
    with pytest.warns(UserWarning, match='torch 2.15.0 is newer than the '
                      'newest tested'):
        check_stack()


def test_the_installed_stack_is_read_from_the_distributions():
    # This process's own stack, read as the import reads it.
    import mmengine
    import torch
    assert parse_version(supported_stack.module_version('torch')) == (
        parse_version(torch.__version__))
    assert supported_stack.module_version('mmengine') == mmengine.__version__
    assert supported_stack.module_version('no_such_module_here') is None


def test_the_check_runs_before_the_package_imports_torch():
    # A stack the check refuses must not first fail inside a submodule:
    # with torch made unimportable, the message is the check's.
    code = ('import sys; sys.modules["torch"] = None\n'
            'try:\n    import mmdata_plugin\n'
            'except ImportError as error:\n    print(type(error).__name__)')
    out = subprocess.run([sys.executable, '-c', code], cwd=REPO_ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == 'UnsupportedStackError', out
