from .hooks import DataMonitorHook, apply_data_monitor_env
from .optim import CPUAutocastOptimWrapper

__all__ = [
    'CPUAutocastOptimWrapper', 'DataMonitorHook', 'apply_data_monitor_env'
]
