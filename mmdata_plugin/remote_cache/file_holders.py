"""Which booked samples read each cached file, by the file's digest.

Samples may share a file (one per person of a picture, a repeated data
set): a file stays while any sample booking it needs it. Nearly every
file has one reader: a file is a row of an :class:`~.id_table.IdTable`
keyed by its digest as an 8-byte int (see :func:`digest_key`) holding its
reader (4 bytes while sample ids are below 2**32), ~19 bytes a file with
the index; a set of readers is kept aside only from the second (a set of
one costs ~200 bytes, a hex digest string ~90).
"""
from typing import Dict, Optional, Set

import numpy as np

from .id_table import IdTable

#: The reader of a file read by several samples (see ``_several``); a
#: row holds its reader + 1, so this is 0.
_SEVERAL = -1


def digest_key(digest: str) -> int:
    """The first 64 bits of a hex digest, as an int64: files on the books
    of a node are told apart by them (two of 1e7 files share theirs with
    chance ~3e-6)."""
    return int(digest[:16], 16) - (1 << 63)


class FileHolders:
    """The samples booking each file, by :func:`digest_key`."""

    def __init__(self) -> None:
        self._files = IdTable(dict(holder=np.uint32))
        self._several: Dict[int, Set[int]] = {}

    def __contains__(self, key: int) -> bool:
        return key in self._files

    def __len__(self) -> int:
        return len(self._files)

    @property
    def nbytes(self) -> int:
        """Memory of the rows (the few shared files' sets aside)."""
        return self._files.nbytes

    def _holder(self, key: int) -> Optional[int]:
        """The one reader of ``key``, ``_SEVERAL``, or None if none."""
        row = self._files.row(key)
        if row < 0:
            return None
        return self._files.columns['holder'].item(row) - 1

    def _set_holder(self, key: int, held: int) -> None:
        self._files.fit('holder', held + 1)
        self._files.columns['holder'][self._files.row(key)] = held + 1

    def add(self, key: int, sample: int) -> int:
        """Book ``sample`` as a reader of file ``key``; its readers now."""
        held = self._holder(key)
        if held is None:
            self._files.fit('holder', sample + 1)
            self._files.insert(key, holder=sample + 1)
            return 1
        if held == sample:
            return 1
        if held != _SEVERAL:
            self._several[key] = {held}
            self._set_holder(key, _SEVERAL)
        readers = self._several[key]
        readers.add(sample)
        return len(readers)

    def add_many(self, keys: np.ndarray, samples: np.ndarray) -> np.ndarray:
        """:meth:`add` of each ``(key, sample)`` pair (many files at once:
        a warm start's files on disk); whether each file has more than
        one reader now."""
        keys = np.asarray(keys, np.int64)
        samples = np.asarray(samples, np.int64)
        _, first, repeats = np.unique(keys, return_index=True,
                                      return_counts=True)
        alone = np.zeros(len(keys), bool)
        alone[first[repeats == 1]] = True
        alone &= self._files.rows(keys) < 0
        if alone.any():
            self._files.fit('holder', int(samples[alone].max()) + 1)
        self._files.insert_many(keys[alone], holder=samples[alone] + 1)
        shared = np.zeros(len(keys), bool)
        for index in np.flatnonzero(~alone).tolist():
            shared[index] = self.add(keys.item(index),
                                     samples.item(index)) > 1
        return shared

    def remove(self, key: int, sample: int) -> bool:
        """Take ``sample`` off file ``key``'s readers; True when none is
        left (the file is off the books)."""
        held = self._holder(key)
        if held is None:
            return True
        if held != _SEVERAL:
            if held != sample:
                return False
            self._files.remove(key)
            return True
        readers = self._several[key]
        readers.discard(sample)
        if len(readers) == 1:
            del self._several[key]
            self._set_holder(key, readers.pop())
        return False

    def of(self, key: int) -> Set[int]:
        """The samples booking file ``key`` (empty if none)."""
        held = self._holder(key)
        if held is None:
            return set()
        return set(self._several[key]) if held == _SEVERAL else {held}

    def holds(self, key: int, sample: int) -> bool:
        """Whether ``sample`` books file ``key``."""
        held = self._holder(key)
        return held == sample or (held == _SEVERAL
                                  and sample in self._several[key])

    def count(self, key: int) -> int:
        held = self._holder(key)
        if held is None:
            return 0
        return len(self._several[key]) if held == _SEVERAL else 1
