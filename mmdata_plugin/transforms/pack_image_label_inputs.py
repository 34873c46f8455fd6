"""Pack an image and its class label into mmengine's model input format."""
import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmengine.registry import TRANSFORMS
from mmengine.structures import BaseDataElement


@TRANSFORMS.register_module()
class PackImageLabelInputs(BaseTransform):
    """Pack ``img`` and ``gt_label`` as ``dict(inputs, data_samples)``.

    ``inputs`` is a CHW uint8 tensor (normalisation belongs to the model's
    data preprocessor, where it runs batched; a tensor ``img``, e.g. from
    :class:`LoadNumpyFromFile`, becomes a CHW view of itself), ``data_samples`` a
    :class:`BaseDataElement` with a ``gt_label`` tensor of shape ``(1,)``
    and the listed meta keys.

    Required keys: ``img``, ``gt_label``.

    Args:
        meta_keys (tuple[str]): Keys copied into the data sample's metainfo
            when present.
    """

    def __init__(self,
                 meta_keys=('sample_idx', 'img_path', 'ori_shape',
                            'img_shape', 'scale_factor', 'flip',
                            'flip_direction')) -> None:
        self.meta_keys = tuple(meta_keys)

    def transform(self, results: dict) -> dict:
        img = results['img']
        if img.ndim == 2:
            img = img[..., None]
        if isinstance(img, torch.Tensor):
            # A loaded tensor (LoadNumpyFromFile) may live in shared memory:
            # a CHW view of it travels to the training process uncopied.
            inputs = img.permute(2, 0, 1)
        else:
            inputs = torch.from_numpy(
                np.ascontiguousarray(img.transpose(2, 0, 1)))
        metainfo = {k: results[k] for k in self.meta_keys if k in results}
        data_sample = BaseDataElement(metainfo=metainfo)
        data_sample.gt_label = torch.tensor([int(results['gt_label'])])
        return dict(inputs=inputs, data_samples=data_sample)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(meta_keys={self.meta_keys})'
