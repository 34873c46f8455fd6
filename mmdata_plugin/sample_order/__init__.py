"""Which sample comes at which global position of the train stream.

The one place that knows the order of every supported sampler (mmengine's
``DefaultSampler`` / ``InfiniteSampler``, ours, the growing window, wrapped
batch samplers) for any world size: the dataset index and per-sample seed
at a global position, the batches of an epoch, the settings that define the
stream and the position after N batches. Fast resume, the remote cache
planner and the samplers of :mod:`mmdata_plugin.datasets` ask it.
"""
from .batch_order import (STRATEGY_DESCRIPTIONS, BatchOrder, batch_count,
                          batches_into_epoch, choose_strategy)
from .data_position import (SAMPLE_LEVEL_STRATEGIES, DataPosition,
                            DataPositionError, check_compatible)
from .epoch_walk import EpochWalk, iteration_stop
from .global_order import (DefaultSamplerOrder, InfiniteSamplerOrder,
                           RankShardedOrder, SampleOrder, SamplePlaces,
                           UnplannableSampler, sample_order_of)
from .growing_window import GrowingWindow, WindowChanges
from .index_permutation import IndexPermutation
from .node_stream import NodeStream
from .sample_index import SampleIndex, with_fields
from .stream_settings import dataloader_stream_settings, stream_defining_attrs

__all__ = [
    'STRATEGY_DESCRIPTIONS', 'BatchOrder', 'batch_count',
    'batches_into_epoch', 'choose_strategy', 'SAMPLE_LEVEL_STRATEGIES',
    'DataPosition', 'DataPositionError', 'check_compatible', 'EpochWalk',
    'iteration_stop', 'DefaultSamplerOrder', 'InfiniteSamplerOrder',
    'RankShardedOrder', 'SampleOrder', 'SamplePlaces', 'UnplannableSampler',
    'sample_order_of', 'GrowingWindow', 'WindowChanges', 'IndexPermutation',
    'NodeStream', 'SampleIndex', 'with_fields', 'dataloader_stream_settings',
    'stream_defining_attrs'
]
