"""Pack a ``relative/path label`` list into LitData chunks.

The layout is LitData's ``optimize`` output with its default
``PyTreeLoader``, no compression: each sample the dict
``{'image': bytes, 'label': int}`` (leaves ``bytes``: the image file as it
is, and ``int``), ``chunk-0-N.bin`` files and an ``index.json`` listing
them. LitData's ``StreamingDataset`` reads them, and
``LitDataChunkDataset`` reads them and chunks that LitData wrote.
"""
import json
import os.path as osp
from typing import List, Tuple

import numpy as np

from .mds_shard_writer import offset_table, pack_files, write_atomically

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
    written = pack_files(ann_file, data_root, out_dir, samples_per_chunk,
                         'chunk-0-{}.bin', _chunk_bytes)
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
    chunks = [
        dict(chunk_bytes=nbytes, chunk_size=count, dim=None, filename=name)
        for name, nbytes, count in written
    ]
    write_atomically(
        osp.join(out_dir, 'index.json'),
        json.dumps(dict(chunks=chunks, config=config)).encode())
    return [osp.join(out_dir, name) for name, _, _ in written]


def _chunk_bytes(images: List[Tuple[bytes, int]]) -> bytes:
    # The head: a uint32 size per leaf, in leaf order.
    items = [
        np.array([len(image), 8], '<u4').tobytes() + image +
        np.int64(label).tobytes() for image, label in images
    ]
    return offset_table(items, 0, 'chunk') + b''.join(items)
