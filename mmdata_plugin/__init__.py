"""mmdata_plugin: fast, memory-light and observable data loading for mmengine.

Importing the package registers every component into mmengine's root
registries (so ``custom_imports=dict(imports=['mmdata_plugin'])`` and the
scoped registries of mmdet/mmpretrain find them by ``type=``) and routes
checkpoint loading through the safe loader of
:mod:`mmdata_plugin.utils.checkpoint_safety`.
"""
try:
    import mmcv  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError(
        'mmdata_plugin needs the `mmcv` module. Install `mmcv-lite` (no '
        'compiled ops) or keep your full `mmcv`: `pip install mmcv-lite`.'
    ) from error

from . import (data_nodes, datasets, engine, evaluation,  # noqa: F401
               handover, models, remote, remote_cache, sample_order,
               transforms)
from .utils import install_safe_checkpoint_loading
from .version import __version__

install_safe_checkpoint_loading()

__all__ = ['__version__']
