"""Data nodes: the train DataLoader's batches made by Ray actors on any
node of a Ray cluster, streamed back one block per batch, in order."""
from .actor_pool import ActorPool, check_node, connect, import_ray
from .batch_producer import BatchProducer, NodeReport, ProducedBatch
from .local_share import LocalShare
from .ray_batch_stream import RayBatchStream

__all__ = [
    'ActorPool', 'BatchProducer', 'LocalShare', 'NodeReport',
    'ProducedBatch', 'RayBatchStream', 'check_node', 'connect', 'import_ray'
]
