"""The samples entering a growing window, fetched while the epoch before
trains.

With a growing-window order (``GrowingWindowSampler``) the samples that
epoch ``e + 1`` reads and epoch ``e`` does not -- the window's entering
samples, ``window_changes(e + 1).entering`` -- are known at any time. The
node prefetcher downloads them while epoch ``e`` trains, at low priority
(only while fewer downloads than its target run for the current window),
and books each as kept until its first read in epoch ``e + 1``, the way a
restart adopts the files already on disk: epoch ``e + 1`` then reads only
local files. This module says which samples, in which order: the node's
first reads of the entering samples, soonest first, among the samples the
plan can keep at the epoch start (Belady keeps the ones read first).
"""
from typing import List, Optional, Tuple

import numpy as np

from ..sample_order.node_stream import NodeStream


class EnteringSamples:
    """The node's entering samples of the next epoch, by first read.

    Args:
        stream (NodeStream): The node's stream; its order must answer
            ``entering(epoch)`` (see :meth:`applies`).
    """

    def __init__(self, stream: NodeStream) -> None:
        self.stream = stream
        self.epoch: Optional[int] = None
        self._ticks: List[int] = []
        self._samples: List[int] = []
        self._next = 0

    @staticmethod
    def applies(stream: NodeStream) -> bool:
        """Whether ``stream``'s epochs have entering samples."""
        return not stream.endless and stream.order.entering(1) is not None

    def select(self, epoch: int, keep: int) -> None:
        """Queue the entering samples of ``epoch`` that the node reads,
        unless queued already: those among the first ``keep`` samples the
        node reads in the epoch (what fits the plan's capacity at the
        epoch start), soonest first read first."""
        if epoch == self.epoch:
            return
        stream = self.stream
        start = stream.epoch_start(epoch)
        ids = stream.ids(start, start + stream.epoch_ticks_of(epoch))
        samples, first = np.unique(ids, return_index=True)
        soonest = np.argsort(first, kind='stable')[:max(0, keep)]
        samples, first = samples[soonest], first[soonest] + start
        entering = np.isin(samples, stream.order.entering(epoch))
        self._samples = samples[entering].tolist()
        self._ticks = first[entering].tolist()
        self._next = 0
        self.epoch = epoch

    def peek(self) -> Optional[Tuple[int, int]]:
        """``(first read tick, sample)`` of the next queued sample."""
        if self._next >= len(self._samples):
            return None
        return self._ticks[self._next], self._samples[self._next]

    def pop(self) -> None:
        """Done with the sample :meth:`peek` gave."""
        self._next += 1

    def clear(self) -> None:
        """Take none of the queued samples (until the next epoch)."""
        self._next = len(self._samples)

    def pending(self) -> int:
        """Queued samples not yet taken."""
        return len(self._samples) - self._next
