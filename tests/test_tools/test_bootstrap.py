"""tools/bootstrap.py says what configs/downstream/ need where setuptools
has no pkg_resources (81 and later)."""
import importlib.util
import re

from helpers import load_tool


def test_missing_pkg_resources_is_named_with_what_to_install(monkeypatch):
    bootstrap = load_tool('bootstrap')
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


def test_every_present_stack_distribution_is_pinned(tmp_path):
    bootstrap = load_tool('bootstrap')
    present = {
        'torch': '2.1.2', 'numpy': '1.26.4', 'onedl-mmengine': '0.10.12',
        'onedl-mmcv': '2.3.6', 'opencv-python-headless': '4.10.0.84',
        'nvidia-cublas-cu12': '12.1.3.1', 'torchvision': '0.16.2',
        'requests': '2.32.0'
    }
    path = bootstrap.write_constraints(present, str(tmp_path))
    with open(path) as f:
        pins = set(f.read().split())
    assert pins == {f'{name}=={version}' for name, version in
                    present.items() if name != 'requests'}


def test_a_changed_or_doubled_stack_is_an_error():
    bootstrap = load_tool('bootstrap')
    before = {'torch': '2.1.2', 'numpy': '1.26.4',
              'onedl-mmengine': '0.10.12', 'requests': '2.32.0'}
    assert bootstrap.changed(before, dict(before, pytest='9.0')) == []
    assert bootstrap.changed(before, dict(before, requests='2.0')) == []
    assert bootstrap.changed(before, dict(before, numpy='2.4.6')) == [
        'numpy 1.26.4 -> 2.4.6']
    assert bootstrap.changed(before, dict(before, mmengine='0.10.7')) == [
        'mmengine installed beside onedl-mmengine (mmengine)']
    gone = dict(before)
    del gone['torch']
    assert bootstrap.changed(before, gone) == ['torch 2.1.2 -> removed']


def test_a_requirement_whose_module_is_present_is_left_out(monkeypatch):
    # mmcv-lite asks for the `mmengine` distribution; onedl-mmengine ships
    # the module, so asking pip for it would install a second one over it.
    bootstrap = load_tool('bootstrap')
    monkeypatch.setattr(
        bootstrap.importlib.metadata, 'requires', lambda name: [
            'addict', 'mmengine >=0.3.0', 'opencv-python >=3',
            'pytest; extra == "tests"'
        ])
    present = {'mmengine'}
    monkeypatch.setattr(bootstrap, 'has_module', present.__contains__)
    assert bootstrap.requirements_of('mmcv-lite') == [
        'addict', 'opencv-python >=3']
    present.add('cv2')
    assert bootstrap.requirements_of('mmcv-lite') == ['addict']


def test_the_bench_extra_adds_litdata_and_mosaic_without_their_requirements():
    # Their declared requirements pull another torch (CUDA), torchvision
    # and transformers: the two are installed --no-deps, and the extra
    # names only light imports, nothing of the stack.
    bootstrap = load_tool('bootstrap')
    assert bootstrap.no_deps_files('tests,mim') == []
    (no_deps, ) = bootstrap.no_deps_files('tests,bench')

    def names(path):
        with open(path) as f:
            lines = [line.split('#')[0].strip() for line in f]
        return [
            bootstrap.canonical(re.match(r'[A-Za-z0-9._-]+', line).group(0))
            for line in lines if line
        ]

    assert names(no_deps) == ['litdata', 'mosaicml-streaming']
    light = names(no_deps.replace('bench-no-deps.txt', 'bench.txt'))
    assert light and not any(bootstrap.protected(name) for name in light)
    assert not {'torchvision', 'transformers'} & set(light)
