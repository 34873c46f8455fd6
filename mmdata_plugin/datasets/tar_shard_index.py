"""A memory-mapped index of the samples of a list of packed shards:
WebDataset tar shards, or MosaicML Streaming MDS shards (the scanner of
:mod:`.mds_shard_scan`; see :class:`ShardFormat`).

Built once (per node, the first process builds while the others wait on
the line index's lock) by reading every shard front to back once: a local
shard in place, a remote one streamed to a temporary file beside the index
(one GET per shard, never one per member). After that, sample ``i`` is one
record of a memory-mapped array: its shard and, per extension asked for,
the span of the member's data; a process holds no per-sample Python
object, whatever the number of samples.

File layout (little-endian, every array at an 8-byte boundary):

* ``records``: ``num_samples`` records of ``shard`` (uint32), ``offset`` and
  ``size`` (uint64 each, one per extension, in the order of ``exts``) and,
  when ``cls`` is one of the extensions, ``label`` (int64): 4 + 16 E (+ 8)
  bytes per sample;
* ``keys``: the keys' UTF-8 bytes, back to back;
* ``key_ends``: ``num_samples`` uint64, where each sample's key ends in
  ``keys``;
* the JSON header: version, extensions, record size, counts, where the
  arrays start, and per shard its URL (an absolute path if local), first
  sample, number of samples, size and mtime (local) or ETag (remote);
* 16 bytes: the header's offset (uint64), then the magic.

Staleness: a local shard's size and mtime are checked when the index is
opened (one ``stat`` per shard: cheap) and a changed one rebuilds the index
or is refused. A remote shard is not asked at open (one request per shard
and process would not be cheap at 1e4 shards): every member path carries
the shard's size and ETag and every range read is answered with them, so a
changed shard is refused at its first read, naming it, at no extra request
(by its size alone where the server sends no ETag).
"""
import hashlib
import json
import os
import os.path as osp
import re
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np
from mmengine.fileio import get_file_backend
from mmengine.logging import print_log

from ..remote.remote_backend import RemoteBackend
from ..remote.tar_member_backend import member_path
from .line_index import (ByteProgressBar, StaleIndexError, build_tmp_path,
                         fingerprint_changes, folder_writable,
                         index_build_lock, private_index_folder,
                         remove_abandoned_builds)
from .tar_shard_scan import LABEL_EXT, TarShardError, iter_shard_samples

INDEX_VERSION = 1
INDEX_SUFFIX = '.taridx'
_MAGIC = b'MMDTARI1'
_TRAILER = 16
# Samples buffered between writes while building.
_BATCH = 1 << 16


class ShardFormat(NamedTuple):
    """How the samples of one shard are found while indexing.

    Attributes:
        kind: Named in messages (``'tar'``, ``'mds'``).
        identity: Goes into the index's file name and header, so that an
            index built for another format or another choice of columns is
            never served (``'tar'`` for WebDataset shards).
        scan: ``scan(path, name, exts, previous)`` yields the
            :class:`~.tar_shard_scan.ShardSample` of the local shard file
            ``path`` (``name``: its URL, for messages; ``previous``: the
            ``(shard, key)`` of the sample before it).
    """
    kind: str
    identity: str
    scan: Callable


TAR_FORMAT = ShardFormat('tar', 'tar', iter_shard_samples)


def record_dtype(exts: Sequence[str]) -> np.dtype:
    """The dtype of one sample's record for extensions ``exts``."""
    fields = [('shard', '<u4'), ('offset', '<u8', (len(exts), )),
              ('size', '<u8', (len(exts), ))]
    if LABEL_EXT in exts:
        fields.append(('label', '<i8'))
    return np.dtype(fields)


def is_remote_shard(shard: str) -> bool:
    return '://' in shard


def default_tar_index_path(shards: Sequence[str],
                           exts: Sequence[str],
                           index_dir: Optional[str] = None,
                           shard_format: ShardFormat = TAR_FORMAT) -> str:
    """Where the index of ``shards`` is read from, or built.

    Next to the first shard when every shard is local, no ``index_dir`` is
    given, and that folder is writable or holds a valid index already (an
    admin built it for a read-only data set); otherwise in
    :func:`~.line_index.private_index_folder` (``index_dir``,
    ``$MMDATA_INDEX_DIR`` or ``~/.cache/mmdata_plugin/line_index``). The
    name holds a hash of the shard list, the extensions and the format
    (tar indexes keep the names they had before formats).
    """
    named = [*shards, ','.join(exts)]
    if shard_format.identity != TAR_FORMAT.identity:
        named.append(shard_format.identity)
    digest = hashlib.sha1('\n'.join(named).encode())
    stem = re.sub(r'[^\w.-]', '_', shards[0].rstrip('/').rsplit('/', 1)[-1])
    name = f'{stem}.{digest.hexdigest()[:12]}{INDEX_SUFFIX}'
    private = osp.join(private_index_folder(index_dir), name)
    if index_dir is not None or any(map(is_remote_shard, shards)):
        return private
    beside = osp.join(osp.dirname(shards[0]), name)
    if folder_writable(osp.dirname(beside)) or tar_index_problem(
            beside, shards, exts, shard_format) is None:
        return beside
    return private


class TarShardIndex:
    """Read-only access to a tar shard index; cheap to pickle.

    Each process maps the file on first use (spawned workers unpickle only
    the header).

    Args:
        path (str): The index file.
    """

    def __init__(self, path: str):
        self.path = path
        self.header = read_header(path)
        self.exts: List[str] = self.header['exts']
        self.num_samples: int = self.header['num_samples']
        self.shards: List[Dict] = self.header['shards']
        self._tags = [
            str(shard['mtime_ns']) if 'mtime_ns' in shard else
            (shard['etag'] or '') for shard in self.shards
        ]
        self._arrays: Optional[tuple] = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state['_arrays'] = None
        return state

    @property
    def records(self) -> np.ndarray:
        """All samples' records (memory-mapped)."""
        return self._mapped()[0]

    def _mapped(self) -> tuple:
        if self._arrays is None:
            header = self.header
            records = np.memmap(
                self.path,
                dtype=record_dtype(self.exts),
                mode='r',
                offset=header['records_offset'],
                shape=(self.num_samples, ))
            key_ends = np.memmap(
                self.path,
                dtype='<u8',
                mode='r',
                offset=header['key_ends_offset'],
                shape=(self.num_samples, ))
            keys = np.memmap(
                self.path,
                dtype=np.uint8,
                mode='r',
                offset=header['keys_offset'],
                shape=(header['keys_size'], ))
            # Plain ndarray views of the maps: indexing a np.memmap makes
            # a memmap of every element (4-5x the cost of a record).
            self._arrays = tuple(
                array.view(np.ndarray) for array in (records, key_ends, keys))
        return self._arrays

    def member_path(self, sample: int, ext: str) -> str:
        """The ``tarmember://`` path of sample ``sample``'s ``.ext``."""
        record = self.records[sample]
        column = self.exts.index(ext)
        shard = self._shard_number(record, sample)
        return member_path(self.shards[shard]['url'],
                           int(record['offset'][column]),
                           int(record['size'][column]),
                           self.shards[shard]['size'], self._tags[shard])

    def member_size(self, sample: int, ext: str) -> int:
        """The bytes of sample ``sample``'s ``.ext`` member."""
        return int(self.records[sample]['size'][self.exts.index(ext)])

    def label(self, sample: int) -> int:
        """The class label of sample ``sample`` (from its ``.cls``)."""
        return int(self.records[sample]['label'])

    def key(self, sample: int) -> str:
        """The key of sample ``sample``."""
        _, key_ends, keys = self._mapped()
        start = int(key_ends[sample - 1]) if sample else 0
        return keys[start:int(key_ends[sample])].tobytes().decode()

    def shard(self, sample: int) -> str:
        """The URL (or path) of the shard holding sample ``sample``."""
        record = self.records[sample]
        return self.shards[self._shard_number(record, sample)]['url']

    def shard_sizes(self) -> np.ndarray:
        """Samples per shard, in shard order (int64; from the header, so
        O(shards) whatever the number of samples)."""
        return np.array([shard['samples'] for shard in self.shards],
                        np.int64)

    def _shard_number(self, record, sample: int) -> int:
        shard = int(record['shard'])
        if not 0 <= shard < len(self.shards):
            raise StaleIndexError(
                f'{self.path}: sample {sample} names shard {shard} of '
                f'{len(self.shards)}: the index is damaged; delete it to '
                'rebuild')
        return shard


def read_header(path: str) -> Dict:
    """The JSON header of the index file ``path``.

    Raises:
        StaleIndexError: Not an index of this version, or truncated.
    """
    with open(path, 'rb') as file:
        size = os.fstat(file.fileno()).st_size
        file.seek(max(0, size - _TRAILER))
        trailer = file.read(_TRAILER)
        if len(trailer) < _TRAILER or not trailer.endswith(_MAGIC):
            raise StaleIndexError(f'{path} is not a tar shard index (or a '
                                  'truncated one)')
        header_offset = int.from_bytes(trailer[:8], 'little')
        if header_offset > size - _TRAILER:
            raise StaleIndexError(f'{path}: damaged header')
        file.seek(header_offset)
        try:
            header = json.loads(file.read(size - _TRAILER - header_offset))
        except ValueError:
            raise StaleIndexError(f'{path}: damaged header') from None
    if not isinstance(header, dict) or header.get(
            'version') != INDEX_VERSION:
        version = header.get('version') if isinstance(header, dict) else None
        raise StaleIndexError(f'{path}: index version {version}, need '
                              f'{INDEX_VERSION}')
    # A damaged or foreign file is rebuilt like a stale one, never mapped
    # past its arrays or indexed out of its shard list.
    try:
        _check_layout(header, header_offset)
    except (KeyError, TypeError, ValueError) as error:
        raise StaleIndexError(f'{path}: damaged header ({error!r})') from None
    return header


def _check_layout(header: Dict, header_offset: int) -> None:
    """Raise ValueError (or KeyError, TypeError) unless the arrays the
    header places lie in order before it and its shards add up."""
    samples = header['num_samples']
    record_size = record_dtype(header['exts']).itemsize
    records_end = header['records_offset'] + samples * record_size
    keys_end = header['keys_offset'] + header['keys_size']
    key_ends_end = header['key_ends_offset'] + 8 * samples
    in_order = (0 <= header['records_offset'] <= records_end <=
                header['keys_offset'] <= keys_end <=
                header['key_ends_offset'] <= key_ends_end <= header_offset)
    counted = sum(int(shard['samples']) for shard in header['shards'])
    if (header['record_size'] != record_size or not in_order
            or counted != samples or not all(
                isinstance(shard['url'], str) and int(shard['size']) >= 0
                for shard in header['shards'])):
        raise ValueError('arrays out of place or shards not adding up')


def local_fingerprint(path: str) -> Dict:
    stat = os.stat(path)
    return dict(size=stat.st_size, mtime_ns=stat.st_mtime_ns)


def tar_index_problem(
        index_path: str,
        shards: Sequence[str],
        exts: Sequence[str],
        shard_format: ShardFormat = TAR_FORMAT) -> Optional[str]:
    """Why ``index_path`` cannot serve ``shards`` now, or None if it can."""
    if not osp.exists(index_path):
        return 'missing'
    try:
        header = read_header(index_path)
    except StaleIndexError as error:
        return str(error)
    built_as = header.get('format', TAR_FORMAT.identity)
    if built_as != shard_format.identity:
        return (f'it was built as {built_as!r}, not '
                f'{shard_format.identity!r}')
    if header['exts'] != list(exts):
        return (f'it was built for the extensions {header["exts"]}, not '
                f'{list(exts)}')
    if [shard['url'] for shard in header['shards']] != list(shards):
        return 'it was built for another list of shards'
    for shard in header['shards']:
        if is_remote_shard(shard['url']):
            continue
        if not osp.isfile(shard['url']):
            return f'the shard {shard["url"]} is gone'
        recorded = dict(size=shard['size'], mtime_ns=shard['mtime_ns'])
        changes = fingerprint_changes(recorded,
                                      local_fingerprint(shard['url']))
        if changes:
            return f'the shard {shard["url"]} changed ({changes})'
    return None


def ensure_tar_shard_index(shards: Sequence[str],
                           index_path: str,
                           exts: Sequence[str],
                           backend_args: Optional[dict] = None,
                           on_stale: str = 'rebuild',
                           progress: bool = True,
                           shard_format: ShardFormat = TAR_FORMAT
                           ) -> TarShardIndex:
    """Open the index of ``shards``, building it first if needed.

    Every process may call this at once: the first one on a node builds
    while the others wait, then all of them reuse the file.

    Args:
        shards (Sequence[str]): Absolute local paths or URLs, in order.
        index_path (str): The index file.
        exts (Sequence[str]): Extensions every sample must have.
        backend_args (dict, optional): fileio ``backend_args`` of remote
            shards.
        on_stale (str): ``'rebuild'`` an index whose shards changed, or
            ``'error'``: refuse it and stop.
        progress (bool): Show a progress bar while building.
        shard_format (ShardFormat): How the shards are read (tar by
            default).
    """
    if on_stale not in ('rebuild', 'error'):
        raise ValueError(
            f'on_stale_index must be "rebuild" or "error", got {on_stale!r}')
    with index_build_lock(index_path):
        problem = tar_index_problem(index_path, shards, exts, shard_format)
        if problem is not None and problem != 'missing':
            if on_stale == 'error':
                raise StaleIndexError(
                    f'The index {index_path} does not match its shards: '
                    f'{problem}. Delete it, or set on_stale_index='
                    '"rebuild".')
            print_log(f'Rebuilding {index_path}: {problem}.',
                      logger='current')
        if problem is not None:
            remove_abandoned_builds(index_path)
            build_tar_shard_index(shards, index_path, exts, backend_args,
                                  progress, shard_format)
    return TarShardIndex(index_path)


def build_tar_shard_index(shards: Sequence[str],
                          index_path: str,
                          exts: Sequence[str],
                          backend_args: Optional[dict] = None,
                          progress: bool = True,
                          shard_format: ShardFormat = TAR_FORMAT) -> Dict:
    """Read every shard once and write the index atomically.

    Raises:
        TarShardError: A shard is no well-formed WebDataset tar (or, by
            its scanner, MDS shard), a key is split across two shards, or
            there are no samples at all.

    Returns:
        dict: The header written, plus ``seconds``.
    """
    start_time = time.perf_counter()
    os.makedirs(osp.dirname(osp.abspath(index_path)), exist_ok=True)
    tmp_path = build_tmp_path(index_path)
    parts = [tmp_path + suffix for suffix in ('.keys', '.key_ends')]
    writer = _RecordWriter(exts)
    kind = shard_format.kind
    bar = ByteProgressBar(len(shards),
                          f'indexing {len(shards)} {kind} shards',
                          progress,
                          unit='shards')
    try:
        with open(tmp_path, 'wb') as out, open(parts[0], 'wb') as keys, \
                open(parts[1], 'wb') as key_ends:
            writer.open(out, keys, key_ends)
            records = []
            for number, shard in enumerate(shards):
                records.append(
                    _index_shard(number, shard, exts, backend_args,
                                 tmp_path + '.shard', writer,
                                 shard_format.scan))
                bar.update(number + 1)
            writer.flush()
        if writer.count == 0:
            raise TarShardError(
                f'{len(shards)} shards ({shards[0]}, ...) hold no sample '
                f'with the members {list(exts)}')
        header = _assemble(tmp_path, parts, writer, exts, records,
                           shard_format.identity)
        os.replace(tmp_path, index_path)
    finally:
        for path in [tmp_path, tmp_path + '.shard', *parts]:
            if osp.exists(path):
                os.remove(path)
    bar.close()
    seconds = time.perf_counter() - start_time
    print_log(
        f'Indexed {len(shards)} {kind} shards: {writer.count} samples in '
        f'{seconds:.1f} s -> {index_path}',
        logger='current')
    return dict(header, seconds=seconds)


def _index_shard(number: int, shard: str, exts: Sequence[str],
                 backend_args: Optional[dict], download_path: str,
                 writer: '_RecordWriter', scan: Callable) -> Dict:
    """Write the records of one shard; return its header entry."""
    first = writer.count
    if is_remote_shard(shard):
        backend = get_file_backend(
            shard, backend_args=backend_args, enable_singleton=True)
        if not isinstance(backend, RemoteBackend):
            raise TypeError(
                f'{shard}: remote shards are read through mmdata_plugin\'s '
                f'remote backends, not {type(backend).__name__}; set '
                'backend_args=dict(backend="s3", ...) or "remote_http"')
        with open(download_path, 'wb') as sink:
            stat = backend.download(shard, sink)
        entry = dict(url=shard, size=stat.size, etag=stat.etag)
        writer.add_shard(
            number, shard,
            scan(download_path, shard, exts, writer.last))
        os.remove(download_path)
    else:
        fingerprint = local_fingerprint(shard)
        writer.add_shard(
            number, shard,
            scan(shard, shard, exts, writer.last))
        if local_fingerprint(shard) != fingerprint:
            raise StaleIndexError(f'{shard} changed while it was being '
                                  'indexed')
        entry = dict(url=shard, **fingerprint)
    return dict(entry, first=first, samples=writer.count - first)


class _RecordWriter:
    """Buffers records and keys and appends them to the build's files."""

    def __init__(self, exts: Sequence[str]) -> None:
        self.exts = exts
        self.dtype = record_dtype(exts)
        self.count = 0
        self.keys_size = 0
        # (shard, key) of the last sample written
        self.last: Optional[tuple] = None
        self._buffer = np.zeros(_BATCH, self.dtype)
        self._ends = np.zeros(_BATCH, '<u8')
        self._keys = bytearray()
        self._filled = 0

    def open(self, records, keys, key_ends) -> None:
        self._files = (records, keys, key_ends)

    def add_shard(self, number: int, shard: str, samples) -> None:
        for sample in samples:
            record = self._buffer[self._filled]
            record['shard'] = number
            record['offset'] = [sample.spans[ext][0] for ext in self.exts]
            record['size'] = [sample.spans[ext][1] for ext in self.exts]
            if sample.label is not None:
                record['label'] = sample.label
            try:
                key = sample.key.encode()
            except UnicodeEncodeError:  # tarfile's surrogate escapes
                raise TarShardError(
                    f'{shard}: the key of the sample at byte '
                    f'{sample.offset} is not UTF-8 '
                    f'({sample.key.encode(errors="replace")!r})') from None
            self._keys += key
            self.keys_size += len(key)
            self._ends[self._filled] = self.keys_size
            self._filled += 1
            self.count += 1
            self.last = (shard, sample.key)
            if self._filled == _BATCH:
                self.flush()

    def flush(self) -> None:
        records, keys, key_ends = self._files
        records.write(self._buffer[:self._filled].tobytes())
        key_ends.write(self._ends[:self._filled].tobytes())
        keys.write(self._keys)
        self._keys.clear()
        self._filled = 0


def _assemble(tmp_path: str, parts: Sequence[str], writer: _RecordWriter,
              exts: Sequence[str], shards: List[Dict],
              identity: str) -> Dict:
    """Append the keys, the header and the trailer to the records."""
    with open(tmp_path, 'r+b') as out:
        out.seek(0, os.SEEK_END)
        offsets = {}
        for name, part in zip(('keys_offset', 'key_ends_offset'), parts):
            out.write(b'\0' * (-out.tell() % 8))
            offsets[name] = out.tell()
            with open(part, 'rb') as src:
                while True:
                    chunk = src.read(1 << 22)
                    if not chunk:
                        break
                    out.write(chunk)
        header = dict(
            version=INDEX_VERSION,
            format=identity,
            exts=list(exts),
            record_size=writer.dtype.itemsize,
            num_samples=writer.count,
            records_offset=0,
            keys_size=writer.keys_size,
            shards=shards,
            **offsets)
        header_offset = out.tell()
        out.write(json.dumps(header).encode())
        out.write(header_offset.to_bytes(8, 'little') + _MAGIC)
        out.flush()
        os.fsync(out.fileno())
    return header
