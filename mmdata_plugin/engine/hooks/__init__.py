from .data_monitor_hook import DataMonitorHook, apply_data_monitor_env
from .device_feed_hook import DeviceFeedHook
from .fast_resume_hook import FastResumeHook
from .remote_cache_prefetch_hook import RemoteCachePrefetchHook

__all__ = [
    'DataMonitorHook', 'DeviceFeedHook', 'FastResumeHook', 'RemoteCachePrefetchHook',
    'apply_data_monitor_env'
]
