"""Samples packed in LitData chunks, for the usual pipeline."""
import json
from typing import Dict, List, Optional

from mmengine.registry import DATASETS

from .litdata_chunk_scan import LitDataChunkError, litdata_scanner
from .mds_shard_dataset import MDSShardDataset
from .tar_shard_index import ShardFormat


@DATASETS.register_module()
class LitDataChunkDataset(MDSShardDataset):
    """LitData chunks (``litdata.optimize``), local or remote, read sample
    by sample.

    The chunks an ``index.json`` lists (LitData's default ``PyTreeLoader``,
    no compression, no encryption; each sample a dict) are indexed once per
    node like tar shards (:mod:`.tar_shard_index`, the leaves' spans found
    by :mod:`.litdata_chunk_scan`), so ``len`` and every sample cost O(1)
    memory per process. A sample's ``img_path`` is a ``tarmember://``
    path, the byte range of its image leaf in the chunk, that
    ``mmengine.fileio.get`` reads as exactly those bytes: the image file as
    LitData stored it (a ``jpeg`` leaf written from a ``JpegImageFile``,
    ``bytes``, ``image:<ext>``), so ``LoadImageFromFile`` and the other
    transforms work unchanged, and the node cache, ``ShardWindowSampler``
    and coalesced reads treat chunks as they treat tar shards. Each sample
    gives ``img_path``, ``sample_key`` (its number in its chunk),
    ``shard``, ``sample_idx`` and ``gt_label`` (``label_column``).

    Args:
        index (str): The data set's ``index.json``, relative to
            ``data_root`` (or a URL, or an absolute path); its chunks are
            the files beside it.
        image_column (str): The dict key of each sample's image leaf.
        label_column (str, optional): The key of an ``int`` leaf (or a
            ``str`` leaf holding an integer): the class label.
        **kwargs: ``index_file``, ``index_dir``, ``on_stale_index``,
            ``index_progress``, ``backend_args`` (used for ``index.json``
            too) and the other arguments of
            :class:`~.tar_shard_dataset.TarShardDataset` (which see), but
            ``shards``, ``image_ext`` and ``ann_ext``.
    """

    def __init__(self,
                 index: str = 'index.json',
                 image_column: str = 'image',
                 label_column: Optional[str] = None,
                 **kwargs) -> None:
        super().__init__(
            index=index,
            image_column=image_column,
            label_column=label_column,
            **kwargs)

    def _shard_list(self) -> List[str]:
        """The chunks ``index.json`` lists, beside it."""
        url = self.index
        try:
            url, listed = self._read_index()
            config, chunks = listed['config'], listed['chunks']
            self._leaves = _leaf_keys(config, url)
            self._formats = list(config['data_format'])
        except (ValueError, KeyError, TypeError) as error:
            raise LitDataChunkError(
                f'{url}: no LitData index.json (a JSON object with "config" '
                f'and "chunks"): {error!r}') from None
        _check_readable(config, url)
        if len(self._formats) != len(self._leaves):
            raise LitDataChunkError(
                f'{url}: {len(self._formats)} leaf formats for '
                f'{len(self._leaves)} keys {self._leaves}')
        folder = url.rsplit('/', 1)[0]
        self._chunk_bytes: Dict[str, int] = {}
        shards = []
        for number, chunk in enumerate(chunks):
            name = chunk.get('filename') if isinstance(chunk, dict) else None
            if not isinstance(name, str) or not name or '/' in name:
                raise LitDataChunkError(
                    f'{url}: chunk {number} names no chunk file')
            shards.append(f'{folder}/{name}')
            if isinstance(chunk.get('chunk_bytes'), int):
                self._chunk_bytes[shards[-1]] = chunk['chunk_bytes']
        return shards

    def _shard_format(self) -> ShardFormat:
        identity = 'litdata ' + ' '.join(
            f'{ext}={column}' for ext, column in self.columns.items())
        return ShardFormat(
            'litdata', identity,
            litdata_scanner(self.columns, self._leaves, self._formats,
                            self._chunk_bytes))


def _leaf_keys(config: dict, url: str) -> List[str]:
    """The dict keys of the leaves, in leaf order, from ``data_spec`` (a
    pytree spec: a dict of plain leaves)."""
    spec = json.loads(config['data_spec'])
    root = spec[1] if isinstance(spec, list) and len(spec) == 2 else None
    if (not isinstance(root, dict) or root.get('type') != 'builtins.dict'
            or any(child.get('children_spec')
                   for child in root.get('children_spec', []))):
        raise LitDataChunkError(
            f'{url}: each sample must be a flat dict (its data_spec is '
            f'{config["data_spec"][:200]})')
    return [str(key) for key in json.loads(root['context'])]


def _check_readable(config: dict, url: str) -> None:
    """Refuse what makes a leaf no byte range of its chunk."""
    for key, why in (('compression', 'compressed'),
                     ('encryption', 'encrypted')):
        if config.get(key):
            raise LitDataChunkError(
                f'{url}: the chunks are {why} ({key}={config[key]!r}): a '
                'sample must be a byte range of its chunk; optimize with '
                f'{key}=None')
    loader = config.get('item_loader', 'PyTreeLoader')
    if loader != 'PyTreeLoader':
        raise LitDataChunkError(
            f'{url}: item_loader {loader!r}; only PyTreeLoader chunks hold '
            'one sample per item')
