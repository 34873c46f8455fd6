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
from typing import Callable, List, Tuple

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
    config = dict(_CONFIG,
                  size_limit=None,
                  column_names=list(COLUMNS),
                  column_encodings=list(COLUMNS.values()),
                  column_sizes=[None, 8])
    config_bytes = json.dumps(config, sort_keys=True).encode()

    def shard_bytes(images: List[Tuple[bytes, int]]) -> bytes:
        # The head: a uint32 size per variable-size column (image).
        samples = [
            np.uint32(len(image)).tobytes() + image + np.int64(label).tobytes()
            for image, label in images
        ]
        return offset_table(samples, len(config_bytes), 'shard') + \
            config_bytes + b''.join(samples)

    written = pack_files(ann_file, data_root, out_dir, samples_per_shard,
                         'shard.{:05d}.mds', shard_bytes)
    entries = [
        dict(config,
             raw_data=dict(basename=name, bytes=nbytes, hashes={}),
             samples=count,
             zip_data=None) for name, nbytes, count in written
    ]
    write_atomically(
        osp.join(out_dir, 'index.json'),
        json.dumps(dict(shards=entries, version=2), sort_keys=True).encode())
    return [osp.join(out_dir, name) for name, _, _ in written]


def pack_files(ann_file: str, data_root: str, out_dir: str, per_file: int,
               name_format: str,
               file_bytes: Callable[[List[Tuple[bytes, int]]], bytes]
               ) -> List[Tuple[str, int, int]]:
    """Write the images ``ann_file`` lists (``relative/path label``
    lines), ``per_file`` at a time, as the files ``name_format.format(n)``
    in ``out_dir`` whose bytes ``file_bytes`` makes of their ``(image file
    bytes, label)``; each atomically.

    Returns:
        list[tuple]: ``(file name, bytes, samples)`` of each file.
    """
    os.makedirs(out_dir, exist_ok=True)
    samples = [(path, label)
               for _, path, label in iter_path_labels(ann_file)]
    written = []
    for first in range(0, len(samples), per_file):
        images = []
        for path, label in samples[first:first + per_file]:
            with open(osp.join(data_root, path), 'rb') as file:
                images.append((file.read(), label))
        name = name_format.format(len(written))
        data = file_bytes(images)
        write_atomically(osp.join(out_dir, name), data)
        written.append((name, len(data), len(images)))
    return written


def offset_table(items: List[bytes], between: int, what: str) -> bytes:
    """The item count and the ``n + 1`` uint32 offsets (from the file's
    start) of ``items`` laid out ``between`` bytes after the table.

    Raises:
        ValueError: The file outgrows uint32 offsets (``what`` it is).
    """
    table = 4 + 4 * (len(items) + 1)
    offsets = np.cumsum([0] + [len(item) for item in items]) + (table +
                                                                between)
    if offsets[-1] >= 1 << 32:
        raise ValueError(f'{len(items)} samples make a {what} of '
                         f'{offsets[-1]} bytes; its offsets are uint32: '
                         f'pack fewer samples per {what}')
    return np.uint32(len(items)).tobytes() + offsets.astype('<u4').tobytes()


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to a temporary name beside ``path``, then rename it:
    a reader never sees half a file."""
    tmp = f'{path}.tmp.{os.getpid()}'
    with open(tmp, 'wb') as file:
        file.write(data)
    os.replace(tmp, path)
