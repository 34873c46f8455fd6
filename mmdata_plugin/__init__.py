"""mmdata_plugin: fast, memory-light and observable data loading for mmengine.

Importing the package registers every component into mmengine's root
registries (so ``custom_imports=dict(imports=['mmdata_plugin'])`` and the
scoped registries of mmdet/mmpretrain find them by ``type=``) and routes
checkpoint loading through the safe loader of
:mod:`mmdata_plugin.utils.checkpoint_safety`.
"""
from .supported_stack import check_stack

# Before anything imports torch, mmengine or mmcv: an unsupported stack gets
# one message naming what is installed, not an error deep in a submodule.
check_stack()

# isort: split
from . import (data_nodes, datasets, engine, evaluation,  # noqa: F401
               handover, models, remote, remote_cache, sample_order,
               transforms)
from .utils import install_safe_checkpoint_loading
from .version import __version__

install_safe_checkpoint_loading()

__all__ = ['__version__']
