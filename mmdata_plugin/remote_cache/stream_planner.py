"""Belady-with-bypass decisions for a node, made tick by tick ahead of use.

The planner walks the node's future stream (:class:`~.NodeStream`)
ahead of the readers and decides, per tick, whether the read is served by a
kept copy (hit) or needs a download, and what is kept afterwards
(:class:`~.belady.BeladyCache`). Where the sample order has an inverse
(our Feistel-permuted samplers), next uses are exact at any distance
(:meth:`~.NodeStream.next_reads`): Belady's decisions at any data-set size,
with memory for one block of ticks. Otherwise they are looked up within a
``horizon`` of ticks. A sample not read again within it is never read
again when the look-ahead reaches the stop or the end of the epoch after
the next (each epoch reads a sample at most once); otherwise it is read
again beyond the look-ahead (:data:`~.belady.BEYOND`): kept in room no
sooner read sample needs, so a horizon shorter than an epoch (a data set
of billions of samples) still keeps a fixed set rather than nothing.
"""
from typing import Callable, Iterable, Optional

import numpy as np

from ..sample_order.node_stream import NOT_BEFORE, NOT_SEARCHED, NodeStream
from .belady import BEYOND, NEVER, BeladyCache, Decision, next_uses

#: Ticks decided per block with exact next uses: bounds the transient
#: memory of asking the inverse (~170 bytes a tick).
_EXACT_BLOCK = 1 << 16
#: Cycles (permutation passes) searched for a next use past a read's own:
#: a node of ``L`` ranks of ``W`` reads a sample in a pass with chance
#: ``L / W``; a use later than this is taken as BEYOND.
_CYCLES_SEARCHED = 1 << 8


class StreamPlanner:
    """Decisions for the ticks of a node stream, in order.

    Args:
        stream (NodeStream): The node's stream.
        capacity (int): Bytes that kept samples may use.
        size_of (callable): ``size_of(sample) -> bytes`` (an estimate until
            the sample has been downloaded once).
        start (int): First tick to decide.
        stop (int, optional): Tick after the last one read (the end of
            training); nothing after it is planned or kept for.
        horizon (int): Ticks looked ahead for next uses (at least; whole
            blocks of ticks are decided at once).
    """

    def __init__(self,
                 stream: NodeStream,
                 capacity: int,
                 size_of: Callable[[int], int],
                 start: int = 0,
                 stop: Optional[int] = None,
                 horizon: int = 1 << 20) -> None:
        if horizon < 1:
            raise ValueError(f'horizon must be >= 1, got {horizon}')
        self.stream = stream
        self.cache = BeladyCache(capacity)
        self.size_of = size_of
        self.tick = start
        self.stop = stop
        self.horizon = horizon
        # Ticks are decided block by block; a block's next uses come from
        # the order's inverse, or one sort over the block plus the horizon
        # after it.
        self._exact = stream.knows_next_reads
        self._block = (_EXACT_BLOCK if self._exact else max(
            4096, horizon // 2))
        self._block_start = start
        self._ids = np.empty(0, np.int64)
        self._next = np.empty(0, np.int64)

    def _end(self, tick: int) -> int:
        return tick if self.stop is None else min(tick, self.stop)

    def _load_block(self) -> None:
        start = self.tick
        known = self._end(start + self._block) - start
        ids = self.stream.ids(start, start + known)
        if self._exact:
            exact = self.stream.next_reads(
                np.arange(start, start + known), ids,
                np.iinfo(np.int64).max if self.stop is None else self.stop,
                _CYCLES_SEARCHED)
            self._next = np.select(
                [exact == NOT_BEFORE, exact == NOT_SEARCHED],
                [NEVER, BEYOND], exact)
        else:
            self._next = self._looked_up_next_uses(start, ids)
        self._ids = ids
        self._block_start = start

    def _looked_up_next_uses(self, start: int,
                             ids: np.ndarray) -> np.ndarray:
        """Next uses of the ``ids`` read from tick ``start`` on, found in
        the ``horizon`` after them."""
        known = len(ids)
        seen_to = self._end(start + self._block + self.horizon)
        ahead = self.stream.ids(start + known, seen_to)
        following = next_uses(np.concatenate([ids, ahead]), known)
        return np.where(following == NEVER,
                        self._unseen(start + known - 1, seen_to),
                        following + start)

    def _unseen(self, last: int, seen_to: int) -> int:
        """Next use of a sample read up to tick ``last`` and not again
        before ``seen_to``."""
        if self.stop is not None and seen_to >= self.stop:
            return NEVER
        if not self.stream.endless:
            epoch, _ = self.stream.epoch_of(last)
            if seen_to >= self.stream.epoch_start(epoch + 2):
                return NEVER
        return BEYOND

    def lookahead(self, count: int) -> np.ndarray:
        """Sample ids of the next ``count`` undecided ticks (fewer at the
        stop)."""
        return self.stream.ids(self.tick, self._end(self.tick + count))

    def adopt(self, present: Iterable[int]) -> None:
        """Count samples already on disk (a restart) as kept for their
        first read, soonest first, as far as the capacity allows."""
        present = np.fromiter(present, np.int64)
        if not len(present):
            return
        ids = self.lookahead(self.horizon)
        ticks = np.flatnonzero(np.isin(ids, present))
        samples, first = np.unique(ids[ticks], return_index=True)
        soonest = np.argsort(first, kind='stable')
        samples, ticks = samples[soonest], self.tick + ticks[first[soonest]]
        sizes = np.fromiter(map(self.size_of, samples.tolist()), np.int64,
                            len(samples))
        fits = np.cumsum(sizes) <= self.cache.capacity - self.cache.used
        # (the first that does not fit ends it, as one by one)
        count = len(fits) if fits.all() else int(np.argmin(fits))
        self.cache.keep_all(samples[:count], ticks[:count], sizes[:count])

    def _block_offset(self) -> int:
        """The index of the next tick in the loaded block (loading the
        next block when it is used up)."""
        offset = self.tick - self._block_start
        if offset >= len(self._ids):
            self._load_block()
            offset = 0
        return offset

    def decide(self) -> Optional[Decision]:
        """The decision for the next tick; None once ``stop`` is reached."""
        if self.stop is not None and self.tick >= self.stop:
            return None
        offset = self._block_offset()
        sample = int(self._ids[offset])
        decision = self.cache.access(self.tick, sample, self.size_of(sample),
                                     int(self._next[offset]))
        self.tick += 1
        return decision

    def hits(self, stop: int) -> np.ndarray:
        """Decide the ticks up to ``stop`` (or the planner's stop) as
        :meth:`decide` does; whether each read hits (the simulation's path:
        a block of reads at once, no Decision per read)."""
        stop = self._end(stop)
        found = [np.empty(0, bool)]
        while self.tick < stop:
            offset = self._block_offset()
            end = min(len(self._ids), offset + stop - self.tick)
            ids = self._ids[offset:end]
            sizes = np.fromiter(map(self.size_of, ids.tolist()), np.int64,
                                len(ids))
            found.append(
                self.cache.hits(np.arange(self.tick, self.tick + len(ids)),
                                ids, sizes, self._next[offset:end]))
            self.tick += len(ids)
        return np.concatenate(found)
