from .annotation_lines import (AnnotationFormatError, decode_line,
                               iter_path_labels, parse_path_label,
                               sample_line_starts)
from .growing_window_sampler import GrowingWindowSampler, window_capacity
from .image_list_dataset import ImageListDataset
from .litdata_chunk_dataset import LitDataChunkDataset
from .litdata_chunk_scan import LitDataChunkError
from .litdata_chunk_writer import pack_image_list_litdata
from .mds_shard_dataset import MDSShardDataset
from .mds_shard_scan import MDSShardError
from .mds_shard_writer import pack_image_list_mds
from .line_index import (LineIndex, StaleIndexError, build_line_index,
                         default_index_path, ensure_line_index)
from .rank_sharded_dataset import RankShardedDataset
from .rank_sharded_sampler import (RankShardedInfiniteSampler,
                                   RankShardedSampler)
from .sample_seeded_dataset import SampleSeededDataset
from .shard_window_sampler import ShardWindowSampler
from .tar_shard_dataset import TarShardDataset, expand_shards
from .tar_shard_index import (TarShardIndex, build_tar_shard_index,
                              default_tar_index_path, ensure_tar_shard_index)
from .tar_shard_scan import TarShardError

__all__ = [
    'AnnotationFormatError', 'decode_line', 'iter_path_labels',
    'parse_path_label', 'sample_line_starts', 'GrowingWindowSampler',
    'window_capacity', 'ImageListDataset', 'LineIndex', 'StaleIndexError',
    'build_line_index',
    'default_index_path', 'ensure_line_index', 'RankShardedDataset',
    'RankShardedSampler', 'RankShardedInfiniteSampler', 'SampleSeededDataset',
    'ShardWindowSampler',
    'TarShardDataset', 'expand_shards', 'TarShardIndex',
    'build_tar_shard_index', 'default_tar_index_path',
    'ensure_tar_shard_index', 'TarShardError', 'MDSShardDataset',
    'MDSShardError', 'pack_image_list_mds', 'LitDataChunkDataset',
    'LitDataChunkError', 'pack_image_list_litdata'
]
