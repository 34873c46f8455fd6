"""Config handling shared by the tools that build a config's dataset or
DataLoader without a model (``tools/benchmark_dataloader.py``,
``tools/compare_decoders.py``)."""
import argparse
import os.path as osp
from typing import Optional, Tuple

from mmengine.config import Config, ConfigDict, DictAction
from mmengine.registry import init_default_scope

SPLITS = ('train', 'val', 'test')


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
    cfg = Config.fromfile(resolve_config_path(path))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if cfg.get('default_scope'):
        init_default_scope(cfg.default_scope)
    key = f'{split}_dataloader'
    if not cfg.get(key):
        raise SystemExit(f'{path} has no {key}')
    return cfg, cfg[key]


def resolve_config_path(path: str) -> str:
    """The file of a config named like a ``_base_`` entry of another
    codebase (``mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py``).

    ``Config.fromfile`` resolves that syntax only inside ``_base_``.
    mmengine's public ``get_config`` would pip-install a missing package, so
    its two path helpers are used instead (private; only here).

    Raises:
        SystemExit: If the codebase is not installed (names it).
    """
    if '::' not in path or osp.isfile(path):
        return path
    from mmengine.config.utils import (_get_external_cfg_base_path,
                                       _get_package_and_cfg_path)
    from mmengine.utils import get_installed_path, is_installed
    package, relative = _get_package_and_cfg_path(path)
    if not is_installed(package):
        raise SystemExit(f'{path}: the package {package} is not installed')
    return _get_external_cfg_base_path(get_installed_path(package), relative)
