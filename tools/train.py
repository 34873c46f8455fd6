# Train a model from an mmengine config, on GPUs or on CPU.
import argparse
import logging
import os
import os.path as osp

import torch
from mmengine.config import Config, DictAction
from mmengine.logging import print_log
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmdata_plugin  # noqa: F401  (registers components, safe ckpt loading)
from mmdata_plugin.engine import apply_data_monitor_env
from mmdata_plugin.utils import (find_resumable_checkpoint,
                                 prepare_distributed, trust_checkpoint)
from mmdata_plugin.utils.tool_config import load_config


def parse_args():
    parser = argparse.ArgumentParser(
        description='Train a model with mmengine and mmdata_plugin')
    parser.add_argument(
        'config',
        help='train config file path, or a codebase\'s config by its scoped '
        'name (mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py)')
    parser.add_argument(
        '--work-dir', help='the dir to save logs and checkpoints')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from this checkpoint; without a path, resume from the '
        'latest checkpoint in the work dir')
    parser.add_argument(
        '--amp',
        action='store_true',
        help='mixed precision: fp16 AMP on GPU, bf16 autocast on CPU')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='scale the learning rate with the total batch size')
    parser.add_argument(
        '--trust-checkpoint',
        action='append',
        default=[],
        metavar='PATH_OR_URL',
        help='load this checkpoint (a file, or the URL / hub name it is '
        'loaded by) without weights_only restrictions; only for files you '
        'trust, e.g. written by stock mmengine; repeatable')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override settings of the config, key=value pairs, e.g. '
        'train_cfg.max_iters=100 train_dataloader.num_workers=4')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm'],
        default='none',
        help='job launcher')
    # torch.distributed.launch (used by `mim train --launcher pytorch`)
    # passes --local-rank; torchrun sets LOCAL_RANK instead.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def enable_amp(cfg: Config) -> None:
    optim_wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if optim_wrapper in ('AmpOptimWrapper', 'CPUAutocastOptimWrapper'):
        print_log(
            f'AMP is already enabled ({optim_wrapper}).',
            logger='current',
            level=logging.WARNING)
        return
    if optim_wrapper != 'OptimWrapper':
        raise ValueError(
            f'--amp only replaces a plain OptimWrapper, but the config uses '
            f'optim_wrapper.type={optim_wrapper!r}')
    if torch.cuda.is_available():
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.loss_scale = 'dynamic'
    else:
        cfg.optim_wrapper.type = 'CPUAutocastOptimWrapper'


def merge_args(cfg: Config, args) -> Config:
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    if args.amp:
        enable_amp(cfg)
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.get(
                'auto_scale_lr', {}):
            raise RuntimeError('--auto-scale-lr needs `auto_scale_lr.'
                               'base_batch_size` in the config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def choose_auto_resume(cfg: Config) -> list:
    """Point an automatic ``--resume`` at the newest readable checkpoint.

    Returns:
        list: ``(level, message)`` to log once the runner's logger exists.
    """
    path, skipped = find_resumable_checkpoint(cfg.work_dir)
    messages = [(logging.WARNING, f'--resume: skipping unreadable checkpoint '
                 f'{bad}: {why}') for bad, why in skipped]
    if path is None:
        cfg.resume = False
        messages.append((logging.WARNING if skipped else logging.INFO,
                         f'--resume: no readable checkpoint in '
                         f'{cfg.work_dir}; training starts from scratch.'))
    else:
        cfg.load_from = path
        if skipped:
            messages.append(
                (logging.WARNING, f'--resume: resuming from {path}, the '
                 'newest readable checkpoint.'))
    return messages


def main():
    args = parse_args()
    for path in args.trust_checkpoint:
        trust_checkpoint(path)
    cfg = merge_args(load_config(args.config), args)
    resume_messages = choose_auto_resume(cfg) if args.resume == 'auto' else []
    apply_data_monitor_env(cfg)
    prepare_distributed(cfg, args.launcher)
    if 'runner_type' in cfg:
        runner = RUNNERS.build(cfg)
    else:
        runner = Runner.from_cfg(cfg)
    for level, message in resume_messages:
        runner.logger.log(level, message)
    runner.train()


if __name__ == '__main__':
    main()
