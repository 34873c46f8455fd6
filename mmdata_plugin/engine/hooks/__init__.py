from .data_monitor_hook import DataMonitorHook, apply_data_monitor_env
from .device_feed_hook import DeviceFeedHook
from .fast_resume_hook import FastResumeHook
from .ray_data_nodes_hook import RayDataNodesHook
from .remote_cache_prefetch_hook import RemoteCachePrefetchHook

__all__ = [
    'DataMonitorHook', 'DeviceFeedHook', 'FastResumeHook', 'RayDataNodesHook',
    'RemoteCachePrefetchHook',
    'apply_data_monitor_env'
]
