from .pack_image_label_inputs import PackImageLabelInputs
from .random_image_crop import RandomImageCrop

__all__ = ['PackImageLabelInputs', 'RandomImageCrop']
