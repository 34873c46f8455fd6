"""Pack a ``relative/path label`` list into LitData chunks.

The layout is LitData's ``optimize`` output with its default
``PyTreeLoader``, no compression: each sample the dict
``{'image': bytes, 'label': int}`` (leaves ``bytes``: the image file as it
is, and ``int``), ``chunk-0-N.bin`` files and an ``index.json`` listing
them. LitData's ``StreamingDataset`` reads them, and
``LitDataChunkDataset`` reads them and chunks that LitData wrote.
"""
import json
import os
import os.path as osp
from typing import List

import numpy as np

from .annotation_lines import iter_path_labels
from .mds_shard_writer import write_atomically

#: The leaves written, in leaf order, and their serializers.
LEAVES = dict(image='bytes', label='int')
_LEAF_SPEC = dict(type=None, context=None, children_spec=[])


def pack_image_list_litdata(ann_file: str,
                            data_root: str,
                            out_dir: str,
                            samples_per_chunk: int = 1000) -> List[str]:
    """Write the listed images as the items of ``out_dir/chunk-0-N.bin``
    and their ``out_dir/index.json``; each file written to a temporary
    name and renamed, the index last, so a reader never sees half a chunk.

    Returns:
        list[str]: The chunks' paths.
    """
    os.makedirs(out_dir, exist_ok=True)
    samples = [(path, label)
               for _, path, label in iter_path_labels(ann_file)]
    chunks, entries = [], []
    for first in range(0, len(samples), samples_per_chunk):
        part = samples[first:first + samples_per_chunk]
        filename = f'chunk-0-{len(chunks)}.bin'
        data = _chunk_bytes(part, data_root)
        write_atomically(osp.join(out_dir, filename), data)
        chunks.append(osp.join(out_dir, filename))
        entries.append(
            dict(chunk_bytes=len(data), chunk_size=len(part), dim=None,
                 filename=filename))
    spec = [1, dict(type='builtins.dict', context=json.dumps(list(LEAVES)),
                    children_spec=[_LEAF_SPEC] * len(LEAVES))]
    config = dict(
        chunk_bytes=None,
        chunk_size=samples_per_chunk,
        compression=None,
        compression_batch_size=None,
        compression_level=None,
        data_format=list(LEAVES.values()),
        data_spec=json.dumps(spec),
        encryption=None,
        ipc_compression=None,
        item_loader='PyTreeLoader',
        types=dict(LEAVES))
    write_atomically(
        osp.join(out_dir, 'index.json'),
        json.dumps(dict(chunks=entries, config=config)).encode())
    return chunks


def _chunk_bytes(part: list, data_root: str) -> bytes:
    items = []
    for path, label in part:
        with open(osp.join(data_root, path), 'rb') as file:
            image = file.read()
        # The head: a uint32 size per leaf, in leaf order.
        items.append(
            np.array([len(image), 8], '<u4').tobytes() + image +
            np.int64(label).tobytes())
    table = 4 + 4 * (len(items) + 1)
    offsets = np.cumsum([0] + [len(item) for item in items]) + table
    if offsets[-1] >= 1 << 32:
        raise ValueError(f'{len(part)} samples from {part[0][0]} make a '
                         f'chunk of {offsets[-1]} bytes; LitData offsets are '
                         'uint32: pack fewer samples per chunk')
    return (np.uint32(len(items)).tobytes() +
            offsets.astype('<u4').tobytes() + b''.join(items))
