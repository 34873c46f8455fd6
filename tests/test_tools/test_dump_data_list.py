"""tools/dump_data_list.py on a mmengine-only detection dataset, for real.

``ToyDetDataset`` (tests/downstream_toys.py) parses a COCO-like file of its
own with a custom ``parse_data_info``, filters with ``filter_cfg`` and puts
numpy values in its records: what mmdet's ``CocoDataset`` does, without
mmdet.
"""
import json
import os.path as osp
import random
import runpy
import sys
from unittest import mock

import cv2
import numpy as np
import pytest
from downstream_toys import TOY_FILTER, make_toy_coco, toy_pipeline
from helpers import REPO_ROOT
from mmengine.config import Config
from mmengine.dataset import BaseDataset
from mmengine.registry import DATASETS
from torch.utils.data import Dataset

from mmdata_plugin.datasets import RankShardedDataset
from mmdata_plugin.datasets.data_list_dump import (NotPlainRecordError,
                                                   dump_data_list)
from mmdata_plugin.datasets.dump_check import check_dump, format_check
from mmdata_plugin.testing import python_path, run_script

TOOL = osp.join(REPO_ROOT, 'tools', 'dump_data_list.py')
TESTS = osp.dirname(osp.dirname(osp.abspath(__file__)))

CONFIG = '''
custom_imports = dict(imports=['mmdata_plugin', 'downstream_toys'],
                      allow_failed_imports=False)
train_pipeline = {pipeline!r}
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=dict(type='ToyAspectRatioBatchSampler'),
    dataset={dataset})
'''


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('toy_coco'))
    make_toy_coco(root)
    return root


def toy_dataset_config(root, **extra):
    return dict(
        type='ToyDetDataset',
        data_root=root,
        ann_file='annotations/train.json',
        data_prefix=dict(img='images/'),
        filter_cfg=TOY_FILTER,
        metainfo=dict(classes=('cat', 'dog', 'bird')),
        pipeline=toy_pipeline(),
        **extra)


def write_config(path, dataset):
    with open(path, 'w') as file:
        file.write(CONFIG.format(pipeline=toy_pipeline(), dataset=dataset))
    return str(path)


def run_tool(*args, env):
    """The tool in a process of its own; stdout without log lines."""
    out = run_script(TOOL, [*map(str, args)],
                      env=dict(env,
                               PYTHONPATH=python_path(REPO_ROOT,
                                                      TESTS))).stdout
    return '\n'.join(line for line in out.splitlines()
                     if ' - mmengine - ' not in line)


def run_tool_here(capsys, *args):
    """The tool in this process (imports are paid once); its stdout."""
    with mock.patch.object(sys, 'argv', [TOOL, *map(str, args)]):
        runpy.run_path(TOOL, run_name='__main__')
    return capsys.readouterr().out


def test_dump_check_and_the_printed_block_reproduce_the_dataset(
        toy_root, tmp_path, train_env):
    config = write_config(tmp_path / 'toy.py', toy_dataset_config(toy_root))
    out = osp.join(toy_root, 'annotations', 'train.jsonl')
    result = run_tool(config, out, '--check', 6, env=train_env)
    # filter_cfg dropped the image without boxes and the 8-pixel one.
    assert f'{out}: 10 samples of ToyDetDataset (after its filter_cfg)' in \
        result
    assert ('--check: 6 of 6 samples identical (data info and pipeline '
            'output), dataset length and metainfo equal') in result
    assert 'sample.instances[*].bbox' in result  # numpy made plain, said
    with open(out) as file:
        header, first = json.loads(next(file)), json.loads(next(file))
    assert header['metainfo']['classes'] == ['cat', 'dog', 'bird']
    assert first['img_path'] == 'img_000.png'  # under data_prefix
    assert type(first['width']) is int and 'sample_idx' not in first
    assert type(first['instances'][0]['bbox']) is list
    # The block, pasted into a config that inherits the original, builds a
    # RankShardedDataset that reads the same images through the pipeline.
    block = result[result.index('train_dataloader = dict('):
                   result.index('--check')]
    assert "sampler=dict(type='RankShardedSampler')" in block
    assert 'pipeline={{_base_.train_pipeline}}' in block
    new_config = tmp_path / 'new.py'
    new_config.write_text(f"_base_ = ['./toy.py']\n{block}")
    cfg = Config.fromfile(str(new_config))
    assert cfg.train_dataloader.batch_sampler.type == \
        'ToyAspectRatioBatchSampler'
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    original = DATASETS.build(toy_dataset_config(toy_root))
    assert isinstance(dataset, RankShardedDataset) and len(dataset) == 10
    assert dataset.metainfo['classes'] == ('cat', 'dog', 'bird')
    assert dataset[3]['img_path'] == original[3]['img_path']


def test_check_names_what_differs(toy_root, tmp_path):
    original = DATASETS.build(toy_dataset_config(toy_root))
    out = str(tmp_path / 'train.jsonl')
    dump_data_list(original, out, progress=False)
    lines = open(out).read().splitlines()
    record = json.loads(lines[3])  # sample 2
    record['instances'][0]['bbox'][0] += 1.5
    lines[3] = json.dumps(record)
    open(out, 'w').write('\n'.join(lines) + '\n')
    sharded = RankShardedDataset(
        data_root=toy_root,
        ann_file=out,
        data_prefix=dict(img_path='images/'),
        pipeline=toy_pipeline(),
        index_progress=False)
    checks = check_dump(original, sharded, count=len(original))
    report = format_check(checks)
    assert report.startswith('--check: 9 of 10 samples identical')
    (sample_2, ) = [check for check in checks if check.differences]
    assert sample_2.index == 2
    found = '; '.join(sample_2.differences)
    assert 'data_info.instances[0].bbox[0]' in found
    # Resized: the box is 1.5 pixels off times the random scale.
    assert 'sample.gt_bboxes: 1 of 12 values differ (max |difference|' in \
        found
    # A wrong data_prefix: the paths differ and the images do not load.
    sharded = RankShardedDataset(
        data_root=toy_root, ann_file=out, data_prefix=dict(img_path='x/'),
        pipeline=toy_pipeline(), index_progress=False)
    found = check_dump(original, sharded, 1)[1].differences
    assert found[0] == (f"data_info.img_path: '{toy_root}/images/img_008.png'"
                        f" vs '{toy_root}/x/img_008.png'")
    assert found[1].startswith('sample: the pipeline raised on the dump: ')


class Generated(Dataset):

    def __len__(self):
        return 4

    def __getitem__(self, idx):
        return np.zeros(3)


class Records(BaseDataset):
    """``record(i)`` for each of 4 samples."""
    record = staticmethod(lambda i: dict(img_path=f'{i}.png'))

    def load_data_list(self):
        return [self.record(i) for i in range(4)]


class InMemoryImages(Records):
    record = staticmethod(lambda i: dict(img=np.zeros((64, 64, 3))))


class IntKeys(Records):
    record = staticmethod(lambda i: dict(label_map={0: 255, 1: 0}))


class Encoded(Records):
    record = staticmethod(lambda i: dict(img_bytes=b'\xff\xd8'))


class RandomRecords(Records):

    def get_data_info(self, idx):
        return dict(img_path=f'{idx}.png', scale=random.random())


class OwnPrepare(Records):

    def prepare_data(self, idx):
        return dict(mosaic=[self.get_data_info(i) for i in range(4)])


@pytest.mark.parametrize('dataset,reason', [
    (Generated(), 'has no get_data_info(): its samples are made in '
     '__getitem__'),
    (InMemoryImages(), "sample 0['img'] is a numpy array of shape "
     '(64, 64, 3) (more than 4096 values): the dataset holds sample data '
     'in memory'),
    (IntKeys(), "sample 0['label_map'] has the int key 0; JSON keys are "
     'strings'),
    (Encoded(), "sample 0['img_bytes'] is bytes"),
    (RandomRecords(), 'returns a different record on each call: the '
     'samples are generated'),
    (OwnPrepare(), 'overrides BaseDataset.prepare_data(), so its samples '
     'are not pipeline(get_data_info(i))'),
])
def test_datasets_of_no_plain_records_are_refused(dataset, reason, tmp_path):
    out = tmp_path / 'out.jsonl'
    with pytest.raises(NotPlainRecordError) as error:
        dump_data_list(dataset, str(out), progress=False)
    assert reason in str(error.value)
    assert not out.exists() and not list(tmp_path.iterdir())


def _toy_coco_edited(root, edit):
    make_toy_coco(root)
    path = osp.join(root, 'annotations', 'train.json')
    with open(path) as file:
        content = json.load(file)
    edit({ann['id']: ann for ann in content['annotations']})
    with open(path, 'w') as file:
        json.dump(content, file)
    return path


def test_broken_coco_annotations_are_named(tmp_path, capsys):
    # pycocotools (like the toy) indexes ann['image_id']: without the key
    # the build ends in a bare KeyError naming neither file nor annotation.
    root = str(tmp_path / 'no_image_id')
    path = _toy_coco_edited(root, lambda anns: anns[5].pop('image_id'))
    config = write_config(tmp_path / 'broken.py', toy_dataset_config(root))
    with pytest.raises(SystemExit) as error:
        run_tool_here(capsys, config, tmp_path / 'broken.jsonl')
    assert str(error.value) == (
        f"{config}: train_dataloader.dataset cannot be built: {path}: "
        "annotation 5 (annotations[4]) has no 'image_id'")
    # An image_id naming no image: the dataset drops the annotation
    # without a word; --check says how many and why.
    root = str(tmp_path / 'orphans')

    def orphan(anns):
        anns[2]['image_id'] = anns[7]['image_id'] = 999

    path = _toy_coco_edited(root, orphan)
    config = write_config(tmp_path / 'orphans.py', toy_dataset_config(root))
    result = run_tool_here(capsys, config, tmp_path / 'orphans.jsonl',
                           '--check', 2)
    with open(path) as file:
        total = len(json.load(file)['annotations'])
    assert (f'--check: {path}: 2 of {total} annotations dropped by the '
            'dataset: their image_id names no image (ids 2, 7)') in result


def test_wrappers_dump_their_dataset_or_say_how(toy_root, tmp_path, capsys):
    repeat = write_config(
        tmp_path / 'repeat.py',
        dict(type='RepeatDataset', times=3,
             dataset=toy_dataset_config(toy_root)))
    out = tmp_path / 'repeat.jsonl'
    result = run_tool_here(capsys, repeat, out, '--check', 2)
    assert '10 samples of ToyDetDataset' in result
    assert '    dataset=dict(\n        dataset=dict(\n            ' \
        '_delete_=True,' in result
    assert '--check: 2 of 2 samples identical' in result
    concat = write_config(
        tmp_path / 'concat.py',
        dict(type='ConcatDataset',
             datasets=[toy_dataset_config(toy_root)] * 2))
    with pytest.raises(SystemExit) as error:
        run_tool_here(capsys, concat, tmp_path / 'concat.jsonl')
    assert ('ConcatDataset of 2 datasets: dump each with --part 0 .. 1'
            in str(error.value))
    result = run_tool_here(capsys, concat, tmp_path / 'part1.jsonl',
                           '--part', 1)
    assert 'train_dataloader.dataset.datasets[1] (put it there)' in result
    # A ConcatDataset inside a wrapper (mmdet's voc0712), and a wrapped
    # part: the part's own dataset, with its pipeline, is dumped.
    for name, dataset, where in (
            ('repeat_concat',
             dict(type='RepeatDataset', times=3,
                  dataset=dict(type='ConcatDataset',
                               datasets=[toy_dataset_config(toy_root)] * 2)),
             '.dataset.datasets[0]'),
            ('concat_repeat',
             dict(type='ConcatDataset',
                  datasets=[dict(type='RepeatDataset', times=2,
                                 dataset=toy_dataset_config(toy_root))]),
             '.datasets[0].dataset')):
        config = write_config(tmp_path / f'{name}.py', dataset)
        result = run_tool_here(capsys, config, tmp_path / f'{name}.jsonl',
                               '--part', 0, '--check', 2)
        assert f'train_dataloader.dataset{where} (put it there)' in result
        assert '--check: 2 of 2 samples identical' in result


def test_mmseg_folder_dataset_dumps_and_checks(tmp_path):
    """Where mmseg imports (it needs mmcv's compiled ops): ADE20KDataset's
    folder scan, through its own random pipeline."""
    try:
        import mmseg.datasets  # noqa: F401
    except Exception as error:  # ImportError, or mmseg's mmcv check
        pytest.skip(f'mmseg does not import here: {error!r:.120}')
    from mmengine.registry import DefaultScope
    rng = np.random.default_rng(0)
    for folder in ('images/training', 'annotations/training'):
        (tmp_path / folder).mkdir(parents=True)
    for i in range(6):
        height, width = (int(v) for v in rng.integers(24, 64, 2))
        cv2.imwrite(str(tmp_path / f'images/training/{i}.jpg'),
                    rng.integers(0, 255, (height, width, 3), np.uint8))
        cv2.imwrite(str(tmp_path / f'annotations/training/{i}.png'),
                    rng.integers(0, 4, (height, width), np.uint8))
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', reduce_zero_label=True),
        dict(type='RandomResize', scale=(64, 32), ratio_range=(0.5, 2.0),
             keep_ratio=True),
        dict(type='RandomCrop', crop_size=(24, 24), cat_max_ratio=0.75),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PhotoMetricDistortion'),
        dict(type='PackSegInputs')
    ]
    with DefaultScope.overwrite_default_scope('mmseg'):
        original = DATASETS.build(
            dict(type='ADE20KDataset', data_root=str(tmp_path),
                 data_prefix=dict(img_path='images/training',
                                  seg_map_path='annotations/training'),
                 pipeline=pipeline))
    out = str(tmp_path / 'train.jsonl')
    result = dump_data_list(original, out, progress=False)
    assert result.data_prefix == dict(
        img_path=f'{tmp_path}/images/training',
        seg_map_path=f'{tmp_path}/annotations/training')
    with DefaultScope.overwrite_default_scope('mmseg'):
        sharded = RankShardedDataset(
            data_root=str(tmp_path), ann_file='train.jsonl',
            data_prefix=dict(img_path='images/training',
                             seg_map_path='annotations/training'),
            pipeline=pipeline, index_progress=False)
        report = format_check(check_dump(original, sharded, 6))
    assert report.startswith('--check: 6 of 6 samples identical'), report
