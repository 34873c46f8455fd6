"""Run a pipeline on reduced JPEG decodes with annotations kept right."""
import copy
from typing import Optional, Sequence

import mmcv
import numpy as np
from mmcv.transforms import Compose
from mmengine.registry import TRANSFORMS

from .decode_target import decode_target, locate_loader_and_resize


@TRANSFORMS.register_module()
class ReducedDecodePipeline(Compose):
    """A pipeline whose image loader decodes JPEGs only as large as needed.

    Wrap an unchanged pipeline in it. It replaces the pipeline's
    ``LoadImageFromFile`` by :class:`LoadImageFromFileReduced` (same
    arguments), sized from the absolute resize that follows the loader
    (``Resize``, ``RandomResize``, ``RandomChoiceResize``, ``ResizeEdge``,
    ``FixShapeResize``; annotation loaders may come between), and runs
    that resize in the original image's frame:

    * before it, annotations already loaded (``gt_bboxes``,
      ``gt_keypoints``, ``gt_masks``, ``gt_seg_map``) are brought from
      original-image coordinates into the decoded image's, so the resize
      scales them by the factor it applies to the pixels;
    * after it, ``scale_factor`` (and mmdet's ``homography_matrix``) are
      composed with the decode's scale, so they map the original image to
      the resized one, as without reduced decoding. Annotations loaded
      after the resize (test pipelines) stay in original coordinates.

    Every other transform runs as it would in the wrapped pipeline. A
    ``LoadImageFromFileReduced`` given with its own ``scale`` keeps it.

    Args:
        transforms (list[dict]): The pipeline, as configs (the loader and
            the resize must be dicts; others may be built transforms).
    """

    def __init__(self, transforms: Sequence[dict]) -> None:
        transforms = list(transforms)
        loader, self.resize_index = locate_loader_and_resize(transforms)
        loader_cfg = copy.deepcopy(transforms[loader])
        loader_cfg['type'] = 'LoadImageFromFileReduced'
        if 'scale' not in loader_cfg:
            loader_cfg.update(decode_target(transforms[self.resize_index]))
        loader_cfg['allow_annotations'] = True
        transforms[loader] = loader_cfg
        super().__init__(transforms)

    def transform(self, results: dict) -> Optional[dict]:
        for index, transform in enumerate(self.transforms):
            if index == self.resize_index:
                results = self._resize_in_original_frame(transform, results)
            else:
                results = transform(results)
            if results is None:
                return None
        return results

    @staticmethod
    def _resize_in_original_frame(resize, results: dict) -> Optional[dict]:
        decode_scale, _ = results.pop('scale_factor')
        if decode_scale != 1:
            _annotations_to_decoded_frame(results, decode_scale)
        results = resize(results)
        if results is not None and decode_scale != 1:
            _compose_with_decode_scale(results, decode_scale)
        return results


def _annotations_to_decoded_frame(results: dict, scale: float) -> None:
    height, width = results['img'].shape[:2]
    boxes = results.get('gt_bboxes')
    if boxes is not None:
        if hasattr(boxes, 'rescale_'):  # mmdet BaseBoxes
            boxes.rescale_((scale, scale))
        else:
            results['gt_bboxes'] = boxes * scale
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


def _compose_with_decode_scale(results: dict, scale: float) -> None:
    if 'scale_factor' in results:
        w_scale, h_scale = results['scale_factor']
        results['scale_factor'] = (w_scale * scale, h_scale * scale)
    homography = results.get('homography_matrix')
    if homography is not None:
        decode = np.diag([scale, scale, 1.0]).astype(homography.dtype)
        results['homography_matrix'] = homography @ decode
