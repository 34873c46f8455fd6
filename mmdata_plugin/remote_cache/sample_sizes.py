"""The byte sizes a node's prefetcher has learned, per sample id.

A node learns the size of every sample it downloads, so over a run the
table covers the whole data set: a dict of Python ints costs ~100 bytes a
sample (10 GB at 1e8 samples), a uint32 array indexed by sample id 4.
"""
from typing import Dict, Optional

import numpy as np

#: Sizes from this one up do not fit the array; they are kept apart.
_LARGE = np.iinfo(np.uint32).max


class SampleSizes:
    """Known sizes by sample id, 4 bytes a sample up to the highest id seen
    (ids are dense: a data set's indices). ``0`` bytes is a size (a sample
    that reads no file): the array holds ``size + 1``, 0 meaning unknown.
    """

    def __init__(self) -> None:
        self._plus_one = np.zeros(0, np.uint32)
        self._large: Dict[int, int] = {}

    def get(self, sample: int) -> Optional[int]:
        """The size of ``sample``; None when not learned."""
        if 0 <= sample < len(self._plus_one):
            stored = self._plus_one.item(sample)
            if stored == _LARGE:
                return self._large[sample]
            if stored:
                return stored - 1
        return None

    def __contains__(self, sample: int) -> bool:
        return self.get(sample) is not None

    def set(self, sample: int, size: int) -> bool:
        """Record ``size`` bytes for ``sample``; True if it was unknown."""
        if sample < 0 or size < 0:
            raise ValueError(f'sample {sample} of {size} bytes: ids and '
                             'sizes must be >= 0')
        if sample >= len(self._plus_one):
            self._grow(sample)
        new = not self._plus_one.item(sample)
        if size + 1 >= _LARGE:
            self._large[sample] = size
            self._plus_one[sample] = _LARGE
        else:
            self._large.pop(sample, None)
            self._plus_one[sample] = size + 1
        return new

    @property
    def nbytes(self) -> int:
        """Memory of the table (the array; the few large sizes aside)."""
        return self._plus_one.nbytes

    def _grow(self, sample: int) -> None:
        # Grown by an eighth at least, as the plan's kept set grows.
        length = max(sample + 1, len(self._plus_one) * 9 // 8)
        grown = np.zeros(length, np.uint32)
        grown[:len(self._plus_one)] = self._plus_one
        self._plus_one = grown
