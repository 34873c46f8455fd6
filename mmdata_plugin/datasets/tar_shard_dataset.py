"""Samples packed in WebDataset tar shards, for the usual pipeline."""
import glob
import json
import os.path as osp
import re
from typing import List, Optional, Sequence, Union

import numpy as np
from mmengine.dataset import BaseDataset
from mmengine.fileio import join_path
from mmengine.registry import DATASETS

from ..remote.tar_member_backend import TarMemberBackend
from ..transforms.decode_target import warn_if_decode_too_small
from ..utils.torch_internals import (dataset_initialized,
                                     mark_dataset_initialized)
from .annotation_lines import AnnotationFormatError
from .tar_shard_index import (TAR_FORMAT, ShardFormat, default_tar_index_path,
                              ensure_tar_shard_index, is_remote_shard)
from .tar_shard_scan import LABEL_EXT

_RANGE = re.compile(r'\{(\d+)\.\.(\d+)\}')
_ANN_EXTS = (None, LABEL_EXT, 'json')


def expand_shards(shards: Union[str, Sequence[str]],
                  data_root: str = '') -> List[str]:
    """The shard list a config names, each joined with ``data_root``
    (unless it is a URL itself).

    A string is expanded: ``{000000..000099}`` ranges (WebDataset's
    notation, zero-padded like the first bound), then a local pattern with
    ``*``/``?``/``[`` is globbed (sorted); a local file that is no ``.tar``
    lists one shard per line. Local shards become absolute paths.
    """
    names = [shards] if isinstance(shards, str) else list(shards)
    found = []
    for name in names:
        joined = name if is_remote_shard(name) or not data_root else \
            join_path(data_root, name)
        for path in _expand_ranges(joined):
            if is_remote_shard(path):
                found.append(path)
            elif glob.has_magic(path):
                found.extend(sorted(map(osp.abspath, glob.glob(path))))
            elif not path.endswith('.tar') and osp.isfile(path):
                listed = _listed_shards(path)
                found.extend(
                    expand_shards(listed, data_root or osp.dirname(path)))
            else:
                found.append(osp.abspath(path))
    return found


def _listed_shards(path: str) -> List[str]:
    """The lines of a list file (a local file not named ``.tar``)."""
    try:
        with open(path, encoding='utf-8') as lines:
            return [line.strip() for line in lines if line.strip()]
    except UnicodeDecodeError as error:
        raise ValueError(
            f'{path}: a shard whose name does not end with .tar is read as '
            f'a text file listing shards, and this is none ({error}); '
            'name tar shards *.tar') from None


def _expand_ranges(pattern: str) -> List[str]:
    match = _RANGE.search(pattern)
    if match is None:
        return [pattern]
    first, last = match.groups()
    head, tail = pattern[:match.start()], pattern[match.end():]
    return [
        expanded for number in range(int(first), int(last) + 1)
        for expanded in _expand_ranges(
            f'{head}{number:0{len(first)}d}{tail}')
    ]


#: Data-info keys the dataset sets itself; a ``.json`` member may not.
DATASET_KEYS = frozenset(('img_path', 'sample_key', 'shard', 'sample_idx'))


@DATASETS.register_module()
class TarShardDataset(BaseDataset):
    """WebDataset tar shards, local or remote, read sample by sample.

    A sample is the run of members of a shard that share a key (WebDataset's
    layout). An index of all samples (:mod:`.tar_shard_index`) is built
    once per node and memory-mapped, so ``len`` and every sample cost O(1)
    memory per process. A sample's ``img_path`` is a ``tarmember://`` path
    (:mod:`mmdata_plugin.remote.tar_member_backend`) that
    ``mmengine.fileio.get`` reads as exactly the member's bytes, so
    ``LoadImageFromFile`` and the other transforms work unchanged. Each
    sample gives ``img_path``, ``sample_key``, ``shard``, ``sample_idx``
    and, from its annotation member, ``gt_label`` (``.cls``) or the keys of
    its JSON object (``.json``, e.g. ``instances``).

    Args:
        shards (str | list[str]): The shards, relative to ``data_root``: a
            list, or a string with ``{000..099}`` ranges, a glob pattern
            (local) or a local text file listing one shard per line.
            ``s3://``/``http(s)://`` shards are read through fileio.
        image_ext (str): Extension of the image member every sample has.
        ann_ext (str, optional): ``'cls'`` (an integer label) or
            ``'json'`` (a data-info dict); every sample must have it.
            None: images only.
        index_file (str, optional): Where the index is. Default: next to
            the first shard if it is local and that folder is writable,
            else ``index_dir``.
        index_dir (str, optional): Folder for indexes of remote or
            read-only shards (default ``$MMDATA_INDEX_DIR`` or
            ``~/.cache/mmdata_plugin/line_index``).
        on_stale_index (str): When a local shard changed since the index
            was built: ``'rebuild'`` (default) or ``'error'``.
        index_progress (bool): Show a progress bar while indexing.
        backend_args (dict, optional): fileio backend arguments of remote
            shards (e.g. an S3 ``endpoint_url``), used to build the index
            and read ``.json`` members. The transforms read images with
            their own ``backend_args``: for a store that needs arguments
            there, ``dict(backend='tarmember', shard_backend_args=...)``.
        serialize_data (bool): Accepted for config compatibility and
            ignored: nothing is loaded, so nothing is serialized.
        filter_cfg (dict, optional): Must be None (filtering would read
            every sample; filter when packing the shards).
        indices (int | list, optional): Must be None (take a subset with a
            sampler or by packing fewer shards).
        **kwargs: The other ``BaseDataset`` arguments (``metainfo``,
            ``data_root``, ``pipeline``, ``test_mode``, ``lazy_init``,
            ``max_refetch``).
    """

    def __init__(self,
                 shards: Union[str, Sequence[str]] = (),
                 image_ext: str = 'jpg',
                 ann_ext: Optional[str] = None,
                 index_file: Optional[str] = None,
                 index_dir: Optional[str] = None,
                 on_stale_index: str = 'rebuild',
                 index_progress: bool = True,
                 backend_args: Optional[dict] = None,
                 serialize_data: bool = False,
                 filter_cfg: Optional[dict] = None,
                 indices: Optional[Union[int, Sequence[int]]] = None,
                 **kwargs) -> None:
        if filter_cfg or indices is not None:
            raise ValueError(
                f'{type(self).__name__} supports neither filter_cfg nor '
                'indices: both would read every sample; choose the samples '
                'when packing the shards')
        if not shards:
            raise ValueError(f'{type(self).__name__} needs shards')
        if ann_ext not in _ANN_EXTS:
            raise ValueError(f'ann_ext must be one of {_ANN_EXTS}, got '
                             f'{ann_ext!r}')
        warn_if_decode_too_small(kwargs.get('pipeline') or [])
        self.shards = shards
        self.image_ext = image_ext
        self.ann_ext = ann_ext
        self.index_file = index_file
        self.index_dir = index_dir
        self.on_stale_index = on_stale_index
        self.index_progress = index_progress
        self.backend_args = backend_args
        self._index = None
        self._members = TarMemberBackend(backend_args)
        super().__init__(serialize_data=False, **kwargs)

    def full_init(self) -> None:
        """Open (building if needed) the index; load nothing else."""
        if dataset_initialized(self):
            return
        shards = self._shard_list()
        exts = [self.image_ext] + ([self.ann_ext] if self.ann_ext else [])
        shard_format = self._shard_format()
        index_path = self.index_file or default_tar_index_path(
            shards, exts, self.index_dir, shard_format)
        self._index = ensure_tar_shard_index(shards, index_path, exts,
                                             self.backend_args,
                                             self.on_stale_index,
                                             self.index_progress,
                                             shard_format)
        mark_dataset_initialized(self)

    def _shard_list(self) -> List[str]:
        """The shards, absolute paths or URLs, in sample order."""
        shards = expand_shards(self.shards, self.data_root)
        if not shards:
            raise FileNotFoundError(f'No shard matches {self.shards!r} '
                                    f'(data_root={self.data_root!r})')
        return shards

    def _shard_format(self) -> ShardFormat:
        return TAR_FORMAT

    def load_data_list(self) -> List[dict]:
        raise TypeError('TarShardDataset never loads its data list; use '
                        'get_data_info(idx) for one sample')

    def __len__(self) -> int:
        if not dataset_initialized(self):
            self.full_init()
        return self._index.num_samples

    def shard_sizes(self) -> np.ndarray:
        """Samples per shard in the order of the indices: shard 0 holds
        samples ``0 .. sizes[0] - 1``, and so on (``ShardWindowSampler``
        reads whole shards from it)."""
        if not dataset_initialized(self):
            self.full_init()
        return self._index.shard_sizes()

    def sample_nbytes(self, idx: int, key: str) -> Optional[int]:
        """Bytes of the file under data-info key ``key`` of sample ``idx``,
        from the index (nothing read; the node cache's plan sizes samples
        with it, see :class:`~mmdata_plugin.remote_cache.pipeline_routing.
        SampleFiles`): the image member's under ``img_path``, 0 under a
        key the samples lack, None (unknown) under one a ``.json`` member
        may set."""
        if not dataset_initialized(self):
            self.full_init()
        if key == 'img_path':
            return self._index.member_size(int(idx), self.image_ext)
        return None if self.ann_ext == 'json' and \
            key not in DATASET_KEYS else 0

    def get_data_info(self, idx: int) -> dict:
        """The data info of sample ``idx`` (an int or a ``SampleIndex``)."""
        size = len(self)
        idx = int(idx)
        if not -size <= idx < size:
            raise IndexError(f'sample index {idx} is out of range for '
                             f'{size} samples of {self.shards!r}')
        idx %= size
        index = self._index
        data_info = dict(
            img_path=index.member_path(idx, self.image_ext),
            sample_key=index.key(idx),
            shard=index.shard(idx))
        if self.ann_ext == LABEL_EXT:
            data_info['gt_label'] = index.label(idx)
        elif self.ann_ext:
            data_info.update(self._annotation(idx))
        data_info['sample_idx'] = idx
        return data_info

    def _annotation(self, idx: int) -> dict:
        raw = self._members.get(self._index.member_path(idx, self.ann_ext))
        try:
            record = json.loads(raw)
        except ValueError as error:
            record = error
        where = f'{self._index.shard(idx)}: {self._index.key(idx)}.' \
            f'{self.ann_ext}'
        if not isinstance(record, dict):
            raise AnnotationFormatError(
                f'{where} is no JSON object (a data-info dict): '
                f'{raw[:80]!r}')
        # A member naming its own img_path would have the pipeline read any
        # file or URL instead of the shard's bytes.
        taken = sorted(DATASET_KEYS.intersection(record))
        if taken:
            raise AnnotationFormatError(
                f'{where} sets {taken}, which the dataset gives from the '
                'shard index; rename them in the annotations')
        return record

    def get_cat_ids(self, idx: int) -> List[int]:
        """The class of sample ``idx`` (``ClassBalancedDataset``)."""
        return [int(self.get_data_info(idx)['gt_label'])]
