"""Run a pipeline on reduced JPEG decodes with annotations kept right."""
import copy
from typing import Callable, Optional, Sequence, Tuple

import mmcv
import numpy as np
from mmcv.transforms import Compose
from mmcv.transforms import Resize as MMCVResize
from mmengine.registry import TRANSFORMS

from .decode_target import (decode_target, locate_loader_and_resize,
                            warn_if_decode_too_small)


@TRANSFORMS.register_module()
class ReducedDecodePipeline(Compose):
    """A pipeline whose image loader decodes JPEGs only as large as needed.

    Wrap an unchanged pipeline in it. It replaces the pipeline's
    ``LoadImageFromFile`` by :class:`LoadImageFromFileReduced` (same
    arguments), sized from the absolute resize that follows the loader
    (``Resize``, ``RandomResize``, ``RandomChoiceResize``, ``ResizeEdge``,
    ``FixShapeResize``; annotation loaders may come between), and runs
    that resize in the original image's frame:

    * its output has exactly the shape it has without reduced decoding:
      by default JPEGs are only reduced by scales that divide both their
      sides, for which the size arithmetic of any resize gives bit for bit
      the full image's result (see ``LoadImageFromFileReduced``). With
      ``exact_shapes=False`` other sizes are reduced too, and mmcv's
      ``Resize`` (also inside ``RandomResize``/``RandomChoiceResize``, and
      mmdet's) is given the size mmcv's ``rescale_size`` computes from
      ``ori_shape`` for the scale it is asked for;
    * before it, annotations already loaded (``gt_bboxes``,
      ``gt_keypoints``, ``gt_masks``, ``gt_seg_map``) are brought from
      original-image coordinates into the decoded image's, so the resize
      scales them by the factor it applies to the pixels;
    * after it, ``scale_factor`` is what the resize records for the full
      image (``new_size / ori_size`` for mmcv's ``Resize``), and mmdet's
      ``homography_matrix`` maps the original image to the resized one.
      Annotations loaded after the resize (test pipelines) stay in
      original coordinates.

    Every other transform runs as it would in the wrapped pipeline. A
    ``LoadImageFromFileReduced`` given with its own ``scale`` or
    ``exact_shapes`` keeps them (a warning names a ``scale`` smaller than
    the resize's output: the resize would upsample).

    Args:
        transforms (list[dict]): The pipeline, as configs (the loader and
            the resize must be dicts; others may be built transforms).
        exact_shapes (bool): Reduce a JPEG only by a scale that divides
            both its sides. False reduces every JPEG as far as the resize
            allows; the resize must then be mmcv's (or mmdet's) ``Resize``,
            ``RandomResize`` or ``RandomChoiceResize``, and where a side
            does not divide, the content of the output may sit up to one
            pixel off towards the far edges (the decoded image's last
            row/column covers a partial 8x8 block). Defaults to True.
    """

    def __init__(self,
                 transforms: Sequence[dict],
                 exact_shapes: bool = True) -> None:
        transforms = list(transforms)
        loader, self.resize_index = locate_loader_and_resize(transforms)
        loader_cfg = copy.deepcopy(transforms[loader])
        loader_cfg['type'] = 'LoadImageFromFileReduced'
        if 'scale' not in loader_cfg:
            loader_cfg.update(decode_target(transforms[self.resize_index]))
        loader_cfg.setdefault('exact_shapes', exact_shapes)
        loader_cfg['allow_annotations'] = True
        transforms[loader] = loader_cfg
        warn_if_decode_too_small(transforms)
        super().__init__(transforms)
        resize = self.transforms[self.resize_index]
        self.pinned_resize = _pin_output_shape(resize)
        if self.pinned_resize is None and not loader_cfg['exact_shapes']:
            raise ValueError(
                'exact_shapes=False needs a resize whose output size can be '
                'computed from the original image (mmcv/mmdet Resize, '
                f'RandomResize, RandomChoiceResize); {type(resize).__name__} '
                'derives it from the reduced image and could return a shape '
                'one pixel off. Keep exact_shapes=True.')
        # A Resize in the list is pinned around its call; the inner one of
        # RandomResize/RandomChoiceResize by its stand-in.
        self._pin_around_call = self.pinned_resize is resize

    def transform(self, results: dict) -> Optional[dict]:
        for index, transform in enumerate(self.transforms):
            if index == self.resize_index:
                results = self._resize_in_original_frame(transform, results)
            else:
                results = transform(results)
            if results is None:
                return None
        return results

    def _resize_in_original_frame(self, resize: Callable,
                                  results: dict) -> Optional[dict]:
        results.pop('scale_factor')
        decoded = _decoded_frame_scale(results)
        if decoded == (1.0, 1.0):
            return resize(results)
        _annotations_to_decoded_frame(results, decoded)
        if self._pin_around_call:
            results = resize_from_original_size(self.pinned_resize, resize,
                                                results)
        else:
            results = resize(results)
        if results is None:
            return None
        if self.pinned_resize is not None:
            (new_h, new_w), (ori_h, ori_w) = (results['img'].shape[:2],
                                              results['ori_shape'])
            results['scale_factor'] = (new_w / ori_w, new_h / ori_h)
        elif 'scale_factor' in results:
            # Scales that divide both sides (required for resizes that are
            # not pinned) are powers of two: these products are exactly
            # what the resize records for the full image.
            w_scale, h_scale = results['scale_factor']
            results['scale_factor'] = (w_scale * decoded[0],
                                       h_scale * decoded[1])
        homography = results.get('homography_matrix')
        if homography is not None:
            to_decoded = np.diag([*decoded, 1.0]).astype(homography.dtype)
            results['homography_matrix'] = homography @ to_decoded
        return results


def _is_mmcv_style_resize(transform) -> bool:
    # mmcv's and mmdet's Resize size their output from `scale` and
    # `keep_ratio` only; subclasses with other names (mmdet's
    # FixShapeResize, FixScaleResize) have their own rules.
    return (isinstance(transform, MMCVResize)
            and type(transform).__name__ == 'Resize')


class _ShapeFromOriginal:
    """Stands in for the inner ``resize`` of mmcv's ``RandomResize`` and
    ``RandomChoiceResize``, which set its ``scale`` and call it."""

    def __init__(self, resize: MMCVResize) -> None:
        self.resize = resize

    @property
    def scale(self):
        return self.resize.scale

    @scale.setter
    def scale(self, scale) -> None:
        self.resize.scale = scale

    def __call__(self, results: dict) -> Optional[dict]:
        return resize_from_original_size(self.resize, self.resize, results)

    def __repr__(self) -> str:
        return repr(self.resize)


def _pin_output_shape(resize) -> Optional[MMCVResize]:
    """The mmcv ``Resize`` whose output size can be computed from the
    original image, made ready for it; None for other resizes."""
    if _is_mmcv_style_resize(resize):
        return resize
    inner = getattr(resize, 'resize', None)
    if isinstance(inner, _ShapeFromOriginal):
        return inner.resize
    if _is_mmcv_style_resize(inner):
        # RandomResize / RandomChoiceResize draw a scale, set it on their
        # (public) `resize` and call it: the stand-in sees the drawn scale.
        resize.resize = _ShapeFromOriginal(inner)
        return inner
    return None


def resize_from_original_size(leaf: MMCVResize, call: Callable,
                              results: dict) -> Optional[dict]:
    """``call(results)`` with ``leaf`` resizing to the full image's size.

    With ``keep_ratio`` mmcv's ``Resize`` derives the output size from the
    image it is given (``mmcv.rescale_size``); a reduced image whose sides
    were rounded up can come out one pixel off. Here the size is computed
    from ``results['ori_shape']`` with the same rule, and ``leaf`` resizes
    to exactly that size, as it does without ``keep_ratio``.

    Args:
        leaf (Resize): The mmcv ``Resize`` that ``call`` ends up running.
        call (callable): What to run: ``leaf`` itself, a wrapper that sets
            its scale and calls it, or a profiler's proxy of either.
        results (dict): The sample, with ``ori_shape``.
    """
    if not leaf.keep_ratio:
        return call(results)  # the output size is `scale` for any input
    asked = leaf.scale
    ori_h, ori_w = results['ori_shape']
    leaf.scale = mmcv.rescale_size((ori_w, ori_h), asked)
    leaf.keep_ratio = False
    try:
        results = call(results)
    finally:
        leaf.scale, leaf.keep_ratio = asked, True
    if results is not None:
        results.update(scale=asked, keep_ratio=True)  # as mmcv records them
    return results


def _decoded_frame_scale(results: dict) -> Tuple[float, float]:
    """``(w, h)`` of the decoded image over those of the original."""
    height, width = results['img'].shape[:2]
    ori_h, ori_w = results['ori_shape']
    return width / ori_w, height / ori_h


def _annotations_to_decoded_frame(results: dict,
                                  scale: Tuple[float, float]) -> None:
    height, width = results['img'].shape[:2]
    boxes = results.get('gt_bboxes')
    if boxes is not None:
        if hasattr(boxes, 'rescale_'):  # mmdet BaseBoxes
            boxes.rescale_(scale)
        else:
            results['gt_bboxes'] = (boxes * np.tile(scale, 2)).astype(
                boxes.dtype, copy=False)
    keypoints = results.get('gt_keypoints')
    if keypoints is not None:
        keypoints = keypoints.copy()
        keypoints[..., :2] *= scale
        results['gt_keypoints'] = keypoints
    masks = results.get('gt_masks')
    if masks is not None:
        # mmdet Bitmap/PolygonMasks: resizing to the decoded shape (not by
        # the factor) keeps mask and image sizes equal through the resize.
        results['gt_masks'] = masks.resize((height, width))
    seg_map = results.get('gt_seg_map')
    if seg_map is not None:
        results['gt_seg_map'] = mmcv.imresize(
            seg_map, (width, height), interpolation='nearest')
