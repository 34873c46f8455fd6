"""tools/bootstrap.py says what configs/downstream/ need where setuptools
has no pkg_resources (81 and later)."""
import importlib.util
import os.path as osp

from helpers import REPO_ROOT


def _bootstrap():
    spec = importlib.util.spec_from_file_location(
        'bootstrap', osp.join(REPO_ROOT, 'tools', 'bootstrap.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_pkg_resources_is_named_with_what_to_install(monkeypatch):
    bootstrap = _bootstrap()
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, 'find_spec', lambda name, *args:
        None if name == 'pkg_resources' else find_spec(name, *args))
    note = bootstrap.pkg_resources_note()
    assert "_base_ = 'PKG::...'" in note
    assert "pip install 'setuptools>=77,<81'" in note
    monkeypatch.setattr(importlib.util, 'find_spec', find_spec)
    if find_spec('pkg_resources') is not None:
        assert bootstrap.pkg_resources_note() is None
