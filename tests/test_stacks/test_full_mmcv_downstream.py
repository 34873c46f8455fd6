"""mmdet's and mmpretrain's own configs and train scripts, on the full mmcv
(onedl-mmcv built with its compiled ops), turned to our components by the
recipes in configs/downstream/: trained on CPU, SIGKILLed after a
checkpoint, resumed, and compared batch by batch with an uninterrupted run.

Real models (Mask R-CNN with a ResNet-18, ResNet-18 classification), so
this needs the built stack; without it the tests are reported as skipped
with what is missing. How to build it: docs/compatibility_full_mmcv.md.
"""
import importlib
import json
import os.path as osp
import signal
import sys

import cv2
import numpy as np
import pytest
from downstream_toys import make_toy_coco
from helpers import REPO_ROOT

from mmdata_plugin.testing import (cpu_env, python_path, run_command,
                                   run_until_checkpoint_then_kill)

TESTS = osp.dirname(osp.dirname(osp.abspath(__file__)))
RECIPES = osp.join(REPO_ROOT, 'configs', 'downstream')
DUMP_TOOL = osp.join(REPO_ROOT, 'tools', 'dump_data_list.py')
CLASSES = ['cat', 'dog', 'bird']


def _missing(package):
    """Why ``package``'s real training cannot run here, or None."""
    try:
        importlib.import_module('mmcv.ops')
    except Exception as error:  # mmcv-lite has no ops; a lite build no _ext
        return (f'mmcv.ops does not import ({error!r}): needs onedl-mmcv '
                'built with MMCV_WITH_OPS=1')
    try:
        module = importlib.import_module(package)
        # What a training imports (mmpretrain's transforms need torchvision)
        importlib.import_module(f'{package}.datasets')
    except Exception as error:  # ImportError, or its mmcv version check
        return f'{package} does not import ({error!r})'
    script = osp.join(osp.dirname(module.__file__), '.mim', 'tools',
                      'train.py')
    if not osp.isfile(script):
        return f'{package} was installed without its .mim tools ({script})'
    return None


@pytest.fixture
def stack_env(request, train_env):
    package = request.param
    reason = _missing(package)
    if reason:
        pytest.skip(reason)
    module = importlib.import_module(package)
    script = osp.join(osp.dirname(module.__file__), '.mim', 'tools',
                      'train.py')
    return script, dict(train_env, PYTHONPATH=python_path(REPO_ROOT, TESTS))


def _probe(work_dir):
    with open(osp.join(work_dir, 'probe.jsonl')) as file:
        return {r['iter']: r for r in map(json.loads, file)}


def _assert_resume_is_exact(script, config, tmp_path, env, num_iters):
    full, killed, resumed = (str(tmp_path / name)
                             for name in ('full', 'killed', 'resumed'))
    run_command([sys.executable, script, config, '--work-dir', full],
                env=env, timeout=1800)
    with open(tmp_path / 'killed.log', 'w') as log:
        code = run_until_checkpoint_then_kill(
            [sys.executable, script, config, '--work-dir', killed],
            killed, 'iter_3.pth', env=cpu_env(env), timeout=1800, stdout=log)
    assert code == -signal.SIGKILL, (tmp_path / 'killed.log').read_text()
    log = run_command([
        sys.executable, script, config, '--work-dir', resumed, '--resume',
        osp.join(killed, 'iter_3.pth')
    ], env=env, timeout=1800).stdout
    assert 'Fast resume: skipped 3 batches' in log, log[-5000:]
    reference, rest = _probe(full), _probe(resumed)
    assert sorted(reference) == list(range(num_iters))
    assert sorted(rest) == list(range(3, num_iters))
    for it in rest:
        assert rest[it] == reference[it], f'iteration {it}'


COMMON = """
custom_imports = dict(imports=['mmdata_plugin', 'downstream_toys'],
                      allow_failed_imports=False)
train_cfg = dict(max_epochs=2, val_interval=10)
val_cfg = val_dataloader = val_evaluator = None
test_cfg = test_dataloader = test_evaluator = None
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=3),
                     logger=dict(interval=1))
custom_hooks = [
    dict(type='DataMonitorHook', interval=2),
    dict(type='DeviceFeedHook'),
    dict(type='SampleProbeHook'),
]
randomness = dict(seed=5)
"""


@pytest.mark.parametrize('stack_env', ['mmdet'], indirect=True)
def test_mask_rcnn_killed_and_resumed_through_mmdet_train(tmp_path,
                                                          stack_env):
    script, env = stack_env
    root = str(tmp_path / 'coco')
    make_toy_coco(root, num_images=16)
    out = osp.join(root, 'annotations', 'instances_train.jsonl')
    dumped = run_command([
        sys.executable, DUMP_TOOL,
        'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', out, '--check', '7',
        '--cfg-options', f'train_dataloader.dataset.data_root={root}/',
        'train_dataloader.dataset.ann_file=annotations/train.json',
        'train_dataloader.dataset.data_prefix.img=images/',
        "train_dataloader.dataset.metainfo.classes=['cat','dog','bird']"
    ], env=env).stdout
    # Mask R-CNN's filter_cfg (min_size=32) keeps 7 of the 16 images.
    assert f'{out}: 7 samples of CocoDataset' in dumped
    config = tmp_path / 'mask_rcnn.py'
    recipe = osp.join(RECIPES, 'mask-rcnn_r50_fpn_1x_coco_rank-sharded.py')
    # ResNet-18 without pretrained weights and small images: a CPU run that
    # needs no download; RoIAlign and the mask head still run mmcv's ops.
    config.write_text(f"""
_base_ = [{recipe!r}]
{COMMON}
model = dict(backbone=dict(depth=18, init_cfg=None),
             neck=dict(in_channels=[64, 128, 256, 512]))
train_dataloader = dict(batch_size=2, num_workers=2, dataset=dict(
    data_root={root + '/'!r}, ann_file='annotations/instances_train.jsonl',
    data_prefix=dict(img_path='images/'), metainfo=dict(classes={CLASSES}),
    pipeline=[
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
        dict(type='Resize', scale=(128, 96), keep_ratio=True),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackDetInputs'),
    ]))
""")
    # 7 samples in batches of 2 per epoch (the last one short): 8 iters.
    _assert_resume_is_exact(script, str(config), tmp_path, env, num_iters=8)


def _make_class_folder(root, num_images=8, seed=0):
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(num_images):
        height, width = (int(v) for v in rng.integers(36, 48, 2))
        name = f'img_{i:03d}.png'
        cv2.imwrite(osp.join(root, 'train', name),
                    rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
        lines.append(f'{name} {i % len(CLASSES)}\n')
    with open(osp.join(root, 'meta', 'train.txt'), 'w') as file:
        file.writelines(lines)


@pytest.mark.parametrize('stack_env', ['mmpretrain'], indirect=True)
def test_resnet_killed_and_resumed_through_mmpretrain_train(tmp_path,
                                                            stack_env):
    script, env = stack_env
    root = tmp_path / 'imagenet'
    (root / 'train').mkdir(parents=True)
    (root / 'meta').mkdir()
    _make_class_folder(str(root))
    config = tmp_path / 'resnet.py'
    recipe = osp.join(RECIPES, 'resnet50_8xb32_in1k_rank-sharded.py')
    config.write_text(f"""
_base_ = [{recipe!r}]
{COMMON}
model = dict(backbone=dict(depth=18),
             head=dict(in_channels=512, num_classes=3, topk=(1, )))
train_dataloader = dict(batch_size=2, num_workers=2, dataset=dict(
    data_root={str(root)!r},
    pipeline=[
        dict(type='LoadImageFromFile'),
        dict(type='RandomResizedCrop', scale=32),
        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
        dict(type='PackInputs'),
    ]))
""")
    # 8 samples in batches of 2, 2 epochs: 8 iters.
    _assert_resume_is_exact(script, str(config), tmp_path, env, num_iters=8)
