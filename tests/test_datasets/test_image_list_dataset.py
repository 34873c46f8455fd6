import os.path as osp

import pytest

from mmdata_plugin.datasets import AnnotationFormatError, ImageListDataset


def test_loads_demo_list(demo_root):
    dataset = ImageListDataset(
        data_root=demo_root,
        ann_file='val.txt',
        pipeline=[dict(type='LoadImageFromFile')])
    assert len(dataset) == 32
    sample = dataset[0]
    assert osp.isfile(sample['img_path'])
    assert sample['img'].ndim == 3
    assert dataset.get_cat_ids(0) == [sample['gt_label']]


def test_missing_annotation_file(tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.txt'):
        ImageListDataset(data_root=str(tmp_path), ann_file='nope.txt')


def test_empty_annotation_file(tmp_path):
    (tmp_path / 'empty.txt').write_text('\n\n')
    with pytest.raises(AnnotationFormatError, match='no sample lines'):
        ImageListDataset(data_root=str(tmp_path), ann_file='empty.txt')


def test_missing_image_names_path(tmp_path):
    (tmp_path / 'ann.txt').write_text('gone.jpg 1\n')
    dataset = ImageListDataset(
        data_root=str(tmp_path),
        ann_file='ann.txt',
        test_mode=True,
        pipeline=[dict(type='LoadImageFromFile')])
    with pytest.raises(FileNotFoundError, match='gone.jpg'):
        dataset[0]
