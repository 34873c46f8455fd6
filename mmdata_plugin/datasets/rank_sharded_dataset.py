"""A global annotation list of 1e7-1e9 samples that no process loads."""
import json
import logging
import os.path as osp
import tempfile
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

import numpy as np
from mmengine.dataset import BaseDataset
from mmengine.fileio import join_path
from mmengine.logging import print_log
from mmengine.registry import DATASETS

from ..remote.node_fetch import (DEFAULT_FILES_LIMIT, fetch_to_node,
                                 is_remote)
from ..transforms.decode_target import warn_if_decode_too_small
from ..utils.torch_internals import (copy_without_annotation,
                                     dataset_indices, dataset_initialized,
                                     dataset_metainfo,
                                     mark_dataset_initialized)
from .annotation_lines import (AnnotationFormatError, check_label,
                               decode_text, split_path_label)
from .line_index import (annotation_format, default_index_path,
                         ensure_line_index)
from .rank_shard_files import ShardFileCache, ShardFileWriter

# Dropped samples logged one by one before the log thins out to every
# _LOG_EVERY-th (a bad file list must not flood the log).
_LOG_FIRST = 10
_LOG_EVERY = 1000


@DATASETS.register_module()
class RankShardedDataset(BaseDataset):
    """An annotation list read in place: O(1) memory per process in N.

    Behaves like an mmengine ``BaseDataset`` (``metainfo``, ``pipeline``,
    ``data_root``/``data_prefix``, ``indices``, ``test_mode``,
    ``max_refetch``, ``get_data_info``, ``get_subset``), but instead of
    loading the list it builds (once per file and node) a byte-offset index
    and reads each sample's line with two ``pread`` calls. No process holds
    the list; the file stays in the page cache, shared by all ranks and
    workers. The dataset is global (``len`` is N on every rank): pair it with
    :class:`RankShardedSampler` / :class:`RankShardedInfiniteSampler`, which
    split the ranks in O(1) memory. mmengine's ``DefaultSampler`` and
    ``InfiniteSampler`` stay correct with it, but hold O(N) lists per rank
    (the fast-resume loops warn about that pairing).

    Annotation formats:

    * ``relative/path label`` lines -> ``dict(img_path, gt_label)``;
    * JSON Lines (``.jsonl``/``.ndjson``): one data-info dict per line; an
      optional first line ``{"metainfo": {...}}`` fills metainfo keys the
      config does not set (``tools/convert_annotations_to_jsonl.py`` writes
      it from OpenMMLab 2.0 JSON). Keys named in ``data_prefix`` are joined
      with it, as in ``BaseDataset.parse_data_info``.

    A remote ``ann_file`` (``s3://``, ``http(s)://``, or ``data_root`` on
    one) is fetched once per node into a node store, keyed by its size and
    ETag (a changed remote file is fetched anew, never mixed), and indexed
    like a local one.

    Args:
        ann_file (str): Annotation file, relative to ``data_root``.
        ann_format (str): ``'auto'`` (by extension), ``'lines'`` or
            ``'jsonl'``.
        index_file (str, optional): Where the index is. Default: next to the
            annotation file if that folder is writable, else ``index_dir``.
        index_dir (str, optional): Folder for indexes of read-only
            annotation folders (default ``$MMDATA_INDEX_DIR`` or
            ``~/.cache/mmdata_plugin/line_index``).
        on_stale_index (str): When the annotation file changed since its
            index was built: ``'rebuild'`` (default) or ``'error'``.
        index_progress (bool): Show a progress bar while indexing.
        materialize_shards (bool): For slow shared file systems: before a
            rank iterates over its share of a (mini-)epoch, the sampler
            copies those lines to a local shard file in few large sequential
            reads; workers read from it. Costs the rank's share of local
            disk/page cache per epoch. Needs a RankSharded sampler (other
            samplers fall back to direct reads). Default: False.
        shard_dir (str, optional): Node-local folder for shard files
            (default: the temp dir).
        backend_args (dict, optional): fileio backend arguments for a
            remote ``ann_file`` (e.g. an S3 ``endpoint_url``); the images
            are read with the transforms' own ``backend_args``.
        remote_cache_dir (str, optional): Node-local folder keeping remote
            annotation files (default ``$MMDATA_REMOTE_FILES_DIR`` or
            ``~/.cache/mmdata_plugin/remote_files``).
        remote_cache_limit (int | str): Byte budget of that folder; older
            versions are evicted first. Default: ``'20GB'``.
        serialize_data (bool): Accepted for config compatibility and
            ignored: nothing is loaded, so nothing is serialized.
        filter_cfg (dict, optional): Must be None: filtering would read every
            sample; filter the annotation file offline instead.
        **kwargs: The other ``BaseDataset`` arguments (``metainfo``,
            ``data_root``, ``data_prefix``, ``indices``, ``pipeline``,
            ``test_mode``, ``lazy_init``, ``max_refetch``).
    """

    def __init__(self,
                 ann_file: str = '',
                 ann_format: str = 'auto',
                 index_file: Optional[str] = None,
                 index_dir: Optional[str] = None,
                 on_stale_index: str = 'rebuild',
                 index_progress: bool = True,
                 materialize_shards: bool = False,
                 shard_dir: Optional[str] = None,
                 backend_args: Optional[dict] = None,
                 remote_cache_dir: Optional[str] = None,
                 remote_cache_limit: Union[int, str] = DEFAULT_FILES_LIMIT,
                 serialize_data: bool = False,
                 filter_cfg: Optional[dict] = None,
                 **kwargs) -> None:
        if filter_cfg:
            raise ValueError(
                'RankShardedDataset does not support filter_cfg: filtering '
                'would read all N samples on every rank. Filter the '
                f'annotation file offline (got filter_cfg={filter_cfg}).')
        if not ann_file:
            raise ValueError('RankShardedDataset needs an ann_file')
        warn_if_decode_too_small(kwargs.get('pipeline') or [])
        self.ann_format = ann_format
        self.index_file = index_file
        self.index_dir = index_dir
        self.on_stale_index = on_stale_index
        self.index_progress = index_progress
        self.materialize_shards = materialize_shards
        self.shard_dir = shard_dir
        self.backend_args = backend_args
        self.remote_cache_dir = remote_cache_dir
        self.remote_cache_limit = remote_cache_limit
        self.num_dropped = 0
        self._index = None
        self._line_ids: Union[range, np.ndarray, None] = None
        self._shard_writer: Optional[ShardFileWriter] = None
        self._shard_readers = ShardFileCache()
        super().__init__(
            ann_file=ann_file, serialize_data=False, **kwargs)

    def full_init(self) -> None:
        """Open (building if needed) the index; load nothing else."""
        if dataset_initialized(self):
            return
        self._format = annotation_format(self.ann_file, self.ann_format)
        local_file, beside = self.ann_file, True
        if is_remote(self.ann_file, self.backend_args):
            local_file = fetch_to_node(self.ann_file, self.backend_args,
                                       self.remote_cache_dir,
                                       self.remote_cache_limit)
            # The copy sits in the store's entries: the index goes elsewhere.
            beside = False
        index_path = self.index_file or default_index_path(
            local_file, self.index_dir, self._format, beside=beside,
            on_stale=self.on_stale_index)
        self._index = ensure_line_index(local_file, index_path,
                                        self._format, self.on_stale_index,
                                        self.index_progress)
        self._line_ids = range(self._index.num_samples)
        header = self._index.header_record()
        if header is not None:
            for key, value in json.loads(header)['metainfo'].items():
                dataset_metainfo(self).setdefault(key, value)
        classes = dataset_metainfo(self).get('classes')
        self._num_classes = len(classes) if classes else None
        if dataset_indices(self) is not None:
            self._line_ids = self._select(dataset_indices(self))
        mark_dataset_initialized(self)

    def load_data_list(self) -> List[dict]:
        raise TypeError(
            'RankShardedDataset never loads its data list; use '
            'get_data_info(idx) for one sample')

    def __len__(self) -> int:
        if not dataset_initialized(self):
            self.full_init()
        return len(self._line_ids)

    def __getstate__(self) -> dict:
        # The writer belongs to the main process (its sampler); workers only
        # read shard files.
        state = dict(self.__dict__)
        state['_shard_writer'] = None
        return state

    # ------------------------------------------------------------ samples
    def _check_index(self, idx: int) -> int:
        size = len(self)
        if not -size <= idx < size:
            raise IndexError(f'sample index {idx} is out of range for '
                             f'{self.ann_file} ({size} samples)')
        return idx % size

    def get_data_info(self, idx: int) -> dict:
        """The data info of sample ``idx`` (an int or a ``SampleIndex``).

        A ``SampleIndex`` whose ``shard`` names a shard file is read from
        that file; any other index from the annotation file.
        """
        if not dataset_initialized(self):
            self.full_init()
        shard = getattr(idx, 'shard', None)
        idx = self._check_index(int(idx))
        line = int(self._line_ids[idx])
        raw = self._read_shard(shard, idx) if shard else None
        if raw is None:
            raw = self._index.read(line)
        # The index build validated every line (UTF-8, format) with the
        # rules of annotation_lines, and LineIndex refuses a changed file
        # and bytes that no longer start and end a line; an in-place edit
        # inside them is still reported here. The location (a count of the
        # newlines before the sample) is found only for an error.
        try:
            # rstrip only: like annotation_lines, leading spaces belong to
            # the path (json.loads ignores surrounding whitespace itself).
            text = decode_text(raw, None).rstrip()
            if '\n' in text:  # a newline written into the line
                self._index.raise_moved(line)
            data_info = self._parse(text)
            if 'gt_label' in data_info:
                check_label(data_info['gt_label'], self._num_classes, None)
        except AnnotationFormatError as error:
            raise AnnotationFormatError(
                f'{self._index.where(line, self.ann_file)}: {error}') from None
        data_info['sample_idx'] = idx
        return data_info

    def _read_shard(self, shard: str, idx: int) -> Optional[bytes]:
        try:
            return self._shard_readers.get(shard).read(idx)
        except FileNotFoundError:
            # Removed already: a worker lagged more than a whole part behind
            # the sampler (tiny parts, deep prefetch). Same bytes, read from
            # the annotation file instead.
            return None

    def _parse(self, text: str) -> dict:
        if self._format == 'lines':
            path, label = split_path_label(text, None)
            return dict(
                img_path=osp.join(self.data_prefix.get('img_path', ''), path),
                gt_label=label)
        try:
            data_info = json.loads(text)
        except ValueError as error:
            raise AnnotationFormatError(
                f'invalid JSON record ({error}): '
                f'{text[:80]!r}') from None
        if not isinstance(data_info, dict):
            raise AnnotationFormatError(
                f'expected a JSON object (a data-info '
                f'dict), got {type(data_info).__name__}')
        for key, prefix in self.data_prefix.items():
            if key not in data_info:
                raise AnnotationFormatError(
                    f'the record has no {key!r}, which '
                    f'data_prefix names (set data_prefix to the path keys '
                    f'of your records)')
            data_info[key] = join_path(prefix, data_info[key])
        return data_info


    def get_cat_ids(self, idx: int) -> List[int]:
        """The category ids of sample ``idx`` (``ClassBalancedDataset``).

        Read from ``gt_label`` (classification: an int or a list) or from
        the ``bbox_label`` of each of ``instances`` (detection records, as
        mmdet's ``get_cat_ids``).
        """
        data_info = self.get_data_info(idx)
        if 'gt_label' in data_info:
            label = data_info['gt_label']
            return [int(v) for v in label] if isinstance(label, list) else [
                int(label)
            ]
        if 'instances' in data_info:
            return [
                int(instance['bbox_label'])
                for instance in data_info['instances']
                if 'bbox_label' in instance
            ]
        raise KeyError(f'sample {int(idx)} of {self.ann_file} has neither '
                       '"gt_label" nor "instances" with "bbox_label"')

    def prepare_data(self, idx) -> Any:
        """Run the pipeline; errors and drops name the sample and its file."""
        data_info = self.get_data_info(idx)
        try:
            data = self.pipeline(data_info)
        except Exception as error:
            _add_context(
                error, f'while loading sample {int(idx)} '
                f'({_describe(data_info)}) of {self.ann_file}')
            raise
        if data is None:
            if self.test_mode:
                raise RuntimeError(
                    f'The pipeline dropped sample {int(idx)} '
                    f'({_describe(data_info)}) of {self.ann_file} in test '
                    'mode, where every sample must be evaluated.')
            self.num_dropped += 1
            if (self.num_dropped <= _LOG_FIRST
                    or self.num_dropped % _LOG_EVERY == 0):
                print_log(
                    f'The pipeline dropped sample {int(idx)} '
                    f'({_describe(data_info)}) of {self.ann_file}; '
                    f'{self.num_dropped} dropped so far in this process, '
                    f'each replaced by a random sample (max_refetch='
                    f'{self.max_refetch}).',
                    logger='current',
                    level=logging.WARNING)
        return data

    # ------------------------------------------------------------ subsets
    def _select(self, indices: Union[int, Sequence[int], np.ndarray]):
        """The line ids of ``indices`` of the current dataset."""
        size = len(self._line_ids)
        if isinstance(indices, (int, np.integer)):
            count = min(abs(int(indices)), size)
            keep = slice(0, count) if indices >= 0 else slice(size - count,
                                                              size)
            return self._line_ids[keep]
        chosen = np.asarray(indices, dtype=np.int64).reshape(-1)
        if chosen.size and not (-size <= chosen.min()
                                and chosen.max() < size):
            raise IndexError(f'indices out of range for {self.ann_file} '
                             f'({size} samples)')
        chosen = chosen % max(size, 1)
        if isinstance(self._line_ids, range):
            return self._line_ids.start + chosen
        return self._line_ids[chosen]

    def get_subset_(self, indices: Union[int, Sequence[int]]) -> None:
        """Keep only ``indices`` (an int: the first/last ones; numpy ok)."""
        if not dataset_initialized(self):
            self.full_init()
        self._line_ids = self._select(indices)

    def get_subset(self,
                   indices: Union[int, Sequence[int]]) -> 'RankShardedDataset':
        """A copy holding only ``indices`` (an int: the first/last ones)."""
        if not dataset_initialized(self):
            self.full_init()
        subset = copy_without_annotation(self)
        subset._shard_writer = None
        subset._line_ids = self._select(indices)
        return subset

    # ------------------------------------------------- per-rank shard files
    def write_shard(self, indices: np.ndarray) -> str:
        """Copy the samples ``indices`` to a new local shard file.

        Called by the RankSharded samplers in the main process before they
        yield those indices; returns the path to tag them with.
        """
        if self._shard_writer is None:
            self._shard_writer = ShardFileWriter(
                self.shard_dir or tempfile.gettempdir(), self._index)
        keys = np.sort(indices)
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
        return self._shard_writer.write(keys, self._line_ids_of(keys))

    def _line_ids_of(self, keys: np.ndarray) -> np.ndarray:
        if isinstance(self._line_ids, range):
            return self._line_ids.start + keys
        return np.asarray(self._line_ids)[keys]


def _describe(data_info: Mapping) -> str:
    paths = [
        f'{key}={value!r}' for key, value in data_info.items()
        if key.endswith('_path')
    ]
    return ', '.join(paths) or f'sample_idx={data_info.get("sample_idx")}'


def _add_context(error: BaseException, text: str) -> None:
    add_note: Optional[Callable] = getattr(error, 'add_note', None)
    if add_note is not None:  # Python >= 3.11: shown with the traceback
        add_note(text)
    else:
        print_log(text, logger='current', level=logging.ERROR)
