"""Mixed-precision training on CPU, where mmengine's AmpOptimWrapper refuses."""
from contextlib import contextmanager

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module()
class CPUAutocastOptimWrapper(OptimWrapper):
    """Run the forward pass under CPU autocast.

    mmengine's ``AmpOptimWrapper`` asserts that a GPU is present, so
    ``tools/train.py --amp`` uses this wrapper on CPU-only machines.
    bfloat16 keeps float32's exponent range, so no loss scaling is needed.

    Args:
        dtype (str): Autocast dtype, ``'bfloat16'`` (default) or
            ``'float16'``.
        **kwargs: Passed to :class:`mmengine.optim.OptimWrapper`.
    """

    def __init__(self, dtype: str = 'bfloat16', **kwargs) -> None:
        super().__init__(**kwargs)
        self.cast_dtype = getattr(torch, dtype)

    @contextmanager
    def optim_context(self, model: torch.nn.Module):
        with super().optim_context(model), torch.autocast(
                device_type='cpu', dtype=self.cast_dtype):
            yield
