import os.path as osp

import cv2

from mmdata_plugin.datasets import iter_path_labels
from mmdata_plugin.utils import make_demo_dataset
from mmdata_plugin.utils.demo_data import CLASSES


def test_demo_set_is_real_jpegs_of_mixed_sizes(tmp_path):
    ann = make_demo_dataset(
        str(tmp_path), num_train=40, num_val=8, max_side=640, seed=1)
    samples = list(iter_path_labels(ann['train']))
    assert len(samples) == 40
    assert {label for _, _, label in samples} == set(range(len(CLASSES)))
    assert any(' ' in path for _, path, _ in samples)
    shapes = set()
    for _, path, _ in samples:
        with open(osp.join(tmp_path, path), 'rb') as f:
            assert f.read(2) == b'\xff\xd8'  # JPEG SOI marker
        shapes.add(cv2.imread(osp.join(tmp_path, path)).shape)
    assert len(shapes) > 5
    assert max(max(s[:2]) for s in shapes) == 640


def test_demo_set_is_reproducible(tmp_path):
    a = make_demo_dataset(str(tmp_path / 'a'), 16, 4, max_side=64, seed=2)
    b = make_demo_dataset(str(tmp_path / 'b'), 16, 4, max_side=64, seed=2)
    with open(a['train']) as fa, open(b['train']) as fb:
        assert fa.read() == fb.read()
