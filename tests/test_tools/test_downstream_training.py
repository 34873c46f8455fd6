"""A COCO file -> tools/dump_data_list.py -> mmdet's pipeline, trained and
resumed mid-epoch through configs/downstream/ (where mmdet imports).

mmdet needs the full mmcv (compiled ops) even to import its datasets; where
it does not import, these tests are reported as skipped. The model is a toy
(``ToyBoxCounter``): Mask R-CNN's heads need mmcv's ops to run, the data
side under test does not.
"""
import json
import os.path as osp
import sys

import pytest
from downstream_toys import make_toy_coco
from helpers import REPO_ROOT, TRAIN_SCRIPT

from mmdata_plugin.testing import python_path, run_command, run_script

TOOL = osp.join(REPO_ROOT, 'tools', 'dump_data_list.py')
TESTS = osp.dirname(osp.dirname(osp.abspath(__file__)))
MMDET_CONFIG = osp.join(REPO_ROOT, 'configs', 'downstream',
                        'mask-rcnn_r50_fpn_1x_coco_rank-sharded.py')


@pytest.fixture(scope='module')
def mmdet_env(train_env):
    if not _imports('mmdet.datasets'):
        pytest.skip('mmdet does not import here (it needs the full mmcv '
                    'with compiled ops)')
    return dict(train_env, PYTHONPATH=python_path(REPO_ROOT, TESTS))


def _imports(module):
    try:
        __import__(module)
    except Exception:  # ImportError, or mmdet's mmcv version check
        return False
    return True


def probe(work_dir):
    with open(osp.join(work_dir, 'probe.jsonl')) as file:
        return {r['iter']: r for r in map(json.loads, file)}


def test_coco_file_trains_and_resumes_through_mmdet(tmp_path, mmdet_env):
    root = str(tmp_path / 'coco')
    make_toy_coco(root, num_images=16)
    out = osp.join(root, 'annotations', 'instances_train.jsonl')
    options = [
        '--cfg-options', f'train_dataloader.dataset.data_root={root}/',
        'train_dataloader.dataset.ann_file=annotations/train.json',
        'train_dataloader.dataset.data_prefix.img=images/',
        "train_dataloader.dataset.metainfo.classes=['cat','dog','bird']"
    ]
    dumped = run_command([
        sys.executable, TOOL, 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
        out, '--check', '7', *options
    ], env=mmdet_env).stdout
    # Mask R-CNN's filter_cfg (min_size=32) keeps 7 of the 16 images.
    assert f'{out}: 7 samples of CocoDataset' in dumped
    assert '--check: 7 of 7 samples identical' in dumped
    config = tmp_path / 'train.py'
    config.write_text(f"""
_base_ = [{MMDET_CONFIG!r}]
custom_imports = dict(imports=['mmdata_plugin', 'downstream_toys'],
                      allow_failed_imports=False)
model = dict(_delete_=True, type='ToyBoxCounter',
             data_preprocessor={{{{_base_.model.data_preprocessor}}}})
train_dataloader = dict(dataset=dict(
    data_root={root + '/'!r}, ann_file='annotations/instances_train.jsonl',
    data_prefix=dict(img_path='images/'),
    metainfo=dict(classes=['cat', 'dog', 'bird'])))
train_cfg = dict(max_epochs=2, val_interval=10)
val_cfg = val_dataloader = val_evaluator = None
test_cfg = test_dataloader = test_evaluator = None
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=3),
                     logger=dict(interval=1))
custom_hooks = [dict(type='DetProbeHook')]
randomness = dict(seed=5)
""")
    full, resumed = tmp_path / 'full', tmp_path / 'resumed'
    run_script(TRAIN_SCRIPT, [str(config), '--work-dir', str(full)],
               env=mmdet_env)
    log = run_script(TRAIN_SCRIPT, [
        str(config), '--work-dir',
        str(resumed), '--resume',
        str(full / 'iter_3.pth')
    ], env=mmdet_env).stdout
    assert 'Fast resume: skipped 3 batches' in log
    assert "index-only replay of the batch sampler" in log
    reference, rest = probe(full), probe(resumed)
    # 7 samples in batches of 2 per epoch (the last one short): 8 iters
    # (runner.iter counts the ones done before this one).
    assert sorted(reference) == list(range(8))
    assert sorted(rest) == list(range(3, 8))
    for it in rest:
        assert rest[it] == reference[it], f'iteration {it}'
