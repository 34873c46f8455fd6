"""Pack a ``relative/path label`` list into MosaicML Streaming MDS shards.

The layout is Streaming's ``MDSWriter`` without compression (version 2):
columns ``image`` (``bytes``: the image file as it is) and ``label``
(``int``), an ``index.json`` listing the shards. Streaming's own reader
reads them, and ``MDSShardDataset`` reads them and shards that
``MDSWriter`` wrote.
"""
import json
import os
import os.path as osp
from typing import List

import numpy as np

from .annotation_lines import iter_path_labels

#: The columns written, in column-name order as ``MDSWriter`` sorts them.
COLUMNS = dict(image='bytes', label='int')
_CONFIG = dict(version=2, format='mds', compression=None, hashes=[])


def pack_image_list_mds(ann_file: str,
                        data_root: str,
                        out_dir: str,
                        samples_per_shard: int = 1000) -> List[str]:
    """Write the listed images as the samples of ``out_dir/shard.NNNNN.mds``
    and their ``out_dir/index.json``; each file written to a temporary
    name and renamed, the index last, so a reader never sees half a shard.

    Returns:
        list[str]: The shards' paths.
    """
    os.makedirs(out_dir, exist_ok=True)
    samples = [(path, label)
               for _, path, label in iter_path_labels(ann_file)]
    config = dict(_CONFIG,
                  size_limit=None,
                  column_names=list(COLUMNS),
                  column_encodings=list(COLUMNS.values()),
                  column_sizes=[None, 8])
    shards, entries = [], []
    for first in range(0, len(samples), samples_per_shard):
        chunk = samples[first:first + samples_per_shard]
        basename = f'shard.{len(shards):05d}.mds'
        data = _shard_bytes(chunk, data_root, config)
        _write_atomically(osp.join(out_dir, basename), data)
        shards.append(osp.join(out_dir, basename))
        entries.append(
            dict(config,
                 raw_data=dict(basename=basename, bytes=len(data), hashes={}),
                 samples=len(chunk),
                 zip_data=None))
    _write_atomically(
        osp.join(out_dir, 'index.json'),
        json.dumps(dict(shards=entries, version=2), sort_keys=True).encode())
    return shards


def _shard_bytes(chunk: list, data_root: str, config: dict) -> bytes:
    encoded = []
    for path, label in chunk:
        with open(osp.join(data_root, path), 'rb') as file:
            image = file.read()
        # The head: a uint32 size per variable-size column (image).
        encoded.append(
            np.uint32(len(image)).tobytes() + image +
            np.int64(label).tobytes())
    config_bytes = json.dumps(config, sort_keys=True).encode()
    table = 4 + 4 * (len(encoded) + 1)
    offsets = np.cumsum([0] + [len(sample) for sample in encoded]) + (
        table + len(config_bytes))
    if offsets[-1] >= 1 << 32:
        raise ValueError(f'{len(chunk)} samples from {chunk[0][0]} make a '
                         f'shard of {offsets[-1]} bytes; MDS offsets are '
                         'uint32: pack fewer samples per shard')
    return (np.uint32(len(encoded)).tobytes() +
            offsets.astype('<u4').tobytes() + config_bytes +
            b''.join(encoded))


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f'{path}.tmp.{os.getpid()}'
    with open(tmp, 'wb') as file:
        file.write(data)
    os.replace(tmp, path)
