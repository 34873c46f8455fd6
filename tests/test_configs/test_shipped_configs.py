"""Every shipped config builds its loop and dataloader and trains.

``configs/downstream/*.py`` inherit a codebase's config (``_base_ =
'mmpretrain::...'``). Where that codebase is not installed (it needs the
full mmcv), its config is replaced by the stand-in in
``tests/downstream_bases/`` (what the real one sets for training), so the
merge the user gets -- train_cfg, sampler, dataset, hooks -- is still built
by mmengine's Runner and trained for a few iterations, with a toy model and
pipeline in place of the codebase's (issue 23, item 6).
"""
import glob
import json
import os
import os.path as osp
import re

import pytest
from helpers import REPO_ROOT
from mmengine.config import Config
from mmengine.runner import Runner

import downstream_toys  # noqa: F401  (ToyAspectRatioBatchSampler)
from mmdata_plugin.utils import camera_like_image, encode_jpeg

TESTS = osp.dirname(osp.dirname(osp.abspath(__file__)))
STAND_INS = osp.join(TESTS, 'downstream_bases')
DOWNSTREAM = sorted(
    glob.glob(osp.join(REPO_ROOT, 'configs', 'downstream', '*.py')))
SCOPED_BASE = re.compile(r"^_base_ = '(\w+)::(.+)'$", re.MULTILINE)
# The codebases' batch samplers whose stand-ins follow them line for line.
BATCH_SAMPLER_STAND_INS = dict(
    AspectRatioBatchSampler='ToyAspectRatioBatchSampler')
NUM_SAMPLES = 8


def _codebase_resolves(package: str) -> bool:
    """Whether mmengine itself resolves ``package::`` config names here."""
    from mmengine.utils import is_installed
    try:
        return is_installed(package)
    except ImportError:  # no pkg_resources (setuptools >= 81)
        return False


def load_recipe(path: str, folder) -> Config:
    """The config as ``mim train`` would see it, with the stand-in base
    where the codebase is not installed."""
    with open(path) as file:
        text = file.read()
    package, relative = SCOPED_BASE.search(text).groups()
    if _codebase_resolves(package):
        return Config.fromfile(path)
    stand_in = osp.join(STAND_INS, package, relative)
    copy = folder / osp.basename(path)
    copy.write_text(SCOPED_BASE.sub(lambda _: f'_base_ = {stand_in!r}',
                                    text))
    return Config.fromfile(str(copy))


def write_toy_data(dataset: dict, root: str) -> None:
    """``NUM_SAMPLES`` small JPEGs and the dataset's annotation file (path
    label lines or JSON Lines with every ``data_prefix`` key)."""
    prefixes = dict(dataset.get('data_prefix', {}))
    image_dir = osp.join(root, prefixes.pop('img_path', ''))
    records = []
    for index in range(NUM_SAMPLES):
        width, height = (40, 32) if index % 2 else (32, 40)
        name = f'{index}.jpg'
        path = osp.join(image_dir, name)
        os.makedirs(osp.dirname(path), exist_ok=True)
        with open(path, 'wb') as file:
            file.write(encode_jpeg(camera_like_image(width, height, index)))
        records.append(dict(img_path=name, gt_label=index % 2, width=width,
                            height=height,
                            **{key: f'{index}.png' for key in prefixes}))
    ann_file = osp.join(root, dataset.ann_file)
    os.makedirs(osp.dirname(ann_file), exist_ok=True)
    with open(ann_file, 'w') as file:
        for record in records:
            if ann_file.endswith('.jsonl'):
                file.write(json.dumps(record) + '\n')
            else:
                file.write(f'{record["img_path"]} {record["gt_label"]}\n')


def with_toy_model_and_data(cfg: Config, root: str, work_dir: str) -> int:
    """Swap the codebase's model and pipeline for toys, shrink the run;
    the number of iterations it will train."""
    loader = cfg.train_dataloader
    loader.dataset.data_root = root
    loader.dataset.pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=(32, 32), keep_ratio=False),
        dict(type='PackImageLabelInputs'),
    ]
    loader.update(batch_size=2, num_workers=0, persistent_workers=False)
    batch_sampler = loader.get('batch_sampler')
    if batch_sampler is not None:
        batch_sampler.type = BATCH_SAMPLER_STAND_INS[batch_sampler.type]
    cfg.model = dict(
        type='TinyCNNClassifier', num_classes=2, channels=(4, 8),
        pooled_size=1, data_preprocessor=dict(type='ImgDataPreprocessor'))
    cfg.default_scope = None  # the toys are mmengine's, not the codebase's
    cfg.work_dir = work_dir
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.test_cfg = cfg.test_dataloader = cfg.test_evaluator = None
    if 'max_iters' in cfg.train_cfg:
        cfg.train_cfg.update(max_iters=3, val_interval=1000)
        return 3
    cfg.train_cfg.update(max_epochs=1, val_interval=1000)
    return NUM_SAMPLES // 2


@pytest.mark.parametrize('path', DOWNSTREAM, ids=osp.basename)
def test_downstream_recipe_builds_and_trains(path, tmp_path):
    cfg = load_recipe(path, tmp_path)
    root = str(tmp_path / 'data')
    write_toy_data(cfg.train_dataloader.dataset, root)
    iterations = with_toy_model_and_data(cfg, root, str(tmp_path / 'work'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert type(runner.train_loop).__name__.startswith('FastResume')
    assert runner.iter == iterations


def test_every_shipped_config_has_a_test():
    # A recipe no test builds rots unseen: each config is either one of
    # the downstream recipes above or named by a test that trains it.
    tests_text = ''.join(
        open(path).read()
        for path in glob.glob(osp.join(TESTS, '**', '*.py'), recursive=True)
        if path != osp.abspath(__file__))
    shipped = [
        path for path in glob.glob(
            osp.join(REPO_ROOT, 'configs', '**', '*.py'), recursive=True)
        if '_base_' not in path.split(osp.sep)
    ]
    untested = [
        osp.relpath(path, REPO_ROOT) for path in shipped
        if path not in DOWNSTREAM and osp.basename(path) not in tests_text
    ]
    assert DOWNSTREAM and not untested, f'configs no test builds: {untested}'
