"""The samples on a node prefetcher's books, with what it learned of them.

A sample is on the books while the plan keeps it or a decided read of it
is ahead: a few millions of a data set's ids. Each is a row of an
:class:`~.id_table.IdTable` keyed by its id: how many files it booked and
its size once downloaded, 10 bytes and 5-11 of index (an array by sample
id cost 4 bytes for every id of the data set, a dict of Python ints ~100
a sample). A size is forgotten when its sample leaves the books: the plan
counts it at the mean until it is downloaded again.
"""
from typing import Optional

import numpy as np

from .id_table import IdTable


class BookedSamples:
    """Booked samples: the files each booked and its size when learned.
    ``0`` bytes is a size (a sample that reads no file): a row holds
    ``size + 1``, 0 meaning unknown (a uint32, int64 from the first size
    of 4 GiB or more).
    """

    def __init__(self) -> None:
        self._rows = IdTable(dict(plus_one=np.uint32, files=np.uint16),
                             keys=np.uint32)

    def __contains__(self, sample: int) -> bool:
        return sample in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def nbytes(self) -> int:
        """Memory of the rows."""
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

    def files(self, sample: int) -> Optional[int]:
        """How many files ``sample`` booked; None when not booked."""
        row = self._rows.row(sample)
        return None if row < 0 else self._rows.columns['files'].item(row)

    def size(self, sample: int) -> Optional[int]:
        """The size of ``sample``; None when not learned (or not booked)."""
        row = self._rows.row(sample)
        stored = 0 if row < 0 else self._rows.columns['plus_one'].item(row)
        return stored - 1 if stored else None

    def learn_many(self, samples: np.ndarray, sizes: np.ndarray) -> None:
        """:meth:`learn` of each ``(sample, size)`` pair."""
        samples = np.asarray(samples, np.int64)
        sizes = np.asarray(sizes, np.int64)
        rows = self._rows.rows(samples)
        booked = (rows >= 0) & (sizes >= 0)
        if booked.any():
            self._rows.fit('plus_one', int(sizes[booked].max()) + 1)
        self._rows.columns['plus_one'][rows[booked]] = sizes[booked] + 1
        for index in np.flatnonzero(sizes < 0).tolist():
            _check_size(samples.item(index), sizes.item(index))

    def learn(self, sample: int, size: int) -> bool:
        """Record ``size`` bytes for ``sample``; False (nothing recorded)
        when it is not on the books."""
        _check_size(sample, size)
        row = self._rows.row(sample)
        if row < 0:
            return False
        self._rows.fit('plus_one', size + 1)
        self._rows.columns['plus_one'][row] = size + 1
        return True


def _check_size(sample: int, size: int) -> None:
    if size < 0:
        raise ValueError(f'sample {sample} of {size} bytes: sizes must '
                         'be >= 0')
