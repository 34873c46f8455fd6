from .data_monitor_hook import DataMonitorHook, apply_data_monitor_env
from .fast_resume_hook import FastResumeHook

__all__ = ['DataMonitorHook', 'FastResumeHook', 'apply_data_monitor_env']
