"""The config loading shared by benchmark_dataloader and compare_decoders."""
import argparse
import sys

import pytest

from mmdata_plugin.utils.tool_config import (add_dataloader_arguments,
                                             load_dataloader_config,
                                             resolve_config_path)


def test_split_overrides_and_missing_dataloader(tmp_path):
    config = tmp_path / 'cfg.py'
    config.write_text("train_dataloader = dict(batch_size=2, num_workers=1)\n"
                      "val_dataloader = dict(batch_size=4)\n")
    parser = argparse.ArgumentParser()
    add_dataloader_arguments(parser)
    args = parser.parse_args(
        ['--split', 'val', '--cfg-options', 'val_dataloader.batch_size=8'])

    cfg, loader_cfg = load_dataloader_config(
        str(config), args.split, args.cfg_options)
    assert loader_cfg.batch_size == 8
    assert cfg.train_dataloader.num_workers == 1
    assert parser.parse_args([]).split == 'train'

    with pytest.raises(SystemExit, match=r'cfg\.py has no test_dataloader'):
        load_dataloader_config(str(config), 'test')


@pytest.fixture
def without_pkg_resources(monkeypatch):
    """An environment with setuptools >= 81: no pkg_resources to import."""
    monkeypatch.setitem(sys.modules, 'pkg_resources', None)


def _fake_codebase(site, package='mmpretrain', version='1.2.0'):
    """A codebase installed the way pip installs it: a module folder with
    its .mim/configs, and a dist-info naming the distribution."""
    config = site / package / '.mim' / 'configs' / 'resnet' / 'toy.py'
    config.parent.mkdir(parents=True)
    (site / package / '__init__.py').write_text('')
    config.write_text("train_dataloader = dict(batch_size=3)\n")
    info = site / f'{package}-{version}.dist-info'
    info.mkdir()
    (info / 'METADATA').write_text(
        f'Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n')
    return str(config)


def test_scoped_names_resolve_without_pkg_resources(tmp_path, monkeypatch,
                                                    without_pkg_resources):
    config = _fake_codebase(tmp_path / 'site')
    # (not syspath_prepend: it imports pkg_resources)
    monkeypatch.setattr(sys, 'path', [str(tmp_path / 'site')] + sys.path)
    assert resolve_config_path('mmpretrain::resnet/toy.py') == config
    _, loader_cfg = load_dataloader_config('mmpretrain::resnet/toy.py')
    assert loader_cfg.batch_size == 3
    with pytest.raises(SystemExit, match=r'mmpretrain has no such config'):
        resolve_config_path('mmpretrain::resnet/missing.py')
    with pytest.raises(SystemExit, match=r'mmagic is not installed'):
        resolve_config_path('mmagic::any/config.py')


def test_inheriting_a_scoped_name_without_pkg_resources_says_what_to_install(
        tmp_path, without_pkg_resources):
    config = tmp_path / 'recipe.py'
    config.write_text("_base_ = 'mmdet::mask_rcnn/x.py'\n")
    with pytest.raises(SystemExit,
                       match=r"recipe\.py: mmengine 0\.10 .*'setuptools>=77,"
                       r"<81'"):
        load_dataloader_config(str(config))
