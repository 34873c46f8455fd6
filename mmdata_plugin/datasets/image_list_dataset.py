"""In-memory image-classification list, the mmengine ``BaseDataset`` way."""
import os.path as osp
from typing import List

from mmengine.dataset import BaseDataset
from mmengine.registry import DATASETS

from ..transforms.decode_target import warn_if_decode_too_small
from .annotation_lines import (AnnotationFormatError, check_label,
                               iter_path_labels)


@DATASETS.register_module()
class ImageListDataset(BaseDataset):
    """Images listed as ``relative/path label`` lines, held in memory.

    Every rank parses the whole list and (with ``serialize_data=True``)
    keeps it as one numpy buffer. With ``metainfo['classes']`` set, a label
    outside ``0..len(classes) - 1`` is refused, naming file and line. That is fine for small and medium lists
    and for validation sets; for 1e7+ lines use ``RankShardedDataset``.

    Args:
        ann_file (str): Annotation file, relative to ``data_root``.
        data_prefix (dict): ``img_path`` prefix of the listed paths.
        **kwargs: The other :class:`mmengine.dataset.BaseDataset` arguments
            (``metainfo``, ``data_root``, ``pipeline``, ``test_mode``,
            ``serialize_data``, ``max_refetch`` ...).
    """

    def __init__(self, *args, **kwargs) -> None:
        warn_if_decode_too_small(kwargs.get('pipeline') or [])
        super().__init__(*args, **kwargs)

    def load_data_list(self) -> List[dict]:
        if not self.ann_file or not osp.isfile(self.ann_file):
            raise FileNotFoundError(
                f'Annotation file not found: {self.ann_file}')
        prefix = self.data_prefix.get('img_path', '')
        classes = self.metainfo.get('classes')
        num_classes = len(classes) if classes else None
        data_list = []
        for lineno, path, label in iter_path_labels(self.ann_file):
            check_label(label, num_classes,
                        lambda: f'{self.ann_file}:{lineno}')
            data_list.append(
                dict(img_path=osp.join(prefix, path), gt_label=label))
        if not data_list:
            raise AnnotationFormatError(
                f'{self.ann_file}: the annotation file has no sample lines')
        return data_list

    def get_cat_ids(self, idx: int) -> List[int]:
        return [self.get_data_info(idx)['gt_label']]
