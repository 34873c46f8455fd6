"""A byte-offset index of the sample lines of an annotation file.

The index is the only whole-file work: built once per file (per node), by the
first process that needs it while the others wait on a node-local lock,
written atomically, and reused by later runs as long as the annotation file
is unchanged. After that, reading sample ``i`` costs two ``pread`` calls, so a
process holds no per-sample data at all: the bytes stay in the page cache,
shared by every rank and worker of the node.

File layout: a 4 KiB header (magic, then JSON: source fingerprint, format,
counts, ``data_start``: 3 after a UTF-8 byte-order mark, else 0), then
``num_samples + 1`` little-endian uint64 offsets: the first byte of every
sample line and, last, the file size. Sample ``i`` is the bytes
``[offset[i], offset[i + 1])``; they may end with blank lines, which are
whitespace and disappear when the line is stripped.

The fingerprint cannot see every edit (a same-size change in the middle of
the file with its mtime restored), so each read also checks that the bytes
still start and end a line: the first follows a newline (or starts the
data), the last is a newline (or the file's last byte). An edit that moves a
line boundary fails that check (the dataset also refuses a newline inside
the stripped line).
"""
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import os.path as osp
import sys
import tempfile
import time
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
from mmengine.logging import print_log

from ..cache.process_owner import (current_owner, owner_file_name,
                                   remove_files_of_dead_owners)
from .annotation_lines import (LINE_FORMATS, UTF8_BOM, AnnotationFormatError,
                               sample_line_starts)

INDEX_VERSION = 1
INDEX_SUFFIX = '.idx'
INDEX_DIR_ENV = 'MMDATA_INDEX_DIR'
_MAGIC = b'MMDLIDX1'
_HEADER_SIZE = 4096
# Between an index's path and its builder in the name of a build's file.
_TMP_INFIX = '.tmp.'
# Small enough that the vectorised scan stays in the CPU caches (measured:
# 4 MiB chunks scan ~1.8x faster than 64 MiB ones).
_CHUNK_SIZE = 4 << 20
# Error messages count newlines (for a line number) up to this offset only.
_LINE_COUNT_LIMIT = 64 << 20
_EDGE_SIZE = 64 << 10


class StaleIndexError(RuntimeError):
    """The index does not describe the annotation file as it is now."""


def annotation_format(ann_file: str, ann_format: str = 'auto') -> str:
    """``'lines'`` or ``'jsonl'``; ``'auto'`` decides by the extension."""
    if ann_format == 'auto':
        ext = osp.splitext(ann_file)[1].lower()
        return 'jsonl' if ext in ('.jsonl', '.ndjson') else 'lines'
    if ann_format not in LINE_FORMATS:
        raise ValueError(f'ann_format must be "auto" or one of '
                         f'{LINE_FORMATS}, got {ann_format!r}')
    return ann_format


def shared_index_path(ann_file: str) -> str:
    """The index next to the annotation file, which every node reuses."""
    return osp.abspath(ann_file) + INDEX_SUFFIX


def private_index_folder(index_dir: Optional[str] = None) -> str:
    """``index_dir``, else ``$MMDATA_INDEX_DIR``, else
    ``~/.cache/mmdata_plugin/line_index``: where indexes go that are not
    kept next to their data."""
    return index_dir or os.environ.get(INDEX_DIR_ENV) or osp.join(
        osp.expanduser('~'), '.cache', 'mmdata_plugin', 'line_index')


def private_index_path(ann_file: str, index_dir: Optional[str] = None) -> str:
    """The index in :func:`private_index_folder`, under a name that
    includes a hash of the annotation file's real path."""
    key = hashlib.sha1(osp.realpath(ann_file).encode()).hexdigest()[:12]
    return osp.join(
        private_index_folder(index_dir),
        f'{osp.basename(ann_file)}.{key}{INDEX_SUFFIX}')


def folder_writable(folder: str) -> bool:
    """Whether this process may create files in ``folder``."""
    return os.access(folder, os.W_OK)


def default_index_path(ann_file: str,
                       index_dir: Optional[str] = None,
                       fmt: Optional[str] = None,
                       beside: bool = True,
                       on_stale: str = 'rebuild') -> str:
    """Where the index of ``ann_file`` is read from, or built.

    The index next to the annotation file whenever it is valid, whether or
    not that folder is writable (an admin builds it once for a shared,
    read-only dataset with ``tools/build_annotation_index.py``). A missing or
    stale one is built next to the file too if the folder is writable and
    no ``index_dir`` is given; otherwise in :func:`private_index_path`.

    Args:
        ann_file (str): The annotation file.
        index_dir (str, optional): Folder for indexes that cannot or should
            not be built next to the annotation file.
        fmt (str, optional): ``'lines'`` or ``'jsonl'`` (default: by the
            extension).
        beside (bool): False for a file in a folder that is not ours (a
            cache's entries): its index is always the private one.
        on_stale (str): ``'error'`` refuses a stale index next to the file
            rather than building a private one in its place.
    """
    if not beside:
        return private_index_path(ann_file, index_dir)
    shared = shared_index_path(ann_file)
    fmt = fmt or annotation_format(ann_file)
    problem = index_problem(shared, ann_file, fmt) if osp.isfile(
        ann_file) else 'missing'
    if problem is None:
        return shared
    if index_dir is None and folder_writable(osp.dirname(shared)):
        return shared
    private = private_index_path(ann_file, index_dir)
    if problem != 'missing':
        if on_stale == 'error':
            raise _stale(shared, ann_file, problem)
        print_log(
            f'Not using {shared}: {problem}; the index of this run is '
            f'{private}.',
            logger='current',
            level=logging.WARNING)
    return private


def _stale(index_path: str, ann_file: str, problem: str) -> StaleIndexError:
    return StaleIndexError(
        f'The index {index_path} does not match {ann_file}: {problem}. '
        'Delete it or rebuild it with tools/build_annotation_index.py, or '
        'set on_stale_index="rebuild".')


def file_fingerprint(path: str) -> Dict:
    """Size, mtime and a hash of the first and last 64 KiB of a file."""
    stat = os.stat(path)
    digest = hashlib.blake2b(digest_size=16)
    with open(path, 'rb') as file:
        digest.update(file.read(_EDGE_SIZE))
        file.seek(max(0, stat.st_size - _EDGE_SIZE))
        digest.update(file.read(_EDGE_SIZE))
    return dict(
        size=stat.st_size, mtime_ns=stat.st_mtime_ns, edges=digest.hexdigest())


def fingerprint_changes(recorded: Dict, current: Dict) -> str:
    """``key old -> new`` for each key of ``current`` that differs."""
    return ', '.join(f'{key} {recorded.get(key)} -> {value}'
                     for key, value in current.items()
                     if recorded.get(key) != value)


class LineIndex:
    """Read-only access to an index file; cheap to pickle.

    Each process opens its own file descriptors on first use (forked
    workers inherit none, spawned workers unpickle only the paths).

    Args:
        path (str): The index file.
        ann_file (str, optional): The annotation file as this process sees
            it (default: the path recorded when the index was built; a
            shared folder may be mounted elsewhere now).
    """

    def __init__(self, path: str, ann_file: Optional[str] = None):
        self.path = path
        with open(path, 'rb') as file:
            self.header = _read_header(file, path)
        self.ann_file = ann_file or self.header['ann_file']
        self.num_samples = self.header['num_samples']
        self._data_start = self.header.get('data_start', 0)
        self._size = self.header['fingerprint']['size']
        self._fds: Optional[Tuple[int, int, int]] = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state['_fds'] = None
        return state

    def _open(self) -> Tuple[int, int]:
        if self._fds is None or self._fds[0] != os.getpid():
            self._check_unchanged()
            self._fds = (os.getpid(), os.open(self.path, os.O_RDONLY),
                         os.open(self.ann_file, os.O_RDONLY))
        return self._fds[1], self._fds[2]

    def _check_unchanged(self) -> None:
        stat = os.stat(self.ann_file)
        recorded = self.header['fingerprint']
        if (stat.st_size, stat.st_mtime_ns) != (recorded['size'],
                                                 recorded['mtime_ns']):
            now = dict(size=stat.st_size, mtime_ns=stat.st_mtime_ns)
            raise StaleIndexError(
                f'{self.ann_file} changed after its index {self.path} was '
                f'opened ({fingerprint_changes(recorded, now)}); restart the '
                'run to re-index it')

    def span(self, sample: int) -> Tuple[int, int]:
        """Byte range ``[start, end)`` of sample ``sample``."""
        index_fd, _ = self._open()
        raw = os.pread(index_fd, 16, _HEADER_SIZE + 8 * sample)
        return (int.from_bytes(raw[:8], 'little'),
                int.from_bytes(raw[8:], 'little'))

    def read(self, sample: int) -> bytes:
        """The raw bytes of sample ``sample``.

        Raises:
            StaleIndexError: If the bytes no longer start and end a line.
        """
        start, end = self.span(sample)
        _, ann_fd = self._open()
        # One pread also fetches the byte before the line, which must be a
        # newline (except at the start of the data).
        before = int(start > self._data_start)
        raw = os.pread(ann_fd, end - start + before, start - before)
        if (len(raw) != end - start + before or (before and raw[0] != 10)
                or (raw[-1] != 10 and end != self._size)):
            self.raise_moved(sample)
        return raw[1:] if before else raw

    def check_spans(self, buf: np.ndarray, buf_start: int,
                    starts: np.ndarray, ends: np.ndarray,
                    samples: np.ndarray) -> None:
        """:meth:`read`'s check for many samples read in one buffer.

        Args:
            buf (np.ndarray): uint8 bytes of the annotation file from
                ``buf_start`` on, including the byte before each span that
                does not start the data.
            buf_start (int): File offset of ``buf[0]``.
            starts (np.ndarray): int64 spans of ``samples``, inside ``buf``.
            ends (np.ndarray): int64 ends of those spans.
            samples (np.ndarray): The samples, for the error message.
        """
        follows = starts <= self._data_start
        inner = ~follows
        follows[inner] = buf[starts[inner] - 1 - buf_start] == 10
        ends_line = (ends == self._size) | (buf[ends - 1 - buf_start] == 10)
        bad = np.flatnonzero(~(follows & ends_line))
        if bad.size:
            self.raise_moved(int(samples[bad[0]]))

    def raise_moved(self, sample: int) -> None:
        """Raise the error for a sample whose bytes are not a whole line."""
        start, end = self.span(sample)
        raise StaleIndexError(
            f'{self.where(sample)}: the annotation file changed after its '
            f'index {self.path} was built: bytes [{start}, {end}) of sample '
            f'{sample} no longer hold one whole line (an in-place edit with '
            'the size and mtime kept?). Rebuild the index '
            '(tools/build_annotation_index.py --force) or delete it.')

    @property
    def data_start(self) -> int:
        """Where the first line starts (after a byte-order mark)."""
        return self._data_start

    def where(self, sample: int, name: Optional[str] = None) -> str:
        """``file:line`` of sample ``sample`` for error messages (``file:
        record i at byte b`` far into the file, see :meth:`line_number`).

        Args:
            sample (int): The sample.
            name (str, optional): How to call the file (the dataset's
                ``ann_file``, e.g. a URL whose node copy this indexes).
        """
        name = name or self.ann_file
        line_number = self.line_number(sample)
        if line_number is None:
            start, _ = self.span(sample)
            return f'{name}: record {sample} at byte {start}'
        return f'{name}:{line_number}'

    def spans(self, samples: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`span` for an int array of samples."""
        offsets = np.memmap(
            self.path,
            dtype='<u8',
            mode='r',
            offset=_HEADER_SIZE,
            shape=(self.num_samples + 1, ))
        try:
            return (offsets[samples].astype(np.int64),
                    offsets[samples + 1].astype(np.int64))
        finally:
            del offsets

    def header_record(self) -> Optional[bytes]:
        """The JSON Lines ``{"metainfo": ...}`` first line, if any."""
        span = self.header.get('header_span')
        if span is None:
            return None
        _, ann_fd = self._open()
        return os.pread(ann_fd, span[1] - span[0], span[0])

    def line_number(self, sample: int) -> Optional[int]:
        """1-based line number of sample ``sample``, for error messages.

        It needs a count of the newlines before the sample, so it is given
        only within the first ``_LINE_COUNT_LIMIT`` bytes (None beyond): a
        worker must not scan tens of GB before it can raise.
        """
        start, _ = self.span(sample)
        if start > _LINE_COUNT_LIMIT:
            return None
        _, ann_fd = self._open()
        newlines, pos = 0, 0
        while pos < start:
            chunk = os.pread(ann_fd, min(_CHUNK_SIZE, start - pos), pos)
            if not chunk:
                return None  # the file shrank under us: no line to name
            newlines += chunk.count(b'\n')
            pos += len(chunk)
        return newlines + 1


def data_start(path: str) -> int:
    """Where the first line of a file starts: after a UTF-8 byte-order mark
    if there is one."""
    with open(path, 'rb') as file:
        return len(UTF8_BOM) if file.read(len(UTF8_BOM)) == UTF8_BOM else 0


def _read_header(file, path: str) -> Dict:
    raw = file.read(_HEADER_SIZE)
    if len(raw) < _HEADER_SIZE or not raw.startswith(_MAGIC):
        raise StaleIndexError(f'{path} is not a line index (bad header)')
    header = json.loads(raw[len(_MAGIC):].rstrip(b'\0'))
    version = header.get('version') if isinstance(header, dict) else None
    if version != INDEX_VERSION:
        raise StaleIndexError(f'{path}: index version {version}, need '
                              f'{INDEX_VERSION}')
    if not isinstance(header.get('num_samples'), int):
        raise StaleIndexError(f'{path} is not a line index (bad header)')
    expected = _HEADER_SIZE + 8 * (header['num_samples'] + 1)
    if os.fstat(file.fileno()).st_size != expected:
        raise StaleIndexError(f'{path} is truncated (expected {expected} '
                              'bytes)')
    return header


def index_problem(index_path: str, ann_file: str, fmt: str) -> Optional[str]:
    """Why ``index_path`` cannot serve ``ann_file`` now, or None if it can."""
    if not osp.exists(index_path):
        return 'missing'
    try:
        with open(index_path, 'rb') as file:
            header = _read_header(file, index_path)
    except (StaleIndexError, ValueError) as error:
        return str(error)
    # Judged by the file's identity, not the path recorded at build time: a
    # shared folder is mounted at other paths on other machines.
    if header['format'] != fmt:
        return f'it was built for format {header["format"]!r}, not {fmt!r}'
    if header.get('data_start', 0) != data_start(ann_file):
        return ('it was built before byte-order marks were skipped, and the '
                'file starts with one')
    changes = fingerprint_changes(header['fingerprint'],
                                  file_fingerprint(ann_file))
    return f'the annotation file changed ({changes})' if changes else None


@contextlib.contextmanager
def index_build_lock(index_path: str) -> Iterator[None]:
    """Exclusive lock for building ``index_path``, per node.

    Node-local (in the temp dir) so that it works whatever file system the
    index is on; across nodes, atomic renames keep concurrent builds safe.
    """
    lock_dir = osp.join(tempfile.gettempdir(),
                        f'mmdata_plugin_locks-{os.getuid()}')
    os.makedirs(lock_dir, exist_ok=True)
    key = hashlib.sha1(osp.abspath(index_path).encode()).hexdigest()
    with open(osp.join(lock_dir, key + '.lock'), 'a') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_line_index(ann_file: str,
                      index_path: str,
                      fmt: str,
                      on_stale: str = 'rebuild',
                      progress: bool = True) -> LineIndex:
    """Open the index of ``ann_file``, building it first if needed.

    Every process may call this at once: the first one on a node builds while
    the others wait, then all of them reuse the file.

    Args:
        ann_file (str): The annotation file.
        index_path (str): The index file.
        fmt (str): ``'lines'`` or ``'jsonl'``.
        on_stale (str): ``'rebuild'`` an index whose annotation file has
            changed, or ``'error'``: refuse it and stop.
        progress (bool): Show a progress bar while building.
    """
    if on_stale not in ('rebuild', 'error'):
        raise ValueError(
            f'on_stale_index must be "rebuild" or "error", got {on_stale!r}')
    if not osp.isfile(ann_file):
        raise FileNotFoundError(f'Annotation file not found: {ann_file}')
    with index_build_lock(index_path):
        problem = index_problem(index_path, ann_file, fmt)
        if problem is not None and problem != 'missing':
            if on_stale == 'error':
                raise _stale(index_path, ann_file, problem)
            print_log(
                f'Rebuilding {index_path}: {problem}.', logger='current')
        if problem is not None:
            # Only a build can have left one (listing a large folder at
            # every start would not be free).
            remove_abandoned_builds(index_path)
            build_line_index(ann_file, index_path, fmt, progress)
    return LineIndex(index_path, ann_file)


def build_tmp_path(index_path: str) -> str:
    """The file a build of ``index_path`` writes before its atomic rename.

    Named by its builder, so a build killed half way (kill -9, torchrun
    stopping the other ranks) is removed by the next one.
    """
    return _TMP_INFIX.join(
        (index_path, owner_file_name(current_owner(), 'index')))


def remove_abandoned_builds(index_path: str) -> None:
    """Delete the temp files of builds of ``index_path`` whose process is
    gone (an index of 1e9 lines is 8 GB)."""
    folder, stem = osp.split(osp.abspath(index_path))
    remove_files_of_dead_owners(folder, prefix=stem + _TMP_INFIX)


def build_line_index(ann_file: str,
                     index_path: str,
                     fmt: str,
                     progress: bool = True) -> Dict:
    """Scan ``ann_file`` and write its index atomically to ``index_path``.

    Returns:
        dict: The header written, plus ``seconds``.
    """
    start_time = time.perf_counter()
    fingerprint = file_fingerprint(ann_file)
    os.makedirs(osp.dirname(osp.abspath(index_path)), exist_ok=True)
    tmp_path = build_tmp_path(index_path)
    bar = ByteProgressBar(fingerprint['size'], f'indexing {ann_file}',
                       progress)
    try:
        with open(ann_file, 'rb') as src, open(tmp_path, 'wb') as out:
            out.write(b'\0' * _HEADER_SIZE)
            counts = _scan_into(src, out, ann_file, fmt, bar,
                                data_start(ann_file))
            if counts['num_samples'] == 0:
                raise AnnotationFormatError(
                    f'{ann_file}: the annotation file has no sample lines')
            out.write(np.array([fingerprint['size']], '<u8').tobytes())
            header = dict(
                version=INDEX_VERSION,
                ann_file=osp.realpath(ann_file),
                format=fmt,
                fingerprint=fingerprint,
                **counts)
            out.seek(0)
            out.write(_MAGIC + json.dumps(header).encode())
            out.flush()
            os.fsync(out.fileno())
        if file_fingerprint(ann_file) != fingerprint:
            raise StaleIndexError(
                f'{ann_file} changed while it was being indexed')
        os.replace(tmp_path, index_path)
    finally:
        if osp.exists(tmp_path):
            os.remove(tmp_path)
    seconds = time.perf_counter() - start_time
    bar.close()
    print_log(
        f'Indexed {ann_file}: {header["num_samples"]} samples, '
        f'{fingerprint["size"] / 1e6:.1f} MB in {seconds:.1f} s '
        f'({fingerprint["size"] / 1e6 / max(seconds, 1e-9):.0f} MB/s) '
        f'-> {index_path}',
        logger='current')
    return dict(header, seconds=seconds)


def _scan_into(src, out, ann_file: str, fmt: str, bar,
               first: int) -> Dict:
    """Write the sample offsets of ``src`` from byte ``first`` on to
    ``out``; return the counts."""
    buffer = bytearray(_CHUNK_SIZE)
    filled = 0  # bytes of buffer holding data; a partial line stays in front
    file_pos = first  # file offset of buffer[0]
    src.seek(first)
    num_lines = num_samples = 0
    header_span = None
    while True:
        with memoryview(buffer) as view:
            got = src.readinto(view[filled:])
        filled += got
        if filled == 0:
            break
        usable = filled if got == 0 else buffer.rfind(b'\n', 0, filled) + 1
        if usable == 0:  # a line longer than the buffer: grow the buffer
            buffer.extend(bytes(len(buffer)))
            continue
        chunk = np.frombuffer(buffer, np.uint8, usable)
        starts, lines = sample_line_starts(chunk, fmt, ann_file,
                                           num_lines + 1)
        if fmt == 'jsonl' and num_samples == 0 and header_span is None \
                and starts.size:
            header_span = _metainfo_line(chunk, int(starts[0]), file_pos)
            if header_span is not None:
                starts = starts[1:]
        del chunk
        out.write((starts + file_pos).astype('<u8').tobytes())
        num_lines += lines
        num_samples += int(starts.size)
        buffer[:filled - usable] = buffer[usable:filled]
        filled -= usable
        file_pos += usable
        bar.update(file_pos)
    return dict(
        num_samples=num_samples,
        num_lines=num_lines,
        header_span=header_span,
        data_start=first)


def _metainfo_line(chunk: np.ndarray, start: int,
                   file_pos: int) -> Optional[Tuple[int, int]]:
    """The span of a ``{"metainfo": ...}`` first line, if it is one."""
    newline = np.flatnonzero(chunk[start:] == ord('\n'))
    end = start + (int(newline[0]) if newline.size else chunk.size - start)
    try:
        record = json.loads(chunk[start:end].tobytes())
    except ValueError:
        return None  # an ordinary (maybe bad) record: reported when read
    if isinstance(record, dict) and list(record) == ['metainfo']:
        return (file_pos + start, file_pos + end)
    return None


class ByteProgressBar:
    """Bytes done, MB/s and ETA on stderr: live on a terminal, else every
    10 s (job logs).

    Args:
        total (int): Bytes to do.
        label (str): What is being done.
        enabled (bool): False shows nothing.
        unit (str): ``'bytes'`` (shown as MB/s) or what ``total`` counts
            (``'samples'``, shown as samples/s).
    """

    def __init__(self,
                 total: int,
                 label: str,
                 enabled: bool,
                 unit: str = 'bytes'):
        self.total = max(total, 1)
        self.unit = unit
        self.label = label
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.start = self.last = time.perf_counter()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if not self.enabled or now - self.last < (0.2 if self.tty else 10):
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        eta = (self.total - done) / max(rate, 1.0)
        width = 30
        filled = int(width * done / self.total)
        text = (f'{self.label}: [{"#" * filled}{"." * (width - filled)}] '
                f'{100 * done / self.total:5.1f}% {self._rate(rate)} '
                f'ETA {eta:.0f} s')
        sys.stderr.write(('\r' + text) if self.tty else (text + '\n'))
        sys.stderr.flush()

    def _rate(self, rate: float) -> str:
        if self.unit == 'bytes':
            return f'{rate / 1e6:.0f} MB/s'
        return f'{rate:.0f} {self.unit}/s'

    def close(self) -> None:
        if self.enabled and self.tty and self.last != self.start:
            sys.stderr.write('\n')
            sys.stderr.flush()
