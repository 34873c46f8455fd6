"""Boxes, keypoints, masks and scale_factor through real mmcv transforms.

The image has a white rectangle whose box is the annotation, so "correct"
is checked twice: against the full-decode pipeline's numbers, and against
where the rectangle actually is in the output image. Two frames: one whose
sides divide by 8 (reduced by default, figures bit for bit those of the
full decode) and 1001x751, reduced only with ``exact_shapes=False``.
"""
import copy

import cv2
import mmcv
import numpy as np
import pytest
from mmcv.transforms import Compose
from mmcv.transforms import Resize as MMCVResize
from mmengine.config import Config
from mmengine.registry import TRANSFORMS, Registry

from helpers import DEMO_CONFIG
from mmdata_plugin.transforms import (ReducedDecodePipeline, decode_target,
                                      decode_target_from_pipeline)
from mmdata_plugin.utils import (camera_like_image, encode_jpeg,
                                 pixel_difference)

BOX = [200.0, 160.0, 600.0, 440.0]
RESIZE = dict(type='Resize', scale=(96, 4096), keep_ratio=True)
# name: (width, height, exact_shapes)
FRAMES = dict(divisible=(1000, 752, True), odd=(1001, 751, False))


@pytest.fixture(scope='module', params=sorted(FRAMES))
def sample(request, tmp_path_factory):
    width, height, exact = FRAMES[request.param]
    root = tmp_path_factory.mktemp('boxes')
    img = camera_like_image(width, height, seed=11) // 2
    x1, y1, x2, y2 = (int(v) for v in BOX)
    img[y1:y2, x1:x2] = 255
    seg = np.zeros((height, width), np.uint8)
    seg[y1:y2, x1:x2] = 1
    (root / 'frame.jpg').write_bytes(encode_jpeg(img))
    cv2.imwrite(str(root / 'frame_seg.png'), seg)
    corners = [x1, y1, 2, x2, y1, 2, x2, y2, 2, x1, y2, 2]
    return dict(
        img_path=str(root / 'frame.jpg'),
        seg_map_path=str(root / 'frame_seg.png'),
        instances=[dict(bbox=BOX, bbox_label=3, keypoints=corners)],
        exact=exact)


def _run_both(pipeline, sample):
    """The full-decode pipeline's results and the wrapped pipeline's; the
    wrapped loader must really decode reduced."""
    item = {k: v for k, v in sample.items() if k != 'exact'}
    full = Compose(pipeline)(copy.deepcopy(item))
    wrapped = ReducedDecodePipeline(pipeline, exact_shapes=sample['exact'])
    loaded = wrapped.transforms[0](dict(img_path=item['img_path']))
    assert loaded['scale_factor'][0] < 1, 'the test frame was not reduced'
    return full, wrapped(copy.deepcopy(item))


def _assert_same_bookkeeping(ours, full, exact, keys=('gt_bboxes', )):
    assert ours['ori_shape'] == full['ori_shape']
    assert ours['img'].shape == full['img'].shape
    assert ours['img_shape'] == full['img_shape']
    assert ours['scale_factor'] == full['scale_factor']
    for key in keys:
        got, expected = (np.asarray(getattr(r[key], 'tensor', r[key]))
                         for r in (ours, full))
        if exact:  # powers of two: the same floating-point numbers
            np.testing.assert_array_equal(got, expected, err_msg=key)
        else:
            np.testing.assert_allclose(got, expected, atol=1e-4, err_msg=key)


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
    full, ours = _run_both(_train_pipeline(), sample)
    _assert_same_bookkeeping(
        ours, full, sample['exact'], keys=('gt_bboxes', 'gt_keypoints'))
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
        allow_annotations=True,
        exact_shapes=sample['exact'])
    item = {k: v for k, v in sample.items() if k != 'exact'}
    naive = Compose(pipeline)(item)
    offset = np.abs(_white_box(naive['img']) - naive['gt_bboxes'][0])
    assert offset.max() > 10


def test_test_pipeline_scale_factor_maps_back_to_original(sample):
    pipeline = [
        dict(type='LoadImageFromFile'), RESIZE,
        dict(type='LoadAnnotations', with_bbox=True, with_label=True)
    ]
    full, ours = _run_both(pipeline, sample)
    _assert_same_bookkeeping(ours, full, exact=True)  # loaded after it
    # A detection found in the resized image, divided by scale_factor as
    # mmdet does with rescale=True, lands on the original box.
    detection = _white_box(ours['img'])
    back = detection / np.tile(ours['scale_factor'], 2)
    np.testing.assert_allclose(back, BOX, atol=1.0 / ours['scale_factor'][0])


def test_small_or_non_jpeg_images_pass_through_unchanged(sample, tmp_path):
    png = tmp_path / 'frame.png'
    cv2.imwrite(str(png), mmcv.imread(sample['img_path']))
    item = {k: v for k, v in sample.items() if k != 'exact'}
    for path in (str(png), item['img_path']):
        big_resize = dict(RESIZE, scale=(700, 4096))  # needs a full decode
        for resize in ((RESIZE, big_resize) if path == str(png) else
                       (big_resize, )):
            item = dict(copy.deepcopy(item), img_path=path)
            full = Compose(_train_pipeline(resize))(copy.deepcopy(item))
            ours = ReducedDecodePipeline(
                _train_pipeline(resize),
                exact_shapes=sample['exact'])(copy.deepcopy(item))
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


class _MMDet:
    """Namespace: the mimic below is named ``Resize``, like mmdet's."""

    class Resize(MMCVResize):
        """mmdet's Resize: boxes are objects rescaled in place, masks
        rescaled (keep_ratio) or resized, a homography matrix composed."""

        def transform(self, results):
            results['scale'] = self.scale
            self._resize_img(results)
            results['gt_bboxes'].rescale_(results['scale_factor'])
            results['gt_bboxes'].clip_(results['img_shape'])
            masks = results['gt_masks']
            results['gt_masks'] = masks.rescale(
                results['scale']) if self.keep_ratio else masks.resize(
                    results['img_shape'])
            w_scale, h_scale = results['scale_factor']
            homography = np.diag([w_scale, h_scale, 1]).astype(np.float32)
            previous = results.get('homography_matrix')
            results['homography_matrix'] = homography if previous is None \
                else homography @ previous
            return results


MIMIC.register_module(name='Resize', module=_MMDet.Resize)


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
    full, ours = _run_both(pipeline, sample)
    _assert_same_bookkeeping(ours, full, sample['exact'])
    assert ours['gt_masks'].masks.shape[1:] == ours['img'].shape[:2]
    assert (ours['gt_masks'].masks == full['gt_masks'].masks).mean() > 0.98
    np.testing.assert_allclose(
        ours['homography_matrix'], full['homography_matrix'], rtol=1e-6)


@pytest.fixture(scope='module')
def random_frames(tmp_path_factory):
    """JPEGs of random sizes (most not multiples of 8), and the reviewer's
    961x1929 portrait frame."""
    root = tmp_path_factory.mktemp('random_sizes')
    rng = np.random.default_rng(2024)
    sizes = [(961, 1929)] + [tuple(int(s) for s in rng.integers(40, 700, 2))
                             for _ in range(80)]
    frames = []
    for index, (width, height) in enumerate(sizes):
        # Smooth content, cheap to make: a tiny random image enlarged.
        small = rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)
        img = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
        path = root / f'{index}_{width}x{height}.jpg'
        path.write_bytes(encode_jpeg(img))
        frames.append((str(path), width, height))
    return frames


def _random_resizes(rng, width, height):
    """A Resize, RandomResize and RandomChoiceResize that shrink 1x-12x."""
    short = int(rng.integers(max(2, min(width, height) // 12),
                             min(width, height) + 1))
    long_side = int(rng.choice([4096, int(short * rng.uniform(1.0, 2.5))]))
    keep_ratio = bool(rng.integers(0, 4))  # mostly True: the hard case
    scale = (short, long_side) if rng.integers(0, 2) else (long_side, short)
    return [
        dict(type='Resize', scale=scale, keep_ratio=keep_ratio),
        dict(
            type='RandomResize',
            scale=scale,
            ratio_range=(0.5, 1.0),
            keep_ratio=keep_ratio),
        dict(
            type='RandomChoiceResize',
            scales=[scale, (short // 2 + 1, long_side)],
            keep_ratio=keep_ratio),
    ]


def test_shapes_and_scale_factors_equal_the_full_decode_at_any_size(
        random_frames):
    """Property: for random frame sizes and resizes, the wrapped pipeline
    outputs the full decode's shape and scale_factor, in both modes; the
    plain reduced loader does so by default (exact_shapes=True)."""
    rng = np.random.default_rng(7)
    reduced_odd, naive_off = 0, 0
    for case, (path, width, height) in enumerate(random_frames):
        resizes = _random_resizes(rng, width, height)
        if case == 0:  # the reviewer's: 961x1929 to a 224 short side
            resizes[0] = dict(type='Resize', scale=(224, 4096),
                              keep_ratio=True)
        for resize in resizes:
            pipeline = [dict(type='LoadImageFromFile'), resize]
            np.random.seed(case)
            full = Compose(pipeline)(dict(img_path=path))
            where = (width, height, resize)
            for exact in (True, False):
                wrapped = ReducedDecodePipeline(pipeline, exact_shapes=exact)
                np.random.seed(case)
                ours = wrapped(dict(img_path=path))
                assert ours['img'].shape == full['img'].shape, (where, exact)
                assert ours['img_shape'] == full['img_shape'], where
                assert ours['scale_factor'] == full['scale_factor'], where
                assert ours['scale'] == full['scale'], where
                assert ours['keep_ratio'] == full['keep_ratio'], where
                loaded = wrapped.transforms[0](dict(img_path=path))
                reduction = loaded['scale_factor'][0]
                if not exact and reduction < 1 and (
                        width * reduction % 1 or height * reduction % 1):
                    reduced_odd += 1
            target = decode_target(resize)
            np.random.seed(case)
            alone = Compose([
                dict(type='LoadImageFromFileReduced', **target), resize
            ])(dict(img_path=path))
            assert alone['img'].shape == full['img'].shape, where
            np.random.seed(case)
            naive = Compose([
                dict(type='LoadImageFromFileReduced', exact_shapes=False,
                     **target), resize
            ])(dict(img_path=path))
            naive_off += naive['img'].shape != full['img'].shape
    # The hard case was exercised, and is hard: reducing sides that do not
    # divide, without the wrapper, does change shapes.
    assert reduced_odd >= 50
    assert naive_off >= 8


class _Pretrain:
    """Namespace: mmpretrain's ResizeEdge (its size rule), by name."""

    class ResizeEdge(MMCVResize):
        """Sets one edge to ``scale``, the other by ``int(scale * ratio)``:
        its own rule, computed from the image it is given."""

        def __init__(self, scale, edge='short'):
            super().__init__(scale=scale)
            self.edge_scale, self.edge = scale, edge

        def transform(self, results):
            h, w = results['img'].shape[:2]
            if (self.edge == 'short') == (w < h):
                width = self.edge_scale
                height = int(self.edge_scale * h / w)
            else:
                height = self.edge_scale
                width = int(self.edge_scale * w / h)
            results['scale'] = (width, height)
            results['img'], w_scale, h_scale = mmcv.imresize(
                results['img'], (width, height), return_scale=True)
            results['img_shape'] = results['img'].shape[:2]
            results['scale_factor'] = (w_scale, h_scale)
            return results


MIMIC.register_module(name='ResizeEdge', module=_Pretrain.ResizeEdge)


def test_other_resizes_get_only_exact_reductions(random_frames):
    resize = dict(type='mmdet_mimic_reduced_decode.ResizeEdge', scale=24)
    pipeline = [dict(type='LoadImageFromFile'), resize]
    wrapped = ReducedDecodePipeline(pipeline)
    assert wrapped.pinned_resize is None
    assert wrapped.transforms[0].exact_shapes
    reduced = 0
    for path, *_ in random_frames:
        full = Compose(pipeline)(dict(img_path=path))
        ours = wrapped(dict(img_path=path))
        assert ours['img'].shape == full['img'].shape
        assert ours['scale_factor'] == full['scale_factor']
        reduced += wrapped.transforms[0](
            dict(img_path=path))['scale_factor'][0] < 1
    assert reduced >= 5
    with pytest.raises(ValueError, match='exact_shapes=False needs'):
        ReducedDecodePipeline(pipeline, exact_shapes=False)


@pytest.mark.parametrize('split', ['train', 'val'])
def test_demo_config_wraps_its_pipelines_and_matches_them(split, tmp_path):
    """The demo decodes reduced, sized from its own resize, and outputs
    what its unwrapped pipeline outputs (same crops, close pixels)."""
    cfg = Config.fromfile(DEMO_CONFIG)
    wrapper_cfg, *tail = cfg[f'{split}_dataloader'].dataset.pipeline
    if split == 'train':  # the reduced decode is the cached head's
        assert wrapper_cfg.type == 'CachedPipelineHead'
        (wrapper_cfg, ) = wrapper_cfg.transforms
    assert wrapper_cfg.type == 'ReducedDecodePipeline'
    plain = wrapper_cfg.transforms
    assert plain[0].type == 'LoadImageFromFile'
    wrapped = TRANSFORMS.build(wrapper_cfg)
    loader = wrapped.transforms[0]
    assert (loader.scale, loader.keep_ratio) == tuple(
        decode_target_from_pipeline(plain).values())
    path = str(tmp_path / 'frame.jpg')
    with open(path, 'wb') as f:
        f.write(encode_jpeg(camera_like_image(1280, 720, seed=5)))
    assert loader(dict(img_path=path))['scale_factor'] == (0.125, 0.125)
    outputs = []
    for pipeline in (Compose(list(plain) + tail), Compose([wrapped] + tail)):
        np.random.seed(3)  # the same resize draw, crop and flip
        outputs.append(pipeline(dict(img_path=path, gt_label=1)))
    full, ours = (o['inputs'].permute(1, 2, 0).numpy() for o in outputs)
    assert ours.shape == full.shape
    # ~28.5 dB: the bilinear resize of the full frame aliases (10x shrink);
    # a different crop or scale is at ~12 dB.
    assert pixel_difference(ours, full).psnr > 25
