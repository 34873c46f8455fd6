from .hooks import FastResumeHook
from .optim import CPUAutocastOptimWrapper
from .runner import (FastResumeEpochBasedTrainLoop,
                     FastResumeIterBasedTrainLoop)

__all__ = [
    'CPUAutocastOptimWrapper', 'FastResumeHook',
    'FastResumeEpochBasedTrainLoop', 'FastResumeIterBasedTrainLoop'
]
