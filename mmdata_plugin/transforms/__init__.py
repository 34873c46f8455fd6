from .array_files import ArrayFileError, read_array
from .decode_target import decode_target, decode_target_from_pipeline
from .load_image_from_file_reduced import LoadImageFromFileReduced
from .load_numpy_from_file import LoadNumpyFromFile
from .pack_image_label_inputs import PackImageLabelInputs
from .random_image_crop import RandomImageCrop
from .reduced_decode_pipeline import ReducedDecodePipeline

__all__ = [
    'ArrayFileError', 'read_array', 'LoadNumpyFromFile',
    'LoadImageFromFileReduced', 'PackImageLabelInputs', 'RandomImageCrop',
    'ReducedDecodePipeline', 'decode_target', 'decode_target_from_pipeline'
]
