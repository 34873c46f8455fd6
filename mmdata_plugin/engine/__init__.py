from .hooks import (DataMonitorHook, DeviceFeedHook, FastResumeHook, RayDataNodesHook,
                    RemoteCachePrefetchHook,
                    apply_data_monitor_env)
from .optim import CPUAutocastOptimWrapper
from .runner import (FastResumeEpochBasedTrainLoop,
                     FastResumeIterBasedTrainLoop)

__all__ = [
    'CPUAutocastOptimWrapper', 'DataMonitorHook', 'DeviceFeedHook',
    'FastResumeHook',
    'FastResumeEpochBasedTrainLoop', 'FastResumeIterBasedTrainLoop',
    'RayDataNodesHook', 'RemoteCachePrefetchHook',
    'apply_data_monitor_env'
]
