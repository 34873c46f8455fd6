"""The samples of one MosaicML Streaming MDS shard, read from its offsets.

An MDS shard (``shard.00000.mds``, written by Streaming's ``MDSWriter``
without compression) is: the number of samples ``n`` (uint32), ``n + 1``
sample offsets from the shard's start (uint32), the writer's JSON config
(column names, encodings and fixed sizes, in column-name order), then the
samples back to back. A sample is a uint32 size per column of variable
size, then every column's bytes in column order.

A column of encoding ``jpeg``, ``png`` or ``bytes`` holds an image file's
bytes as they are (Streaming's ``JPEG`` writes the file it was opened from,
or PIL's JPEG), so its span in the shard is what ``LoadImageFromFile``
decodes; a label column (``int``, a fixed-size integer or ``str_int``) is
read once while indexing; a ``json`` column is an annotation read with the
sample. The shard is checked end to end while indexing: its digests
against those ``index.json`` records (hashlib's algorithms), offsets in
order, the last one at the file's end, every sample's columns adding up to
its length.
"""
import functools
import hashlib
import json
from typing import Callable, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np

from .tar_shard_scan import LABEL_EXT, ShardSample, TarShardError

#: Encodings whose bytes are an image file (decoded by LoadImageFromFile).
IMAGE_ENCODINGS = ('jpeg', 'png', 'bytes')
#: Encodings of a class label column, and their numpy types.
_INT_TYPES = {
    'int': '<i8',
    'int8': 'i1',
    'int16': '<i2',
    'int32': '<i4',
    'int64': '<i8',
    'uint8': 'u1',
    'uint16': '<u2',
    'uint32': '<u4',
    'uint64': '<u8',
}
LABEL_ENCODINGS = (*_INT_TYPES, 'str_int')
ANN_EXT = 'json'
#: What each role's column may be encoded as (the image role: any ext).
_ROLE_ENCODINGS = {LABEL_EXT: LABEL_ENCODINGS, ANN_EXT: ('json', )}
_ROLE_NAMES = {LABEL_EXT: 'the label', ANN_EXT: 'annotations'}


class MDSShardError(TarShardError):
    """An MDS shard is damaged, compressed, or lacks a column asked for."""


def mds_scanner(columns: Dict[str, str],
                hashes: Optional[Dict[str, Dict[str, str]]] = None
                ) -> Callable:
    """The ``scan`` of a :class:`~.tar_shard_index.ShardFormat` reading the
    columns ``{ext: column name}`` of MDS shards, checking each against
    the hex digests ``hashes[shard URL]`` (``{algorithm: digest}``, as
    Streaming's ``index.json`` records them)."""
    return functools.partial(
        iter_mds_samples, columns=columns, hashes=hashes or {})


def iter_mds_samples(path: str,
                     name: str,
                     exts: Sequence[str],
                     previous: Optional[tuple] = None,
                     *,
                     columns: Dict[str, str],
                     hashes: Optional[Dict[str, Dict[str, str]]] = None
                     ) -> Iterator[ShardSample]:
    """The samples of the local MDS shard ``path``, in shard order.

    Args:
        path (str): A local copy of the shard.
        name (str): Its URL or path, named in errors.
        exts (Sequence[str]): The index's extensions; each maps to a
            column in ``columns``: ``'cls'`` a label column, ``'json'`` an
            annotation column, any other an image column.
        previous: Unused (MDS samples have no keys to split across
            shards); the scanner protocol of the index passes it.
        columns (dict): ``{ext: column name}``.
        hashes (dict, optional): ``{shard name: {algorithm: hex digest}}``;
            those of ``name`` in :mod:`hashlib` are checked (Streaming's
            ``xxh*`` are not: xxhash is no dependency of ours).

    Yields:
        ShardSample: key = the sample's number in the shard, as a string.

    Raises:
        MDSShardError: Naming the shard and the sample or byte.
    """
    data = mapped_bytes(path)
    _check_hashes(data, name, (hashes or {}).get(name, {}))
    offsets, config = _layout(data, name)
    yield from numbered_samples(
        offsets, *column_spans(data, offsets, config, name, exts, columns))


def numbered_samples(offsets: np.ndarray, spans: Dict,
                     labels: Optional[list]) -> Iterator[ShardSample]:
    """The samples of a shard from :func:`column_spans`, keyed by their
    number in it."""
    for number in range(len(offsets) - 1):
        yield ShardSample(
            key=str(number),
            offset=int(offsets[number]),
            spans={
                ext: (int(starts[number]), int(sizes[number]))
                for ext, (starts, sizes) in spans.items()
            },
            label=None if labels is None else int(labels[number]))


def mapped_bytes(path: str) -> np.ndarray:
    """The bytes of the local file ``path``, memory-mapped (an empty file
    cannot be mapped)."""
    return np.memmap(path, np.uint8, 'r') if _size(path) else np.zeros(
        0, np.uint8)


def _check_hashes(data: np.ndarray, name: str, hashes: Dict[str,
                                                               str]) -> None:
    for algorithm, want in sorted(hashes.items()):
        if algorithm not in hashlib.algorithms_available or \
                algorithm.startswith('shake_'):
            continue
        got = hashlib.new(algorithm, data).hexdigest()
        if got != want:
            raise MDSShardError(
                f'{name}: its {algorithm} is {got}, index.json says {want} '
                '(a damaged shard, or not the one the index lists)')


def _size(path: str) -> int:
    with open(path, 'rb') as file:
        return file.seek(0, 2)


def item_offsets(data: np.ndarray,
                 name: str,
                 kind: str = 'MDS shard',
                 noun: str = 'sample',
                 error: type = MDSShardError,
                 right_after_table: bool = False) -> np.ndarray:
    """The ``n + 1`` item offsets (int64) of a file that starts with the
    item count ``n`` and the offsets (uint32, from the file's start):
    checked to be in order, after the table (``right_after_table``: at
    its end) and ending at the file's end, else ``error`` naming the file
    (``name``), its ``kind`` and the items' ``noun``."""
    if len(data) < 8:
        raise error(f'{name}: {len(data)} bytes, too short for a {kind}')
    count = int(data[:4].view('<u4')[0])
    table_end = 4 + 4 * (count + 1)
    if table_end > len(data):
        raise error(
            f'{name}: {count} {noun}s need {table_end} bytes of offsets, '
            f'the file has {len(data)} (no {kind}, or truncated)')
    offsets = data[4:table_end].view('<u4').astype(np.int64)
    misplaced = (offsets[0] != table_end
                 if right_after_table else offsets[0] < table_end)
    if misplaced or np.any(np.diff(offsets) < 0):
        raise error(f'{name}: the {noun} offsets are out of order (no '
                    f'{kind}, or a damaged one)')
    if offsets[-1] != len(data):
        raise error(
            f'{name}: its {noun}s end at byte {int(offsets[-1])}, the file '
            f'has {len(data)} bytes (truncated, or not the {kind} that was '
            'written)')
    return offsets


def _layout(data: np.ndarray, name: str) -> Tuple[np.ndarray, dict]:
    """The sample offsets (``n + 1``, int64) and the writer's config."""
    offsets = item_offsets(data, name)
    table_end = 4 + 4 * len(offsets)
    try:
        config = json.loads(data[table_end:offsets[0]].tobytes())
        config['column_names'], config['column_encodings']
    except (ValueError, KeyError, TypeError):
        raise MDSShardError(f'{name}: no MDS config between bytes '
                            f'{table_end} and {int(offsets[0])}') from None
    if config.get('format') != 'mds':
        raise MDSShardError(f'{name}: format {config.get("format")!r}, '
                            'not "mds"')
    return offsets, config


def column_spans(data: np.ndarray, offsets: np.ndarray, config: dict,
                 name: str, exts: Sequence[str],
                 columns: Dict[str, str]) -> Tuple[Dict, Optional[list]]:
    """``{ext: (starts, sizes)}`` of every sample's column for ``ext``, and
    the labels (or None), computed for the whole shard at once.

    ``config`` is an MDS writer's (``column_names``, ``column_encodings``,
    ``column_sizes``: None for a column whose size each sample's head
    gives, as a uint32 in column order)."""
    names = config['column_names']
    encodings = config['column_encodings']
    fixed = config.get('column_sizes') or [None] * len(names)
    for ext in exts:
        _check_column(name, ext, columns[ext], names, encodings)
    starts = offsets[:-1]
    variable = [i for i, size in enumerate(fixed) if size is None]
    # Each sample's column sizes: the fixed ones, then those its head
    # gives (a uint32 per variable column at the sample's start).
    heads = 4 * len(variable)
    if len(starts) and np.any(offsets[1:] - starts < heads):
        raise MDSShardError(f'{name}: a sample is shorter than its '
                            f'{heads}-byte head of column sizes')
    sizes = np.empty((len(starts), len(names)), np.int64)
    for position, column in enumerate(variable):
        at = starts + 4 * position
        sizes[:, column] = _uint32_at(data, at)
    for column, size in enumerate(fixed):
        if size is not None:
            sizes[:, column] = size
    ends = starts[:, None] + heads + np.cumsum(sizes, axis=1)
    wrong = np.flatnonzero(ends[:, -1] != offsets[1:])
    if len(wrong):
        sample = int(wrong[0])
        raise MDSShardError(
            f'{name}: the columns of sample {sample} (bytes '
            f'{int(starts[sample])}..{int(offsets[sample + 1])}) do not add '
            'up to its length (a damaged shard)')
    spans = {}
    for ext in exts:
        column = names.index(columns[ext])
        spans[ext] = (ends[:, column] - sizes[:, column], sizes[:, column])
    labels = None
    if LABEL_EXT in exts:
        labels = _labels(data, *spans[LABEL_EXT],
                         encodings[names.index(columns[LABEL_EXT])], name)
    return spans, labels


def _check_column(name: str, ext: str, column: str, names: list,
                  encodings: list) -> None:
    if column not in names:
        raise MDSShardError(f'{name}: no column {column!r}; its columns: '
                            f'{dict(zip(names, encodings))}')
    encoding = encodings[names.index(column)]
    allowed = _ROLE_ENCODINGS.get(ext, IMAGE_ENCODINGS)
    if encoding not in allowed:
        hint = '' if ext in _ROLE_ENCODINGS else (
            ': the bytes of an image file ("pil" stores raw pixels)')
        raise MDSShardError(
            f'{name}: column {column!r} is encoded as {encoding!r}; as '
            f'{_ROLE_NAMES.get(ext, "the image")} it must be one of '
            f'{list(allowed)}{hint}')


def _uint32_at(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian uint32 at each byte position ``at``."""
    if not len(at):
        return np.zeros(0, np.int64)
    quads = data[at[:, None] + np.arange(4)].astype(np.int64)
    return quads @ np.array([1, 1 << 8, 1 << 16, 1 << 24], np.int64)


def _labels(data: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
            encoding: str, name: str) -> list:
    if encoding in _INT_TYPES:
        dtype = np.dtype(_INT_TYPES[encoding])
        gathered = data[starts[:, None] + np.arange(dtype.itemsize)]
        return [int(value) for value in
                np.ascontiguousarray(gathered).view(dtype)[:, 0]]
    labels = []
    for sample, (start, size) in enumerate(zip(starts, sizes)):
        text = data[start:start + size].tobytes()
        try:
            labels.append(int(text.decode()))
        except ValueError:
            raise MDSShardError(
                f'{name}: sample {sample}: {text[:40]!r} is no integer '
                'class label') from None
    return labels
