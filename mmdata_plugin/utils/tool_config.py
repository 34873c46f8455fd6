"""Config handling shared by the tools that build a config's dataset or
DataLoader without a model (``tools/benchmark_dataloader.py``,
``tools/compare_decoders.py``)."""
import argparse
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
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if cfg.get('default_scope'):
        init_default_scope(cfg.default_scope)
    key = f'{split}_dataloader'
    if not cfg.get(key):
        raise SystemExit(f'{path} has no {key}')
    return cfg, cfg[key]
