"""Train from remote storage through one bounded cache per node.

A node's prefetcher knows the sample order (the samplers' own order math),
downloads ahead of the readers and keeps what is read again soonest
(Belady with bypass) under the node store's hard byte budget.
"""
from .cache_simulator import simulate, simulate_segments
from .node_cache_backend import NodeCacheBackend
from .stream_planner import StreamPlanner

__all__ = [
    'NodeCacheBackend', 'StreamPlanner', 'simulate', 'simulate_segments'
]
