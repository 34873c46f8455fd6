"""Random fixed-size crop for classification pipelines."""
import numpy as np
from mmcv.transforms import BaseTransform
from mmengine.registry import TRANSFORMS


@TRANSFORMS.register_module()
class RandomImageCrop(BaseTransform):
    """Crop a random ``crop_size`` window, padding images that are smaller.

    The window is drawn from ``numpy.random``'s global state, like mmcv's
    own random transforms, so worker seeding governs it.

    Required keys: ``img``. Modified keys: ``img``, ``img_shape``.

    Args:
        crop_size (int | tuple[int, int]): Output ``(h, w)``; an int makes a
            square.
        pad_val (int): Value of the padding added to small images.
    """

    def __init__(self, crop_size, pad_val: int = 0) -> None:
        if isinstance(crop_size, int):
            crop_size = (crop_size, crop_size)
        if len(crop_size) != 2 or min(crop_size) <= 0:
            raise ValueError(
                f'crop_size must be a positive int or (h, w), got {crop_size}')
        self.crop_size = tuple(crop_size)
        self.pad_val = pad_val

    def _pad_to_crop(self, img: np.ndarray) -> np.ndarray:
        crop_h, crop_w = self.crop_size
        pad_h = max(crop_h - img.shape[0], 0)
        pad_w = max(crop_w - img.shape[1], 0)
        if not pad_h and not pad_w:
            return img
        pad = [(0, pad_h), (0, pad_w)] + [(0, 0)] * (img.ndim - 2)
        return np.pad(img, pad, constant_values=self.pad_val)

    def transform(self, results: dict) -> dict:
        img = self._pad_to_crop(results['img'])
        crop_h, crop_w = self.crop_size
        top = np.random.randint(0, img.shape[0] - crop_h + 1)
        left = np.random.randint(0, img.shape[1] - crop_w + 1)
        results['img'] = img[top:top + crop_h, left:left + crop_w]
        results['img_shape'] = results['img'].shape[:2]
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(crop_size={self.crop_size}, '
                f'pad_val={self.pad_val})')
