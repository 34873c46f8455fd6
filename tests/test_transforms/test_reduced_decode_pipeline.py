"""Boxes, keypoints, masks and scale_factor through real mmcv transforms.

The image has a white rectangle whose box is the annotation, so "correct"
is checked twice: against the full-decode pipeline's numbers, and against
where the rectangle actually is in the output image.
"""
import copy

import cv2
import mmcv
import numpy as np
import pytest
from mmcv.transforms import Compose, Resize
from mmengine.registry import TRANSFORMS, Registry

from mmdata_plugin.transforms import ReducedDecodePipeline
from mmdata_plugin.utils import camera_like_image, encode_jpeg

WIDTH, HEIGHT = 1001, 751  # no multiple of 8: the hard case
BOX = [200.0, 160.0, 600.0, 440.0]
RESIZE = dict(type='Resize', scale=(96, 4096), keep_ratio=True)


@pytest.fixture(scope='module')
def sample(tmp_path_factory):
    root = tmp_path_factory.mktemp('boxes')
    img = camera_like_image(WIDTH, HEIGHT, seed=11) // 2
    x1, y1, x2, y2 = (int(v) for v in BOX)
    img[y1:y2, x1:x2] = 255
    seg = np.zeros((HEIGHT, WIDTH), np.uint8)
    seg[y1:y2, x1:x2] = 1
    (root / 'frame.jpg').write_bytes(encode_jpeg(img))
    cv2.imwrite(str(root / 'frame_seg.png'), seg)
    corners = [x1, y1, 2, x2, y1, 2, x2, y2, 2, x1, y2, 2]
    return dict(
        img_path=str(root / 'frame.jpg'),
        seg_map_path=str(root / 'frame_seg.png'),
        instances=[dict(bbox=BOX, bbox_label=3, keypoints=corners)])


def _train_pipeline(resize=RESIZE):
    return [
        dict(type='LoadImageFromFile'),
        dict(
            type='LoadAnnotations',
            with_bbox=True,
            with_label=True,
            with_keypoints=True,
            with_seg=True),
        resize,
        dict(type='RandomFlip', prob=1.0, direction='horizontal'),
    ]


def _white_box(img):
    """Where the white rectangle is: edges at half contrast, in pixels."""
    gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY).astype(np.float32)
    inside = gray > (255 + np.median(gray)) / 2
    cols = np.flatnonzero(inside.sum(0) > inside.sum(0).max() / 2)
    rows = np.flatnonzero(inside.sum(1) > inside.sum(1).max() / 2)
    return np.array([cols[0], rows[0], cols[-1] + 1, rows[-1] + 1], float)


def test_train_pipeline_boxes_keypoints_seg_match_full_decode(sample):
    full = Compose(_train_pipeline())(copy.deepcopy(sample))
    ours = ReducedDecodePipeline(_train_pipeline())(copy.deepcopy(sample))
    assert ours['scale_factor'][0] < 0.2  # decoded at 1/4, resized 0.5x
    assert ours['ori_shape'] == full['ori_shape'] == (HEIGHT, WIDTH)
    assert ours['img'].shape == full['img'].shape
    assert ours['img_shape'] == full['img_shape']
    np.testing.assert_allclose(
        ours['scale_factor'], full['scale_factor'], rtol=5e-3)
    np.testing.assert_allclose(ours['gt_bboxes'], full['gt_bboxes'], atol=0.6)
    np.testing.assert_allclose(
        ours['gt_keypoints'], full['gt_keypoints'], atol=0.6)
    np.testing.assert_array_equal(ours['gt_bboxes_labels'], [3])
    assert ours['gt_seg_map'].shape == ours['img'].shape[:2]
    assert (ours['gt_seg_map'] == full['gt_seg_map']).mean() > 0.98
    # The boxes sit on the rectangle in both images (flipped included).
    for results in (full, ours):
        np.testing.assert_allclose(
            _white_box(results['img']), results['gt_bboxes'][0], atol=1.0)


def test_reduced_loader_alone_would_misplace_boxes(sample):
    """Why the wrapper exists: Resize scales boxes relative to its input."""
    pipeline = _train_pipeline()
    pipeline[0] = dict(
        type='LoadImageFromFileReduced',
        scale=(96, 4096),
        keep_ratio=True,
        allow_annotations=True)
    naive = Compose(pipeline)(copy.deepcopy(sample))
    offset = np.abs(_white_box(naive['img']) - naive['gt_bboxes'][0])
    assert offset.max() > 10


def test_test_pipeline_scale_factor_maps_back_to_original(sample):
    pipeline = [
        dict(type='LoadImageFromFile'), RESIZE,
        dict(type='LoadAnnotations', with_bbox=True, with_label=True)
    ]
    full = Compose(pipeline)(copy.deepcopy(sample))
    ours = ReducedDecodePipeline(pipeline)(copy.deepcopy(sample))
    # Ground truth stays in original coordinates for the evaluator.
    np.testing.assert_array_equal(ours['gt_bboxes'], full['gt_bboxes'])
    # A detection found in the resized image, divided by scale_factor as
    # mmdet does with rescale=True, lands on the original box.
    detection = _white_box(ours['img'])
    back = detection / np.tile(ours['scale_factor'], 2)
    np.testing.assert_allclose(back, BOX, atol=1.0 / ours['scale_factor'][0])


def test_small_or_non_jpeg_images_pass_through_unchanged(sample, tmp_path):
    png = tmp_path / 'frame.png'
    cv2.imwrite(str(png), mmcv.imread(sample['img_path']))
    for path in (str(png), sample['img_path']):
        big_resize = dict(RESIZE, scale=(700, 4096))  # needs a full decode
        for resize in ((RESIZE, big_resize) if path == str(png) else
                       (big_resize, )):
            item = dict(copy.deepcopy(sample), img_path=path)
            full = Compose(_train_pipeline(resize))(copy.deepcopy(item))
            ours = ReducedDecodePipeline(_train_pipeline(resize))(item)
            np.testing.assert_array_equal(ours['img'], full['img'])
            np.testing.assert_array_equal(ours['gt_bboxes'],
                                          full['gt_bboxes'])
            assert ours['scale_factor'] == full['scale_factor']


class _Boxes:
    """The part of mmdet's HorizontalBoxes that mmdet's Resize uses."""

    def __init__(self, boxes):
        self.tensor = np.asarray(boxes, np.float32).reshape(-1, 4)

    def rescale_(self, scale_factor):
        self.tensor = self.tensor * np.tile(scale_factor, 2)

    def clip_(self, img_shape):
        self.tensor[:, 0::2] = self.tensor[:, 0::2].clip(0, img_shape[1])
        self.tensor[:, 1::2] = self.tensor[:, 1::2].clip(0, img_shape[0])


class _BitmapMasks:
    """The part of mmdet's BitmapMasks that mmdet's Resize uses."""

    def __init__(self, masks):
        self.masks = masks

    def rescale(self, scale):
        return _BitmapMasks(
            np.stack([
                mmcv.imrescale(m, scale, interpolation='nearest')
                for m in self.masks
            ]))

    def resize(self, out_shape):
        return _BitmapMasks(
            np.stack([
                mmcv.imresize(m, out_shape[::-1], interpolation='nearest')
                for m in self.masks
            ]))


# A scoped registry, like mmdet's, holding a Resize that behaves like
# mmdet's: boxes are objects rescaled in place, masks are resized, and a
# homography matrix is composed.
MIMIC = Registry(
    'transform', parent=TRANSFORMS, scope='mmdet_mimic_reduced_decode')


@MIMIC.register_module(name='Resize')
class _MMDetLikeResize(Resize):

    def transform(self, results):
        results['scale'] = self.scale
        self._resize_img(results)
        results['gt_bboxes'].rescale_(results['scale_factor'])
        results['gt_bboxes'].clip_(results['img_shape'])
        results['gt_masks'] = results['gt_masks'].rescale(results['scale'])
        w_scale, h_scale = results['scale_factor']
        homography = np.diag([w_scale, h_scale, 1]).astype(np.float32)
        previous = results.get('homography_matrix')
        results['homography_matrix'] = homography if previous is None \
            else homography @ previous
        return results


@MIMIC.register_module(name='LoadAnnotations')
class _MMDetLikeLoadAnnotations:
    """Boxes and masks as objects, in original-image coordinates."""

    def __call__(self, results):
        box = results['instances'][0]['bbox']
        x1, y1, x2, y2 = (int(v) for v in box)
        mask = np.zeros(results['ori_shape'], np.uint8)
        mask[y1:y2, x1:x2] = 1
        results['gt_bboxes'] = _Boxes([box])
        results['gt_masks'] = _BitmapMasks(mask[None])
        return results


def test_mmdet_style_boxes_masks_and_homography(sample):
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='mmdet_mimic_reduced_decode.LoadAnnotations'),
        dict(RESIZE, type='mmdet_mimic_reduced_decode.Resize'),
    ]
    full = Compose(pipeline)(copy.deepcopy(sample))
    ours = ReducedDecodePipeline(pipeline)(copy.deepcopy(sample))
    assert ours['scale_factor'][0] < 0.2
    np.testing.assert_allclose(
        ours['gt_bboxes'].tensor, full['gt_bboxes'].tensor, atol=0.6)
    assert ours['gt_masks'].masks.shape[1:] == ours['img'].shape[:2]
    assert (ours['gt_masks'].masks == full['gt_masks'].masks).mean() > 0.98
    np.testing.assert_allclose(
        ours['homography_matrix'], full['homography_matrix'], rtol=5e-3)
