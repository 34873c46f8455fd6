"""One node's share of the global sample stream, as a flat sequence.

Ranks take interleaved global positions (rank ``r`` of ``W`` reads
``r, r + W, ...`` of each epoch), and a node runs the ``L`` consecutive
ranks ``r0 .. r0 + L - 1``. The node's *ticks* number its positions in
reading order across epochs::

    tick K = S_e + k,   position(k) = (k // L) * W + r0 + k % L

with ``S_e`` the node's ticks in the epochs before ``e`` and ``k < E_e``
(``E_e``: the node's positions in epoch ``e``, from the epoch's global
length ``order.epoch_length(e)``; all equal for most samplers, growing for
a growing window). Everything the node reads at tick ``K`` is
``order.ids(epoch, position(k))``: the sampler's own order math
(:mod:`.global_order`), nothing recomputed here. Where the order has an
inverse (:meth:`~.global_order.SampleOrder.places`), the node's next read
of a sample is exact at any distance (:meth:`NodeStream.next_reads`).
"""
import bisect
from typing import List, Optional, Tuple

import numpy as np

from .global_order import SampleOrder

#: Epochs in a row in which a node reads nothing, before a tick past them
#: is taken for one that never comes.
_MOST_EMPTY_EPOCHS = 1 << 16

#: :meth:`NodeStream.next_reads`: the sample is not read before ``until``.
NOT_BEFORE = -1
#: :meth:`NodeStream.next_reads`: not read within the cycles searched.
NOT_SEARCHED = -2


class NodeStream:
    """Sample ids a node reads, by tick.

    Args:
        order (SampleOrder): The global order.
        world_size (int): Ranks in the job.
        first_rank (int): Lowest global rank on this node.
        local_ranks (int): Ranks on this node (consecutive from
            ``first_rank``, as torchrun and slurm assign them).

    Attributes:
        endless (bool): One endless stream (epoch 0).
        epoch_ticks (int | None): The node's ticks per epoch when every
            epoch has as many; None for an endless stream or epochs of
            different lengths (:meth:`epoch_ticks_of`).
    """

    def __init__(self, order: SampleOrder, world_size: int, first_rank: int,
                 local_ranks: int) -> None:
        if not 0 <= first_rank < first_rank + local_ranks <= world_size:
            raise ValueError(
                f'ranks {first_rank}..{first_rank + local_ranks - 1} are not '
                f'a node of a world of {world_size}')
        self.order = order
        self.world_size = world_size
        self.first_rank = first_rank
        self.local_ranks = local_ranks
        self.endless = bool(order.endless)
        self.epoch_ticks: Optional[int] = None
        if not self.endless and order.epoch_size is not None:
            self.epoch_ticks = self._node_ticks(order.epoch_size)
        # _starts[e]: the node's first tick of epoch e (extended lazily).
        self._starts: List[int] = [0]

    def _node_ticks(self, length: int) -> int:
        """The node's positions among ``length`` global ones."""
        return sum(
            max(0, -(-(length - rank) // self.world_size))
            for rank in range(self.first_rank,
                              self.first_rank + self.local_ranks))

    def epoch_ticks_of(self, epoch: int) -> int:
        """The node's ticks in ``epoch``."""
        if self.endless:
            raise ValueError('an endless stream has no epochs')
        if self.epoch_ticks is not None:
            return self.epoch_ticks
        return self._node_ticks(self.order.epoch_length(epoch))

    def epoch_start(self, epoch: int) -> int:
        """The node's first tick of ``epoch`` (ticks of the epochs before)."""
        if self.endless:
            return 0
        if self.epoch_ticks is not None:
            return epoch * self.epoch_ticks
        while len(self._starts) <= epoch:
            self._starts.append(self._starts[-1] +
                                self.epoch_ticks_of(len(self._starts) - 1))
        return self._starts[epoch]

    def epoch_of(self, tick: int) -> Tuple[int, int]:
        """``(epoch, tick within it)`` of the node's ``tick``."""
        if self.endless:
            return 0, tick
        if self.epoch_ticks is not None:
            if self.epoch_ticks == 0:
                raise ValueError('this node reads no sample in an epoch')
            return divmod(tick, self.epoch_ticks)
        empty = 0
        while self._starts[-1] <= tick:
            before = self._starts[-1]
            self.epoch_start(len(self._starts))
            empty = empty + 1 if self._starts[-1] == before else 0
            if empty > _MOST_EMPTY_EPOCHS:
                raise ValueError(
                    f'this node reads no sample in {empty} epochs in a row '
                    f'from epoch {len(self._starts) - empty - 1} on')
        # The last epoch starting at or before the tick (skips empty ones).
        epoch = bisect.bisect_right(self._starts, tick) - 1
        return epoch, tick - self._starts[epoch]

    def _epoch_starts(self, epochs: np.ndarray) -> np.ndarray:
        if self.endless:
            return np.zeros_like(epochs)
        if self.epoch_ticks is not None:
            return epochs * self.epoch_ticks
        return np.array([self.epoch_start(e) for e in epochs.tolist()],
                        np.int64)

    def _epochs_of(self, ticks: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        if self.endless:
            return np.zeros_like(ticks), ticks
        if self.epoch_ticks is not None:
            return np.divmod(ticks, self.epoch_ticks)
        pairs = np.array([self.epoch_of(t) for t in ticks.tolist()],
                         np.int64).reshape(-1, 2)
        return pairs[:, 0], pairs[:, 1]

    @property
    def knows_next_reads(self) -> bool:
        """Whether the order has an inverse (:meth:`next_reads`)."""
        return self.order.places(0, np.empty(0, np.int64)) is not None

    def next_reads(self, ticks: np.ndarray, ids: np.ndarray, until: int,
                   cycles: int) -> Optional[np.ndarray]:
        """The node's first tick after ``ticks[i]`` that reads ``ids[i]``,
        from the order's inverse, however far ahead; :data:`NOT_BEFORE`
        when that is not before tick ``until``, :data:`NOT_SEARCHED` when
        not within ``cycles`` cycles after ``ticks[i]``'s. None when the
        order has no inverse.

        Args:
            ticks (np.ndarray): Ticks (int).
            ids (np.ndarray): Sample ids, one per tick.
            until (int): Ticks from here on are not searched.
            cycles (int): Cycles searched after a tick's own.
        """
        if not self.knows_next_reads:
            return None
        ticks = np.asarray(ticks, np.int64)
        ids = np.asarray(ids, np.int64)
        epochs, within = self._epochs_of(ticks)
        cycle = self.order.cycle_of(epochs, self.positions(within))
        last = cycle + cycles
        found = np.full(len(ids), NOT_SEARCHED, np.int64)
        pending = np.arange(len(ids))
        while pending.size:
            current = int(cycle[pending].min())
            if self._cycle_first_tick(current) >= until:
                found[pending] = NOT_BEFORE
                break
            group = pending[cycle[pending] == current]
            reads = self._first_read_in_cycle(current, ids[group],
                                              ticks[group])
            seen = reads >= 0
            found[group[seen]] = np.where(reads[seen] < until,
                                          reads[seen], NOT_BEFORE)
            cycle[group] += 1
            pending = pending[(found[pending] == NOT_SEARCHED)
                              & (cycle[pending] <= last[pending])]
        return found

    def _cycle_first_tick(self, cycle: int) -> int:
        """No tick of ``cycle`` comes before this one."""
        epoch, position = self.order.cycle_start(cycle)
        return (self.epoch_start(epoch) +
                (position // self.world_size) * self.local_ranks)

    def _first_read_in_cycle(self, cycle: int, ids: np.ndarray,
                             after: np.ndarray) -> np.ndarray:
        """The node's first tick of ``cycle`` past ``after[i]`` reading
        ``ids[i]``, -1 where none."""
        places = self.order.places(cycle, ids)
        starts = self._epoch_starts(places.epoch)
        first = np.full(len(ids), -1, np.int64)
        position = places.first
        inside = position < places.end
        # Rank padding repeats a sample every `period` positions: few times.
        while inside.any():
            row, rank = np.divmod(position, self.world_size)
            local = rank - self.first_rank
            tick = starts + row * self.local_ranks + local
            read = (inside & (local >= 0) & (local < self.local_ranks) &
                    (tick > after) & (first < 0))
            first[read] = tick[read]
            position = position + places.period
            inside = (position < places.end) & (first < 0)
        return first

    def positions(self, ticks: np.ndarray) -> np.ndarray:
        """Global positions within their epoch of epoch-relative ticks."""
        rows, column = np.divmod(np.asarray(ticks, np.int64),
                                 self.local_ranks)
        return rows * self.world_size + self.first_rank + column

    def ids(self, start: int, stop: int) -> np.ndarray:
        """Sample ids read at ticks ``start .. stop - 1``."""
        if self.endless:
            return self.order.ids(0, self.positions(np.arange(start, stop)))
        parts = []
        tick = start
        while tick < stop:
            epoch, k = self.epoch_of(tick)
            base = tick - k
            end = min(stop - base, self.epoch_ticks_of(epoch))
            parts.append(
                self.order.ids(epoch, self.positions(np.arange(k, end))))
            tick = base + end
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def tick_of(self, epoch: int, consumed: int) -> int:
        """The node's next tick once ``consumed`` global positions of
        ``epoch`` are read by every rank (``consumed`` as counted by the
        training loop: a multiple of ``batch_size * world_size``)."""
        if self.endless:
            epoch = 0
        elif consumed >= self.order.epoch_length(epoch):
            epoch, consumed = epoch + 1, 0
        return (self.epoch_start(epoch) +
                (consumed // self.world_size) * self.local_ranks)
