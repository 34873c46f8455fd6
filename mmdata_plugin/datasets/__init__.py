from .annotation_lines import (AnnotationFormatError, decode_line,
                               iter_path_labels, parse_path_label)
from .image_list_dataset import ImageListDataset
from .sample_seeded_dataset import SampleSeededDataset

__all__ = [
    'AnnotationFormatError', 'decode_line', 'iter_path_labels',
    'parse_path_label', 'ImageListDataset', 'SampleSeededDataset'
]
