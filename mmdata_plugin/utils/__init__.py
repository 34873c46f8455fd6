from .checkpoint_safety import (TRUSTED_CHECKPOINTS_ENV,
                                UnreadableCheckpointError,
                                UnsafeCheckpointError, load_checkpoint_safely,
                                load_from_local_safely, trust_checkpoint)
from .checkpoint_schemes import install_safe_checkpoint_loading
from .demo_data import make_demo_dataset
from .dist import prepare_distributed
from .image_quality import PixelDifference, pixel_difference
from .resume_checkpoint import checkpoint_problem, find_resumable_checkpoint
from .seeding import mix_seed, preserved_global_rngs, seed_global_rngs
from .synthetic_images import camera_like_image, encode_jpeg

__all__ = [
    'TRUSTED_CHECKPOINTS_ENV', 'UnsafeCheckpointError',
    'UnreadableCheckpointError', 'install_safe_checkpoint_loading',
    'load_checkpoint_safely', 'load_from_local_safely', 'checkpoint_problem',
    'find_resumable_checkpoint', 'trust_checkpoint', 'make_demo_dataset',
    'prepare_distributed',
    'PixelDifference', 'pixel_difference',
    'camera_like_image', 'encode_jpeg', 'mix_seed', 'preserved_global_rngs',
    'seed_global_rngs'
]
