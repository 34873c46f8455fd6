"""Train from remote storage through one bounded cache per node.

A node's prefetcher knows the sample order (the samplers' own order math),
downloads ahead of the readers and keeps what is read again soonest
(Belady with bypass) under the node store's hard byte budget.
"""
from .cache_simulator import simulate, simulate_segments
from .node_cache_backend import NodeCacheBackend
from .node_stream import NodeStream
from .sample_order import UnplannableSampler, sample_order_of
from .stream_planner import StreamPlanner

__all__ = [
    'NodeCacheBackend', 'NodeStream', 'StreamPlanner', 'UnplannableSampler',
    'sample_order_of', 'simulate', 'simulate_segments'
]
