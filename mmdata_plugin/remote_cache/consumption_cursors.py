"""Where each rank of a node stands in the sample stream, shared by files.

Each rank's training process writes its position -- epoch and global
samples consumed, as counted by the train loop -- into a small memory-mapped
file after every iteration (one store into a page: no system call, no
lock). The node's prefetcher reads the files of its ranks. A run token tags
the values, so a file left by an earlier run (another world size, a killed
job) is never taken for the current position.
"""
import os
from typing import List, NamedTuple, Optional

import numpy as np

# token, epoch, consumed, sequence. The sequence is a seqlock: odd while a
# record is being written, even once it is whole, so a reader that sees the
# same even sequence before and after reading has a consistent record (a
# torn one, e.g. the new epoch with the old count, would put the planner a
# whole epoch ahead).
_FIELDS = 4
# Reads of a record being rewritten before the last whole one is used.
_READ_TRIES = 100


class Cursor(NamedTuple):
    epoch: int
    consumed: int


def cursor_dir(cache_dir: str) -> str:
    return os.path.join(cache_dir, 'planner', 'cursors')


class CursorWriter:
    """The position of one rank, published for the node's prefetcher.

    Args:
        cache_dir (str): The node cache directory.
        rank (int): Global rank of the writing process.
        token (int): Run token (identical on all ranks of a run).
    """

    def __init__(self, cache_dir: str, rank: int, token: int) -> None:
        directory = cursor_dir(cache_dir)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f'rank{rank}.cursor')
        temp = f'{path}.{os.getpid()}.tmp'
        np.zeros(_FIELDS, np.int64).tofile(temp)
        os.replace(temp, path)
        self._values = np.memmap(path, np.int64, 'r+', shape=(_FIELDS, ))
        self._token = token

    def publish(self, epoch: int, consumed: int) -> None:
        values = self._values
        values[3] += 1
        values[0] = self._token
        values[1] = epoch
        values[2] = consumed
        values[3] += 1

    def close(self) -> None:
        self._values._mmap.close()


class CursorReader:
    """Reads the positions of a node's ranks.

    Args:
        cache_dir (str): The node cache directory.
        ranks (list[int]): Global ranks of the node.
        token (int): Run token of the current run.
    """

    def __init__(self, cache_dir: str, ranks: List[int], token: int) -> None:
        self._paths = [
            os.path.join(cursor_dir(cache_dir), f'rank{rank}.cursor')
            for rank in ranks
        ]
        self._token = token
        self._maps: List[Optional[np.memmap]] = [None] * len(ranks)
        self._last: List[Optional[Cursor]] = [None] * len(ranks)

    def _read(self, slot: int) -> Optional[Cursor]:
        values = self._maps[slot]
        if values is None:
            try:
                values = np.memmap(self._paths[slot], np.int64, 'r',
                                   shape=(_FIELDS, ))
            except (FileNotFoundError, ValueError):
                return None
            self._maps[slot] = values
        for _ in range(_READ_TRIES):
            sequence = int(values[3])
            record = values[:3].tolist()
            if sequence % 2 == 0 and sequence == int(values[3]):
                break
        else:
            # Rewritten all along, or left half written by a killed run
            # (a new writer replaces the file: map it again next time): the
            # last whole record.
            self._maps[slot] = None
            return self._last[slot]
        if record[0] != self._token or sequence == 0:
            # Not written by this run yet; a writer re-creates the file
            # when it starts, so map it again next time.
            self._maps[slot] = None
            return None
        self._last[slot] = Cursor(record[1], record[2])
        return self._last[slot]

    def read(self) -> Optional[List[Cursor]]:
        """Every rank's position, or None until all ranks published one."""
        cursors = [self._read(slot) for slot in range(len(self._paths))]
        if any(cursor is None for cursor in cursors):
            return None
        return cursors
