"""Rows of numpy columns keyed by sample id, for a few of a data set's ids.

The node's planner and books hold state for the samples kept, in flight
or in the look-ahead: a few millions of ids out of billions. Arrays
indexed by sample id cost bytes for every id of the data set, and a dict
of Python ints ~100 bytes an entry. :class:`IdTable` stores its rows
densely (row ``r`` in ``keys[r]`` and each column's ``[r]``) and finds a
key's row in an open-addressing index of int32 rows (linear probing, at
most three quarters full), so a row costs its columns, its key (4 bytes
for ids below 2**32, else 8) and 5-11 bytes of index, whatever the ids.
"""
from typing import Dict

import numpy as np

#: Index entry of no row.
_EMPTY = -1
#: Fibonacci hashing: sequential ids spread over the whole index.
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
#: Fewest index entries and rows (the table of an empty plan).
_MIN_BITS = 10
#: Most rows an index of ``size`` entries holds, as ``(rows, size)``: at
#: three quarters full a probe looks at ~2.5 entries (8.5 for a missing
#: key), and the index costs 5-11 bytes a row once doubled.
_FULL = (3, 4)


class IdTable:
    """Rows keyed by distinct int64 ids (sample ids).

    Rows are ``0 .. len(table) - 1``; removing a key moves the last row
    into its place, so a row number holds only until the next removal,
    and an insert may replace the columns' arrays (take a column after
    it). Columns of a new row hold stale values until they are set.

    Args:
        columns (dict): Name and numpy dtype of each column.
        keys (type): The dtype keys are stored in while they fit it
            (``np.uint32`` for sample ids), int64 from the first that
            does not.
    """

    def __init__(self,
                 columns: Dict[str, type],
                 keys: type = np.int64) -> None:
        self.keys = np.empty(1 << _MIN_BITS, keys)
        self._key_range = (int(np.iinfo(keys).min), int(np.iinfo(keys).max))
        self.columns = {
            name: np.zeros(1 << _MIN_BITS, dtype)
            for name, dtype in columns.items()
        }
        # Each column's largest value, asked per value (np.iinfo is not).
        self._most = {
            name: int(np.iinfo(dtype).max)
            for name, dtype in columns.items()
        }
        self._count = 0
        self._index = np.full(2 << _MIN_BITS, _EMPTY, np.int32)
        self._shift = 64 - (_MIN_BITS + 1)

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: int) -> bool:
        return self.row(key) >= 0

    @property
    def nbytes(self) -> int:
        """Bytes of the index, the keys and the columns."""
        return self._index.nbytes + self.keys.nbytes + sum(
            column.nbytes for column in self.columns.values())

    def row_keys(self) -> np.ndarray:
        """The rows' keys, int64."""
        return self.keys[:self._count].astype(np.int64, copy=False)

    def _fit_keys(self, least: int, most: int) -> None:
        if least < self._key_range[0] or most > self._key_range[1]:
            self.keys = self.keys.astype(np.int64)
            self._key_range = (-(1 << 63), (1 << 63) - 1)

    def column(self, name: str) -> np.ndarray:
        """The rows' values of column ``name`` (a view)."""
        return self.columns[name][:self._count]

    def fit(self, name: str, most: int) -> None:
        """Store column ``name`` as int64 from now on if ``most`` exceeds
        its type (values kept): columns start narrow for the common
        values (sizes below 4 GiB, ids below 2**32)."""
        if most > self._most[name]:
            self.columns[name] = self.columns[name].astype(np.int64)
            self._most[name] = int(np.iinfo(np.int64).max)

    # -- one key --------------------------------------------------------------

    def _home(self, key: int) -> int:
        return ((key * _GOLDEN) & _MASK64) >> self._shift

    def _spot(self, key: int) -> int:
        """The index entry of ``key``, or the empty entry ending its probe."""
        index, keys = self._index, self.keys
        mask = len(index) - 1
        spot = self._home(key)
        while True:
            row = index.item(spot)
            if row == _EMPTY or keys.item(row) == key:
                return spot
            spot = (spot + 1) & mask

    def row(self, key: int) -> int:
        """The row of ``key``, or -1 when it has none."""
        return self._index.item(self._spot(key))

    def insert(self, key: int, **values) -> int:
        """A new row for ``key`` (which has none), its columns set from
        ``values`` (by name); its row number."""
        if self._too_full(self._count + 1, len(self._index)):
            self._reindex(2 * len(self._index))
        if self._count == len(self.keys):
            self._grow_rows(self._count + 1)
        self._fit_keys(key, key)
        row = self._count
        self.keys[row] = key
        self._index[self._spot(key)] = row
        self._count += 1
        for name, value in values.items():
            self.columns[name][row] = value
        return row

    def remove(self, key: int) -> None:
        """Drop the row of ``key`` (which has one); the last row takes its
        place."""
        spot = self._spot(key)
        row = self._index.item(spot)
        self._close(spot)
        last = self._count - 1
        if row != last:
            moved = self.keys.item(last)
            self._index[self._spot(moved)] = row
            self.keys[row] = moved
            for column in self.columns.values():
                column[row] = column[last]
        self._count = last

    def _close(self, hole: int) -> None:
        """Empty index entry ``hole``, moving back the entries after it
        whose probe passed it (backward-shift deletion: no tombstones)."""
        index, keys = self._index, self.keys
        mask = len(index) - 1
        spot = (hole + 1) & mask
        while True:
            row = index.item(spot)
            if row == _EMPTY:
                break
            home = self._home(keys.item(row))
            # Movable when its home is not after the hole on its probe.
            if (spot - home) & mask >= (spot - hole) & mask:
                index[hole] = row
                hole = spot
            spot = (spot + 1) & mask
        index[hole] = _EMPTY

    # -- many keys ------------------------------------------------------------

    def _homes(self, keys: np.ndarray) -> np.ndarray:
        with np.errstate(over='ignore'):
            hashed = keys.astype(np.uint64) * np.uint64(_GOLDEN)
        return (hashed >> np.uint64(self._shift)).astype(np.int64)

    def rows(self, keys: np.ndarray) -> np.ndarray:
        """:meth:`row` of each of ``keys``."""
        keys = np.asarray(keys, np.int64)
        found = np.full(len(keys), _EMPTY, np.int64)
        mask = len(self._index) - 1
        pending = np.arange(len(keys))
        spots = self._homes(keys)
        while len(pending):
            rows = self._index[spots]
            hit = (rows != _EMPTY) & (self.keys[rows] == keys[pending])
            found[pending[hit]] = rows[hit]
            going = (rows != _EMPTY) & ~hit
            pending, spots = pending[going], (spots[going] + 1) & mask
        return found

    def insert_many(self, keys: np.ndarray, **values) -> np.ndarray:
        """:meth:`insert` of each of ``keys`` (distinct, none with a row),
        columns set from ``values`` (arrays or scalars); their rows."""
        keys = np.asarray(keys, np.int64)
        count = self._count + len(keys)
        if self._too_full(count, len(self._index)):
            size = len(self._index)
            while self._too_full(count, size):
                size *= 2
            self._reindex(size)
        if count > len(self.keys):
            self._grow_rows(count)
        if len(keys):
            self._fit_keys(int(keys.min()), int(keys.max()))
        rows = np.arange(self._count, count)
        self.keys[rows] = keys
        self._count = count
        self._place(rows)
        for name, value in values.items():
            self.columns[name][rows] = value
        return rows

    def _place(self, rows: np.ndarray) -> None:
        """Enter ``rows`` in the index: each round, the first of the rows
        probing a free entry takes it, the others probe on (every entry a
        row passed is taken, as one by one)."""
        index, mask = self._index, len(self._index) - 1
        spots = self._homes(self.keys[rows])
        while len(rows):
            free = np.flatnonzero(index[spots] == _EMPTY)
            taken, first = np.unique(spots[free], return_index=True)
            index[taken] = rows[free[first]]
            placed = np.zeros(len(rows), bool)
            placed[free[first]] = True
            rows, spots = rows[~placed], (spots[~placed] + 1) & mask

    @staticmethod
    def _too_full(rows: int, size: int) -> bool:
        return rows * _FULL[1] > size * _FULL[0]

    def _reindex(self, size: int) -> None:
        self._index = np.full(size, _EMPTY, np.int32)
        self._shift = 64 - (size.bit_length() - 1)
        self._place(np.arange(self._count))

    def _grow_rows(self, count: int) -> None:
        # By an eighth: a row costs its bytes (and 6% more on average),
        # not twice them; copies stay O(1) a row.
        length = max(count, len(self.keys) + len(self.keys) // 8)
        self.keys = self._grown(self.keys, length)
        for name, column in self.columns.items():
            self.columns[name] = self._grown(column, length)

    @staticmethod
    def _grown(array: np.ndarray, length: int) -> np.ndarray:
        # (np.resize would return a view of a copy up to twice as long)
        grown = np.empty(length, array.dtype)
        grown[:len(array)] = array
        return grown
