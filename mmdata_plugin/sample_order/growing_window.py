"""The growing-then-sliding window of samples that each epoch trains on.

A dataset too big for local disk arrives from the remote in a seeded global
order (the *arrival order*); training starts on what is local and each epoch
trains on a window of that order::

    frontier f_e = initial + e * growth          (arrivals by epoch e)
    window   w_e = min(f_e, capacity)            (samples epoch e trains on)
    epoch e  = arrival positions [f_e - w_e, f_e)

The window grows by ``growth`` samples per epoch (what the remote delivers
while an epoch trains) until it holds ``capacity`` samples (what the cache
holds), then slides: the oldest ``growth`` samples leave as new ones enter.
Arrival position ``a`` is sample ``order(a mod N)``: once the whole dataset
has arrived, the order starts over and samples that left come back.

Everything is a function of (seed, epoch, position), evaluated with
:class:`IndexPermutation` (the arrival order is one permutation of
``range(N)``, each epoch's shuffle of the window another), so any process
can ask which samples an epoch needs -- or which enter and leave the cache
before it -- without running the stream.
"""
from typing import NamedTuple, Optional, Tuple

import numpy as np

from .index_permutation import IndexPermutation

# Key of the arrival order's permutation; epoch keys (>= 0) shuffle windows.
_ARRIVAL_ORDER = -1


class WindowChanges(NamedTuple):
    """Sample ids that enter and leave the window at an epoch start."""
    #: In the window of this epoch, not in the previous one (arrival order).
    entering: np.ndarray
    #: In the previous epoch's window, not in this one (oldest first).
    leaving: np.ndarray


class GrowingWindow:
    """Which samples each epoch trains on, in which (seeded) order.

    Args:
        size (int): Number of samples of the dataset (N).
        initial (int): Window size of epoch 0, in samples (clamped to
            ``capacity``).
        growth (int): Samples that arrive per epoch (>= 0).
        capacity (int, optional): Most samples the window holds (the local
            cache, in samples); clamped to N. None: N (the window grows
            until it covers the dataset).
        seed (int): Seed of the arrival order and of the epoch shuffles.
        shuffle (bool): Shuffle the arrival order and each epoch's window
            (False: arrival order 0..N-1, windows in arrival order).
        rounds (int): Feistel rounds of the permutations.
    """

    def __init__(self,
                 size: int,
                 initial: int,
                 growth: int,
                 capacity: Optional[int] = None,
                 seed: int = 0,
                 shuffle: bool = True,
                 rounds: int = 6) -> None:
        for name, value, low in (('size', size, 1), ('initial', initial, 1),
                                 ('growth', growth, 0)):
            if isinstance(value, bool) or not isinstance(
                    value, (int, np.integer)) or value < low:
                raise ValueError(
                    f'{name} must be an int >= {low}, got {value!r}')
        if capacity is not None and (isinstance(capacity, bool)
                                     or not isinstance(
                                         capacity, (int, np.integer))
                                     or capacity < 1):
            raise ValueError(
                f'capacity must be an int >= 1 (samples), got {capacity!r}')
        self.size = int(size)
        self.capacity = min(self.size if capacity is None else int(capacity),
                            self.size)
        self.initial = min(int(initial), self.capacity)
        self.growth = int(growth)
        self.seed = seed
        self.shuffle = shuffle
        self.rounds = rounds
        self._arrival = (
            IndexPermutation(self.size, seed, _ARRIVAL_ORDER, rounds)
            if shuffle else None)
        self._shuffles = {}

    # The window's arithmetic.

    def frontier(self, epoch: int) -> int:
        """Arrival positions delivered by the start of ``epoch``."""
        if epoch < 0:
            raise ValueError(f'epoch must be >= 0, got {epoch}')
        return self.initial + epoch * self.growth

    def window_size(self, epoch: int) -> int:
        """Samples epoch ``epoch`` trains on (before rank padding)."""
        return min(self.frontier(epoch), self.capacity)

    def bounds(self, epoch: int) -> Tuple[int, int]:
        """``[start, stop)``: the arrival positions of ``epoch``'s window."""
        stop = self.frontier(epoch)
        return stop - self.window_size(epoch), stop

    # Sample ids.

    def arrival_ids(self, arrivals: np.ndarray) -> np.ndarray:
        """Sample ids at arrival positions ``arrivals`` (any int >= 0)."""
        residues = np.asarray(arrivals, np.int64) % self.size
        if self._arrival is None:
            return residues
        return self._arrival(residues)

    def ids(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Ids at ``positions`` (in ``[0, window_size(epoch))``) of epoch
        ``epoch``'s stream: its window, shuffled with the epoch's key."""
        start, stop = self.bounds(epoch)
        positions = np.asarray(positions, np.int64)
        if positions.size and (positions.min() < 0
                               or positions.max() >= stop - start):
            raise IndexError(
                f'epoch {epoch} trains on {stop - start} samples; positions '
                f'must lie in [0, {stop - start})')
        if self.shuffle:
            positions = self._shuffle(epoch, stop - start)(positions)
        return self.arrival_ids(start + positions)

    def positions_of(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """Positions of sample ``ids`` in epoch ``epoch``'s stream (the
        inverse of :meth:`ids`); ``window_size(epoch)`` for ids outside
        its window. A window holds at most ``N`` arrivals, so a sample
        at most once."""
        start, stop = self.bounds(epoch)
        ids = np.asarray(ids, np.int64)
        residues = ids if self._arrival is None else self._arrival.inverse(
            ids)
        # The sample's first arrival position from the window's start on.
        offsets = (residues - start) % self.size
        inside = offsets < stop - start
        if self.shuffle:
            offsets[inside] = self._shuffle(epoch, stop - start).inverse(
                offsets[inside])
        return np.where(inside, offsets, stop - start)

    def window_ids(self, epoch: int) -> np.ndarray:
        """Every id of ``epoch``'s window, in arrival order (oldest first)."""
        return self.arrival_ids(np.arange(*self.bounds(epoch)))

    def changes(self, epoch: int) -> WindowChanges:
        """What a cache must fetch and may evict before ``epoch`` starts.

        The samples entering epoch ``epoch``'s window are known at any time
        (they are a function of the seed), so a prefetcher fetches them while
        epoch ``epoch - 1`` trains, and evicts the leaving ones once that
        epoch is done: training never waits on the remote as long as
        ``growth`` samples arrive per epoch. Epoch 0: the whole window
        enters.
        """
        start, stop = self.bounds(epoch)
        if epoch == 0:
            return WindowChanges(self.window_ids(0), np.empty(0, np.int64))
        old_start, old_stop = self.bounds(epoch - 1)
        entering = self.arrival_ids(np.arange(max(old_stop, start), stop))
        leaving = self.arrival_ids(np.arange(old_start, min(start,
                                                            old_stop)))
        # After a full cycle a leaving sample can re-enter at once (window
        # of the whole dataset): it then neither leaves nor enters.
        both = np.intersect1d(entering, leaving)
        if both.size:
            entering = entering[~np.isin(entering, both)]
            leaving = leaving[~np.isin(leaving, both)]
        return WindowChanges(entering, leaving)

    # What the model sees.

    def exposures(self,
                  epochs: int,
                  arrivals: Optional[np.ndarray] = None) -> np.ndarray:
        """How often samples are trained on in epochs ``0..epochs-1``.

        Arrival position ``a`` is in the windows of epochs
        ``e_in(a) .. e_out(a)``::

            e_in(a)  = 0 if a < initial else (a - initial) // growth + 1
            e_out(a) = (a + capacity - initial) // growth

        Args:
            epochs (int): Epochs trained.
            arrivals (np.ndarray, optional): Arrival positions to count,
                each on its own (O(len) memory, for large datasets).

        Returns:
            np.ndarray: Counts (one rank, no padding): per given arrival
            position, or by default ``counts[r]`` for the r-th sample of
            the arrival order (``arrival_ids(r)`` is its id), summed over
            the times the order comes round (O(N) memory).
        """
        last = epochs - 1
        if arrivals is not None:
            return self._epochs_in_window(
                np.asarray(arrivals, np.int64), last)
        counts = np.zeros(self.size, np.int64)
        for cycle_start in range(0, max(self.frontier(max(last, 0)), 1),
                                 self.size):
            cycle = cycle_start + np.arange(self.size, dtype=np.int64)
            counts += self._epochs_in_window(cycle, last)
        return counts

    def _epochs_in_window(self, arrivals: np.ndarray,
                          last: int) -> np.ndarray:
        if last < 0:
            return np.zeros(arrivals.shape, np.int64)
        if self.growth == 0:
            inside = arrivals < self.initial
            return np.where(inside, last + 1, 0)
        first_in = np.where(arrivals < self.initial, 0,
                            (arrivals - self.initial) // self.growth + 1)
        last_in = np.minimum(
            (arrivals + self.capacity - self.initial) // self.growth, last)
        return np.maximum(last_in - first_in + 1, 0)

    def _shuffle(self, epoch: int, length: int) -> IndexPermutation:
        permutation = self._shuffles.get(epoch)
        if permutation is None:
            # Two epochs can be live at an epoch boundary; keep just those.
            self._shuffles = {
                e: p
                for e, p in self._shuffles.items() if e == epoch - 1
            }
            permutation = IndexPermutation(length, self.seed, epoch,
                                           self.rounds)
            self._shuffles[epoch] = permutation
        return permutation
