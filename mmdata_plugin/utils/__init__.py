from .checkpoint_safety import (TRUSTED_CHECKPOINTS_ENV, UnsafeCheckpointError,
                                install_safe_checkpoint_loading,
                                load_from_local_safely, trust_checkpoint)
from .demo_data import make_demo_dataset
from .dist import prepare_distributed
from .sample_index import SampleIndex, with_fields
from .seeding import mix_seed, preserved_global_rngs, seed_global_rngs

__all__ = [
    'TRUSTED_CHECKPOINTS_ENV', 'UnsafeCheckpointError',
    'install_safe_checkpoint_loading', 'load_from_local_safely',
    'trust_checkpoint', 'make_demo_dataset', 'prepare_distributed',
    'SampleIndex', 'with_fields', 'mix_seed', 'preserved_global_rngs',
    'seed_global_rngs'
]
