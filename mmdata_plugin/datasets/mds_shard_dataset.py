"""Samples packed in MosaicML Streaming MDS shards, for the usual pipeline."""
import json
import os.path as osp
from typing import Any, List, Optional, Tuple

from mmengine.fileio import get, join_path
from mmengine.registry import DATASETS

from .mds_shard_scan import ANN_EXT, MDSShardError, mds_scanner
from .tar_shard_dataset import TarShardDataset
from .tar_shard_index import ShardFormat, is_remote_shard
from .tar_shard_scan import LABEL_EXT

#: The index's name for the image column's span.
IMAGE_EXT = 'image'


@DATASETS.register_module()
class MDSShardDataset(TarShardDataset):
    """MosaicML Streaming MDS shards, local or remote, read sample by
    sample.

    The shards an ``index.json`` lists (Streaming's ``MDSWriter`` without
    compression, or :func:`~.mds_shard_writer.pack_image_list_mds`) are
    indexed once per node like tar shards (:mod:`.tar_shard_index`, the
    columns' spans found by :mod:`.mds_shard_scan`), so ``len`` and every
    sample cost O(1) memory per process. A sample's ``img_path`` is a
    ``tarmember://`` path, the byte range of its image column in the shard,
    that ``mmengine.fileio.get`` reads as exactly those bytes: the image
    file as it was written (``jpeg``, ``png`` or ``bytes`` columns), so
    ``LoadImageFromFile`` and the other transforms work unchanged, and the
    node cache, ``ShardWindowSampler`` and coalesced reads treat MDS shards
    as they treat tar shards. Each sample gives ``img_path``,
    ``sample_key`` (its number in its shard), ``shard``, ``sample_idx`` and
    ``gt_label`` (``label_column``) or the keys of its JSON object
    (``ann_column``).

    Args:
        index (str): The data set's ``index.json``, relative to
            ``data_root`` (or a URL, or an absolute path); its shards are
            the ``raw_data`` files beside it.
        image_column (str): The column holding each sample's image file.
        label_column (str, optional): An integer column (``int``,
            ``int8`` .. ``uint64``, ``str_int``): the class label.
        ann_column (str, optional): A ``json`` column whose object is
            merged into the sample (e.g. ``instances``); not with
            ``label_column``.
        **kwargs: ``index_file``, ``index_dir``, ``on_stale_index``,
            ``index_progress``, ``backend_args`` (used for ``index.json``
            too) and the other arguments of :class:`TarShardDataset`
            (which see), but ``shards``, ``image_ext`` and ``ann_ext``.
    """

    def __init__(self,
                 index: str = 'index.json',
                 image_column: str = 'image',
                 label_column: Optional[str] = None,
                 ann_column: Optional[str] = None,
                 **kwargs) -> None:
        if label_column and ann_column:
            raise ValueError('MDSShardDataset takes label_column or '
                             'ann_column, not both')
        self.index = index
        self.columns = {IMAGE_EXT: image_column}
        ann_ext = None
        if label_column:
            ann_ext, self.columns[LABEL_EXT] = LABEL_EXT, label_column
        elif ann_column:
            ann_ext, self.columns[ANN_EXT] = ANN_EXT, ann_column
        super().__init__(
            shards=index, image_ext=IMAGE_EXT, ann_ext=ann_ext, **kwargs)

    def _read_index(self) -> Tuple[str, Any]:
        """The URL (or absolute path) of ``index.json`` and what it holds
        (``ValueError`` if it is no JSON)."""
        url = self.index if is_remote_shard(self.index) or not \
            self.data_root else join_path(self.data_root, self.index)
        if not is_remote_shard(url):
            url = osp.abspath(url)
        return url, json.loads(get(url, backend_args=self.backend_args))

    def _shard_list(self) -> List[str]:
        """The shards ``index.json`` lists, beside it."""
        url = self.index
        try:
            url, listed = self._read_index()
            entries = listed['shards']
        except (ValueError, KeyError, TypeError) as error:
            raise MDSShardError(f'{url}: no MDS index.json (a JSON object '
                                f'with "shards"): {error!r}') from None
        folder = url.rsplit('/', 1)[0]
        shards = [
            f'{folder}/{_raw_basename(entry, number, url)}'
            for number, entry in enumerate(entries)
        ]
        # Checked when each shard is indexed (read whole then anyway).
        self._hashes = {
            shard: _recorded_hashes(entry)
            for shard, entry in zip(shards, entries)
        }
        return shards

    def _shard_format(self) -> ShardFormat:
        identity = 'mds ' + ' '.join(f'{ext}={column}'
                                     for ext, column in self.columns.items())
        return ShardFormat('mds', identity,
                           mds_scanner(self.columns, self._hashes))


def _raw_basename(entry: dict, number: int, url: str) -> str:
    """The uncompressed shard of ``index.json``'s entry ``number``."""
    where = f'{url}: shard {number}'
    kind = entry.get('format') if isinstance(entry, dict) else None
    if kind != 'mds':
        raise MDSShardError(f'{where} is no MDS shard (format {kind!r})')
    if entry.get('compression'):
        raise MDSShardError(
            f'{where} is compressed ({entry["compression"]}): a sample must '
            'be a byte range of its shard; write the shards with '
            'compression=None')
    basename = (entry.get('raw_data') or {}).get('basename')
    if not isinstance(basename, str) or not basename or '/' in basename:
        raise MDSShardError(f'{where} names no shard file in raw_data')
    return basename


def _recorded_hashes(entry: dict) -> dict:
    """``{algorithm: hex digest}`` index.json records of a shard."""
    hashes = entry['raw_data'].get('hashes')
    return {
        algorithm: digest
        for algorithm, digest in hashes.items()
        if isinstance(algorithm, str) and isinstance(digest, str)
    } if isinstance(hashes, dict) else {}
