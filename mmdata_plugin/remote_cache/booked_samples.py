"""The samples on a node prefetcher's books, with what it learned of them.

A sample is on the books while the plan keeps it or a decided read of it
is ahead: a few millions of a data set's ids. Each is a row of an
:class:`~.id_table.IdTable` keyed by its id: how many files it booked and
its size once downloaded, 10 bytes and 5-11 of index (an array by sample
id cost 4 bytes for every id of the data set, a dict of Python ints ~100
a sample). A size is forgotten when its sample leaves the books: the plan
counts it at the mean until it is downloaded again.
"""
from typing import Dict, Optional

import numpy as np

from .id_table import IdTable

#: Sizes from this one up do not fit a row; they are kept apart.
_LARGE = np.iinfo(np.uint32).max


class BookedSamples:
    """Booked samples: the files each booked and its size when learned.
    ``0`` bytes is a size (a sample that reads no file): a row holds
    ``size + 1``, 0 meaning unknown.
    """

    def __init__(self) -> None:
        self._rows = IdTable(dict(plus_one=np.uint32, files=np.uint16),
                             keys=np.uint32)
        self._large: Dict[int, int] = {}

    def __contains__(self, sample: int) -> bool:
        return sample in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def nbytes(self) -> int:
        """Memory of the rows (the few large sizes aside)."""
        return self._rows.nbytes

    def add(self, sample: int, files: int) -> None:
        """Book ``sample`` (not booked) reading ``files`` files."""
        self._rows.insert(sample, plus_one=0, files=files)

    def add_many(self, samples: np.ndarray, files: np.ndarray) -> None:
        """:meth:`add` of many samples (distinct, none booked)."""
        self._rows.insert_many(samples, plus_one=0, files=files)

    def remove(self, sample: int) -> None:
        """Take ``sample`` (booked) off the books, with its size."""
        self._rows.remove(sample)
        self._large.pop(sample, None)

    def files(self, sample: int) -> Optional[int]:
        """How many files ``sample`` booked; None when not booked."""
        row = self._rows.row(sample)
        return None if row < 0 else self._rows.columns['files'].item(row)

    def size(self, sample: int) -> Optional[int]:
        """The size of ``sample``; None when not learned (or not booked)."""
        row = self._rows.row(sample)
        stored = 0 if row < 0 else self._rows.columns['plus_one'].item(row)
        if stored == _LARGE:
            return self._large[sample]
        return stored - 1 if stored else None

    def learn_many(self, samples: np.ndarray, sizes: np.ndarray) -> None:
        """:meth:`learn` of each ``(sample, size)`` pair."""
        samples = np.asarray(samples, np.int64)
        sizes = np.asarray(sizes, np.int64)
        rows = self._rows.rows(samples)
        fits = (rows >= 0) & (sizes >= 0) & (sizes + 1 < _LARGE)
        self._rows.columns['plus_one'][rows[fits]] = sizes[fits] + 1
        for index in np.flatnonzero(~fits).tolist():
            self.learn(samples.item(index), sizes.item(index))

    def learn(self, sample: int, size: int) -> bool:
        """Record ``size`` bytes for ``sample``; False (nothing recorded)
        when it is not on the books."""
        if size < 0:
            raise ValueError(f'sample {sample} of {size} bytes: sizes must '
                             'be >= 0')
        row = self._rows.row(sample)
        if row < 0:
            return False
        if size + 1 >= _LARGE:
            self._large[sample] = size
            self._rows.columns['plus_one'][row] = _LARGE
        else:
            self._large.pop(sample, None)
            self._rows.columns['plus_one'][row] = size + 1
        return True
