"""Config handling shared by the tools that build a config's dataset or
DataLoader without a model (``tools/benchmark_dataloader.py``,
``tools/compare_decoders.py``)."""
import argparse
import importlib.metadata
import importlib.util
import os.path as osp
from typing import Optional, Tuple

from mmengine.config import Config, ConfigDict, DictAction
from mmengine.registry import init_default_scope

from .torch_internals import package_and_cfg_path

SPLITS = ('train', 'val', 'test')
#: What a user whose environment lacks ``pkg_resources`` must install.
PKG_RESOURCES_HINT = (
    "mmengine 0.10 resolves `_base_ = 'PKG::...'` (configs/downstream/) "
    'with pkg_resources, which setuptools 81 removed: pip install '
    "'setuptools>=77,<81' (this package's `mim` extra pins it)")


def add_dataloader_arguments(parser: argparse.ArgumentParser) -> None:
    """``--split`` (which ``*_dataloader``) and ``--cfg-options``."""
    parser.add_argument(
        '--split',
        choices=SPLITS,
        default='train',
        help='which dataloader of the config (train)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override settings of the config, key=value pairs')


def load_dataloader_config(
        path: str,
        split: str = 'train',
        cfg_options: Optional[dict] = None) -> Tuple[Config, ConfigDict]:
    """The config as the Runner sees it, and its ``{split}_dataloader``.

    Custom imports are done by ``Config.fromfile``; the overrides are
    merged and the config's default scope is set, so that ``type=`` names
    resolve as in training.

    Raises:
        SystemExit: If the config has no such dataloader (names both).
    """
    cfg = load_config(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if cfg.get('default_scope'):
        init_default_scope(cfg.default_scope)
    key = f'{split}_dataloader'
    if not cfg.get(key):
        raise SystemExit(f'{path} has no {key}')
    return cfg, cfg[key]


def load_config(path: str) -> Config:
    """``Config.fromfile`` of a file or a codebase's scoped config name.

    Raises:
        SystemExit: If the config inherits a scoped name and mmengine cannot
            resolve it for want of ``pkg_resources`` (says what to install).
    """
    try:
        return Config.fromfile(resolve_config_path(path))
    except ModuleNotFoundError as error:
        if error.name != 'pkg_resources':
            raise
        raise SystemExit(f'{path}: {PKG_RESOURCES_HINT}') from None


def resolve_config_path(path: str) -> str:
    """The file of a config named like a ``_base_`` entry of another
    codebase (``mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py``): the
    codebase's ``.mim/configs`` folder, found with ``importlib.metadata``
    (mmengine's helpers need ``pkg_resources``, gone from setuptools 81).

    ``Config.fromfile`` resolves that syntax only inside ``_base_``, and
    mmengine's public ``get_config`` would pip-install a missing package.

    Raises:
        SystemExit: If the codebase is not installed or has no such config
            (names both).
    """
    if '::' not in path or osp.isfile(path):
        return path
    package, relative = package_and_cfg_path(path)
    folder = _module_folder(package, path.split('::')[0])
    if folder is None:
        raise SystemExit(f'{path}: the package {package} is not installed')
    config = osp.join(folder, '.mim', 'configs', relative)
    if not osp.isfile(config):
        raise SystemExit(f'{path}: {package} has no such config ({config})')
    return config


def _module_folder(package: str, module: str) -> Optional[str]:
    """The folder of ``module`` of the distribution ``package``, else
    None."""
    try:
        folder = str(
            importlib.metadata.distribution(package).locate_file(module))
        if osp.isdir(folder):
            return folder
    except importlib.metadata.PackageNotFoundError:
        pass
    # editable installs and PYTHONPATH: no distribution file next to it
    spec = importlib.util.find_spec(module)
    return osp.dirname(spec.origin) if spec and spec.origin else None
