from .data_monitor_hook import DataMonitorHook, apply_data_monitor_env

__all__ = ['DataMonitorHook', 'apply_data_monitor_env']
