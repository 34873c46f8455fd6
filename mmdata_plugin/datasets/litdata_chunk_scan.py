"""The samples of one LitData chunk, read from its offsets.

A chunk (``chunk-R-N.bin``, written by LitData's ``optimize`` or
``BinaryWriter`` with its default ``PyTreeLoader``, uncompressed and
unencrypted) is: the number of items ``n`` (uint32), ``n + 1`` item offsets
from the chunk's start (uint32), then the items back to back. An item is a
uint32 size per leaf of the flattened sample, then every leaf's bytes in
leaf order; ``index.json``'s ``data_format`` names each leaf's serializer
and ``data_spec`` the dict keys the leaves are. That is an MDS sample
whose every column has its size in the head, so the leaves are found as
:mod:`.mds_shard_scan` finds columns.

A leaf serialized as ``jpeg`` (the JPEG file as it was opened), ``bytes``
or ``image:<ext>`` holds an image file's bytes; an ``int`` leaf (int64) or
a ``str`` leaf holding an integer is a class label, read once while
indexing. The chunk is checked end to end: offsets in order, the first
right after the table, the last at the file's end (and at the size
``index.json`` records), every item's leaves adding up to its length.
"""
import functools
from typing import Callable, Dict, Iterator, List, Optional, Sequence

from .mds_shard_scan import (IMAGE_ENCODINGS, MDSShardError, column_spans,
                             item_offsets, mapped_bytes, numbered_samples)
from .tar_shard_scan import LABEL_EXT, ShardSample

#: LitData's serializer names and the MDS encoding of the same bytes.
_AS_MDS = {'jpeg': 'jpeg', 'bytes': 'bytes', 'int': 'int', 'str': 'str_int'}


class LitDataChunkError(MDSShardError):
    """A LitData chunk is damaged, or a leaf asked for cannot be read as a
    byte range (or as a class label)."""


def mds_encoding(data_format: str) -> Optional[str]:
    """The MDS encoding of a LitData leaf serializer whose bytes are read
    as they are (None: not readable so): ``image:<ext>`` leaves hold the
    image file."""
    if data_format.startswith('image:'):
        return 'bytes'
    return _AS_MDS.get(data_format)


def litdata_scanner(columns: Dict[str, str], leaves: List[str],
                    formats: List[str],
                    chunk_bytes: Optional[Dict[str, int]] = None
                    ) -> Callable:
    """The ``scan`` of a :class:`~.tar_shard_index.ShardFormat` reading the
    leaves ``{ext: leaf key}`` of LitData chunks whose leaves are
    ``leaves`` serialized as ``formats``; ``chunk_bytes`` are the sizes
    ``index.json`` records per chunk URL."""
    return functools.partial(
        iter_litdata_samples,
        columns=columns,
        leaves=leaves,
        formats=formats,
        chunk_bytes=chunk_bytes or {})


def iter_litdata_samples(path: str,
                         name: str,
                         exts: Sequence[str],
                         previous: Optional[tuple] = None,
                         *,
                         columns: Dict[str, str],
                         leaves: List[str],
                         formats: List[str],
                         chunk_bytes: Optional[Dict[str, int]] = None
                         ) -> Iterator[ShardSample]:
    """The samples of the local LitData chunk ``path``, in chunk order.

    Args:
        path (str): A local copy of the chunk.
        name (str): Its URL or path, named in errors.
        exts (Sequence[str]): The index's extensions; ``'cls'`` maps to a
            label leaf, any other to an image leaf (``columns``).
        previous: Unused (the scanner protocol of the index passes it).
        columns (dict): ``{ext: leaf key}``.
        leaves (list[str]): The leaf keys, in leaf order.
        formats (list[str]): Their serializers (``data_format``).
        chunk_bytes (dict, optional): ``{chunk name: bytes}`` as
            ``index.json`` records them.

    Yields:
        ShardSample: key = the item's number in the chunk, as a string.

    Raises:
        MDSShardError: (or its :class:`LitDataChunkError`) naming the
            chunk and the item or byte.
    """
    data = mapped_bytes(path)
    recorded = (chunk_bytes or {}).get(name)
    if recorded is not None and recorded != len(data):
        raise LitDataChunkError(
            f'{name}: {len(data)} bytes, index.json says {recorded} '
            '(truncated, or not the chunk the index lists)')
    offsets = item_offsets(data, name, 'LitData chunk', 'item',
                           LitDataChunkError, right_after_table=True)
    for ext in exts:
        _check_leaf(name, ext, columns[ext], leaves, formats)
    config = dict(
        column_names=list(leaves),
        column_encodings=[mds_encoding(f) or f for f in formats],
        column_sizes=[None] * len(leaves))
    yield from numbered_samples(
        offsets, *column_spans(data, offsets, config, name, exts, columns))


def _check_leaf(name: str, ext: str, leaf: str, leaves: List[str],
                formats: List[str]) -> None:
    if leaf not in leaves:
        raise LitDataChunkError(
            f'{name}: no leaf {leaf!r}; its leaves: '
            f'{dict(zip(leaves, formats))}')
    data_format = formats[leaves.index(leaf)]
    encoding = mds_encoding(data_format)
    if ext == LABEL_EXT:
        ok, wanted = encoding in ('int', 'str_int'), '"int" or "str"'
    else:
        ok = encoding in IMAGE_ENCODINGS
        wanted = ('"jpeg", "bytes" or "image:<ext>": the bytes of an image '
                  'file ("pil" stores raw pixels)')
    if not ok:
        raise LitDataChunkError(
            f'{name}: leaf {leaf!r} is serialized as {data_format!r}; as '
            f'{"the label" if ext == LABEL_EXT else "the image"} it must be '
            f'{wanted}')
