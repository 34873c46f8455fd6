"""Per-rank shard files: a rank's share of an epoch, read in one pass.

On a slow shared file system, reading 1e8 random lines costs 1e8 random page
faults. Instead, before a rank iterates over its share of a (mini-)epoch, the
sampler (main process) writes the lines of that share to a local file, read
from the annotation file in few large sequential reads (lines in file order,
4 MiB windows, gaps skipped). DataLoader workers then read samples from that
file; the file's path travels with each index (``SampleIndex.shard``), so
persistent workers always use the right file.

Shard file layout: a 4 KiB header (magic + JSON ``{"count": n}``), then
three little-endian int64 arrays of ``n`` entries (sorted dataset indices,
start and end of each one's bytes in the data region), then the data region.
"""
import atexit
import json
import os
import os.path as osp
import socket
import time
from typing import Dict, List, Tuple

import numpy as np
from mmengine.logging import print_log

_MAGIC = b'MMDSHRD1'
_HEADER_SIZE = 4096
_WINDOW = 4 << 20
_PREFIX = 'mmdata-shard'


class ShardFileWriter:
    """Writes the shard files of one process and removes them again.

    Keeps the two newest files (workers may still be finishing the previous
    part while the next starts) and deletes the rest, also at exit. Files of
    dead processes of this host left in ``shard_dir`` by a crash are removed
    when the first shard is written.

    Args:
        shard_dir (str): A node-local directory.
        index (LineIndex): The index of the annotation file the lines come
            from; it also checks that each copied span is still a line.
    """

    def __init__(self, shard_dir: str, index):
        self.shard_dir = shard_dir
        self.index = index
        self.ann_file = index.ann_file
        self._written: List[str] = []
        self._serial = 0
        self._swept = False
        atexit.register(self.remove_all)

    def _name(self) -> str:
        self._serial += 1
        return osp.join(
            self.shard_dir, f'{_PREFIX}-{socket.gethostname()}-'
            f'{os.getpid()}-{id(self):x}-{self._serial}.bin')

    def write(self, keys: np.ndarray, line_ids: np.ndarray) -> str:
        """Write a shard for dataset indices ``keys``; return its path.

        Args:
            keys (np.ndarray): Sorted unique dataset indices.
            line_ids (np.ndarray): The sample line of each key.
        """
        start = time.perf_counter()
        os.makedirs(self.shard_dir, exist_ok=True)
        if not self._swept:
            _remove_orphans(self.shard_dir)
            self._swept = True
        # Lines are copied once each, in file order; keys point into them.
        if np.all(line_ids[1:] > line_ids[:-1]):  # no subset, or sorted
            lines, inverse = line_ids, slice(None)
        else:
            lines, inverse = np.unique(line_ids, return_inverse=True)
        starts, ends = self.index.spans(lines)
        data_at = np.zeros(lines.size + 1, np.int64)
        np.cumsum(ends - starts, out=data_at[1:])
        path = self._name()
        tmp_path = path + '.tmp'
        with open(tmp_path, 'wb') as out, open(self.ann_file, 'rb') as src:
            header = _MAGIC + json.dumps(dict(count=int(keys.size))).encode()
            out.write(header.ljust(_HEADER_SIZE, b'\0'))
            out.write(keys.astype('<i8').tobytes())
            for bounds in (data_at[:-1], data_at[1:]):
                out.write(bounds[inverse].astype('<i8', copy=False).tobytes())
            _copy_spans(src.fileno(), out, starts, ends, lines, self.index)
        os.replace(tmp_path, path)
        print_log(
            f'Shard file {path}: {keys.size} samples, '
            f'{(data_at[-1] + 3 * 8 * keys.size) / 1e6:.1f} MB, read from '
            f'{self.ann_file} in {time.perf_counter() - start:.2f} s',
            logger='current')
        self._written.append(path)
        while len(self._written) > 2:
            _remove(self._written.pop(0))
        return path

    def remove_all(self) -> None:
        while self._written:
            _remove(self._written.pop())


def _copy_spans(fd: int, out, starts: np.ndarray, ends: np.ndarray,
                lines: np.ndarray, index) -> None:
    """Append the byte ranges (sorted, disjoint) of ``fd`` to ``out``,
    after ``index`` checked that each is still a whole line."""
    if starts.size == 0:
        return
    window_of = (starts - starts[0]) // _WINDOW
    bounds = np.flatnonzero(np.diff(window_of)) + 1
    for first, last in zip(
            np.concatenate([[0], bounds]).tolist(),
            np.concatenate([bounds, [starts.size]]).tolist()):
        # From the byte before the first span: the check needs it.
        base = max(int(starts[first]) - 1, index.data_start)
        size = int(ends[last - 1]) - base
        raw = os.pread(fd, size, base)
        if len(raw) != size:
            index.raise_moved(int(lines[last - 1]))
        buf = np.frombuffer(raw, np.uint8)
        index.check_spans(buf, base, starts[first:last], ends[first:last],
                          lines[first:last])
        # +1 where a span starts, -1 where one ends (each offset occurs once
        # per array, so plain fancy assignment is enough): the running sum
        # is 1 inside the spans.
        inside = np.zeros(buf.size + 1, np.int8)
        inside[starts[first:last] - base] += 1
        inside[ends[first:last] - base] -= 1
        out.write(buf[np.cumsum(inside[:-1], dtype=np.int8) > 0].tobytes())


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _remove_orphans(shard_dir: str) -> None:
    """Delete shard files of processes of this host that no longer run."""
    prefix = f'{_PREFIX}-{socket.gethostname()}-'
    for name in os.listdir(shard_dir):
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split('-', 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _remove(osp.join(shard_dir, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ShardFileReader:
    """Random access to one shard file (in a DataLoader worker).

    Args:
        path (str): The shard file.
    """

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        header = os.pread(self._fd, _HEADER_SIZE, 0)
        if not header.startswith(_MAGIC):
            raise ValueError(f'{path} is not a shard file')
        count = json.loads(header[len(_MAGIC):].rstrip(b'\0'))['count']
        # A plain ndarray view: memmap's per-item overhead is ~1 us.
        arrays = np.asarray(
            np.memmap(
                path, '<i8', 'r', offset=_HEADER_SIZE, shape=(3, count)))
        self.keys, self.starts, self.ends = arrays
        self._data_at = _HEADER_SIZE + 3 * 8 * count

    def read(self, key: int) -> bytes:
        """The bytes of dataset index ``key``."""
        pos = int(np.searchsorted(self.keys, np.int64(key)))
        if pos == self.keys.size or int(self.keys[pos]) != key:
            raise KeyError(f'sample {key} is not in shard file {self.path}')
        start, end = int(self.starts[pos]), int(self.ends[pos])
        return os.pread(self._fd, end - start, self._data_at + start)

    def close(self) -> None:
        os.close(self._fd)


class ShardFileCache:
    """The readers a worker has open, newest last (at most ``size``)."""

    def __init__(self, size: int = 3):
        self.size = size
        self._readers: Dict[str, Tuple[int, ShardFileReader]] = {}

    def get(self, path: str) -> ShardFileReader:
        entry = self._readers.get(path)
        if entry is None or entry[0] != os.getpid():
            entry = (os.getpid(), ShardFileReader(path))
            self._readers[path] = entry
            while len(self._readers) > self.size:
                oldest = next(iter(self._readers))
                pid, reader = self._readers.pop(oldest)
                if pid == os.getpid():
                    reader.close()
        return entry[1]

    def __getstate__(self) -> dict:
        return dict(size=self.size, _readers={})
