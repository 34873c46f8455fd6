"""``LoadImageFromFile`` that decodes JPEGs no larger than the resize needs."""
import warnings
from typing import Optional, Tuple, Union

import mmengine.fileio as fileio
import numpy as np
from mmcv.transforms import BaseTransform
from mmengine.registry import TRANSFORMS

from . import image_decoding
from .decode_target import resize_output_size

# Sample keys that hold, or lead to, annotations in original-image pixel
# coordinates (mmcv/mmdet/mmseg/mmpose data infos and loaded annotations).
GEOMETRIC_ANNOTATION_KEYS = ('instances', 'gt_bboxes', 'gt_masks',
                             'gt_keypoints', 'gt_seg_map', 'seg_map_path',
                             'bbox', 'keypoints')


@TRANSFORMS.register_module()
class LoadImageFromFileReduced(BaseTransform):
    """Load an image like ``LoadImageFromFile``, decoding JPEGs reduced.

    JPEGs are decoded at the smallest DCT scale (1/8, 1/4, 1/2) whose image
    is still at least as large as what the resize that follows will output,
    so that resize only ever shrinks. Other formats are decoded at full size by
    :func:`mmcv.imfrombytes`, exactly as ``LoadImageFromFile`` does.

    Set ``scale`` and ``keep_ratio`` to those of the absolute resize that
    follows (mmcv's ``Resize``: copy them; ``RandomResize``: its largest
    scale times the top of ``ratio_range``). ``ReducedDecodePipeline`` does
    that for you and also keeps box, mask, keypoint and segmentation
    annotations and ``scale_factor`` right. A ``scale`` smaller than what
    the resize outputs makes that resize upsample: ``RankShardedDataset``,
    ``ImageListDataset`` and ``ReducedDecodePipeline`` warn about it, naming
    both transforms and the scale to use (it is kept, not changed).

    By default (``exact_shapes=True``) a JPEG is only reduced by a scale
    that divides both its sides (1/8 for 4K, 1080p and 720p frames), so
    the resize that follows outputs exactly the shape it gives the full
    image: the reduced image is the full one scaled by a power of two,
    and every size rule of mmcv's, mmdet's and mmpretrain's resizes gives
    bit for bit the same size for both. Other sizes are decoded at the
    largest such scale or in full. The following resize still records
    its ``scale_factor`` relative to the decoded image; where that
    matters, use ``ReducedDecodePipeline``.

    Required keys: ``img_path``.

    Modified keys: ``img``, ``img_shape`` (decoded size), ``ori_shape``
    (size of the full decode, EXIF orientation applied as mmcv does) and
    ``scale_factor`` (``(r, r)``: original pixel ``x`` is at ``x * r``).

    Args:
        scale (int | tuple[int, int]): ``scale`` of the following resize,
            ``(w, h)`` as in mmcv; an int means ``(scale, scale)``.
        keep_ratio (bool): ``keep_ratio`` of the following resize. Defaults
            to False, as in mmcv's ``Resize``.
        to_float32 (bool): Return a float32 image. Defaults to False.
        color_type (str): mmcv's decode flag. Defaults to 'color'.
        imdecode_backend (str): 'cv2', 'pillow' or 'turbojpeg' (optional
            PyTurboJPEG); another mmcv backend decodes at full size.
            Defaults to 'cv2'. Non-JPEG files given to 'turbojpeg' are
            decoded with cv2.
        file_client_args (dict, optional): Deprecated, as in mmcv; use
            ``backend_args``.
        ignore_empty (bool): Return None for a missing or undecodable file
            instead of raising. Defaults to False.
        backend_args (dict, optional): Storage backend arguments for
            :func:`mmengine.fileio.get`.
        allow_annotations (bool): Decode reduced although the sample has
            geometric annotations (in original-image coordinates). Leave it
            False unless something brings them into the decoded image's
            frame before the resize and keeps ``scale_factor`` relative to
            the original image afterwards; ``ReducedDecodePipeline`` does
            both and sets this. Defaults to False.
        exact_shapes (bool): Reduce a JPEG only by a scale that divides both
            its sides. False also reduces other sizes (their reduced sides
            are rounded up), and a following ``keep_ratio`` resize may then
            output one pixel more or less on the side its scale does not
            pin (``ReducedDecodePipeline(exact_shapes=False)`` computes the
            resize's output size from the original image instead). Defaults
            to True.
    """

    def __init__(self,
                 scale: Union[int, Tuple[int, int]],
                 keep_ratio: bool = False,
                 to_float32: bool = False,
                 color_type: str = 'color',
                 imdecode_backend: str = 'cv2',
                 file_client_args: Optional[dict] = None,
                 ignore_empty: bool = False,
                 *,
                 backend_args: Optional[dict] = None,
                 allow_annotations: bool = False,
                 exact_shapes: bool = True) -> None:
        self.scale = (scale, scale) if isinstance(scale, int) \
            else tuple(scale)
        if len(self.scale) != 2 or min(self.scale) <= 0:
            raise ValueError('scale must be a positive int or (w, h), got '
                             f'{scale!r}')
        image_decoding.check_backend(imdecode_backend, color_type)
        if file_client_args is not None:
            warnings.warn(
                '"file_client_args" will be deprecated in future. '
                'Please use "backend_args" instead', DeprecationWarning)
            if backend_args is not None:
                raise ValueError('"file_client_args" and "backend_args" '
                                 'cannot be set at the same time.')
        self.keep_ratio = keep_ratio
        self.to_float32 = to_float32
        self.color_type = color_type
        self.imdecode_backend = imdecode_backend
        self.file_client_args = None if file_client_args is None \
            else file_client_args.copy()
        self.ignore_empty = ignore_empty
        self.backend_args = None if backend_args is None \
            else backend_args.copy()
        self.allow_annotations = allow_annotations
        self.exact_shapes = exact_shapes

    def min_decoded_size(self, width: int, height: int) -> Tuple[int, int]:
        """The ``(w, h)`` the following resize makes of a full image."""
        return resize_output_size(self.scale, self.keep_ratio, width, height)

    def transform(self, results: dict) -> Optional[dict]:
        filename = results['img_path']
        if not self.allow_annotations:
            self._refuse_annotations(results, filename)
        try:
            content = self._get(filename)
        except Exception:
            if self.ignore_empty:
                return None
            raise
        try:
            # Called through the module, as mmcv calls mmcv.imfrombytes, so
            # that profilers can wrap the decode step.
            decoded = image_decoding.decode_image(content, self.color_type,
                                                  self.imdecode_backend,
                                                  self.min_decoded_size,
                                                  self.exact_shapes)
        except ValueError as error:
            if self.ignore_empty:
                return None
            raise OSError(
                f'failed to decode image {filename}: {error}') from error
        img = decoded.img
        if self.to_float32:
            img = img.astype(np.float32)
        results['img'] = img
        results['img_shape'] = img.shape[:2]
        results['ori_shape'] = decoded.ori_shape
        reduction = float(decoded.reduction)
        results['scale_factor'] = (reduction, reduction)
        return results

    def _get(self, filename: str) -> bytes:
        if self.file_client_args is not None:
            file_client = fileio.FileClient.infer_client(
                self.file_client_args, filename)
            return file_client.get(filename)
        return fileio.get(filename, backend_args=self.backend_args)

    @staticmethod
    def _refuse_annotations(results: dict, filename: str) -> None:
        found = [key for key in GEOMETRIC_ANNOTATION_KEYS if key in results]
        if found:
            raise ValueError(
                f'{filename}: the sample has annotations in original-image '
                f'coordinates ({", ".join(found)}). A reduced decode alone '
                'would let the following Resize scale them by the wrong '
                'factor. Wrap the pipeline in ReducedDecodePipeline (it keeps '
                'annotations and scale_factor right), or use '
                'LoadImageFromFile.')

    def __repr__(self) -> str:
        args = (f'scale={self.scale}, keep_ratio={self.keep_ratio}, '
                f'ignore_empty={self.ignore_empty}, '
                f'to_float32={self.to_float32}, '
                f"color_type='{self.color_type}', "
                f"imdecode_backend='{self.imdecode_backend}', ")
        if self.file_client_args is not None:
            args += f'file_client_args={self.file_client_args}, '
        else:
            args += f'backend_args={self.backend_args}, '
        return (f'{self.__class__.__name__}({args}'
                f'allow_annotations={self.allow_annotations}, '
                f'exact_shapes={self.exact_shapes})')
