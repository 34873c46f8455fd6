"""One node's share of the global sample stream, as a flat sequence.

Ranks take interleaved global positions (rank ``r`` of ``W`` reads
``r, r + W, ...`` of each epoch), and a node runs the ``L`` consecutive
ranks ``r0 .. r0 + L - 1``. The node's *ticks* number its positions in
reading order across epochs::

    tick K = epoch * E + k,   position(k) = (k // L) * W + r0 + k % L

with ``E`` the node's positions per epoch (``k < E``). Everything the node
reads at tick ``K`` is ``order.ids(epoch, position(k))``: the sampler's own
order math (:mod:`.sample_order`), nothing recomputed here.
"""
from typing import Optional

import numpy as np

from .sample_order import SampleOrder


class NodeStream:
    """Sample ids a node reads, by tick.

    Args:
        order (SampleOrder): The global order.
        world_size (int): Ranks in the job.
        first_rank (int): Lowest global rank on this node.
        local_ranks (int): Ranks on this node (consecutive from
            ``first_rank``, as torchrun and slurm assign them).
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
        self.epoch_ticks: Optional[int] = None
        if order.epoch_size is not None:
            self.epoch_ticks = sum(
                max(0, -(-(order.epoch_size - rank) // world_size))
                for rank in range(first_rank, first_rank + local_ranks))

    def positions(self, ticks: np.ndarray) -> np.ndarray:
        """Global positions within their epoch of epoch-relative ticks."""
        rows, column = np.divmod(np.asarray(ticks, np.int64),
                                 self.local_ranks)
        return rows * self.world_size + self.first_rank + column

    def ids(self, start: int, stop: int) -> np.ndarray:
        """Sample ids read at ticks ``start .. stop - 1``."""
        if self.epoch_ticks is None:
            return self.order.ids(0, self.positions(np.arange(start, stop)))
        if self.epoch_ticks == 0:
            raise ValueError('this node reads no sample in an epoch')
        parts = []
        tick = start
        while tick < stop:
            epoch, k = divmod(tick, self.epoch_ticks)
            end = min(stop - epoch * self.epoch_ticks, self.epoch_ticks)
            parts.append(
                self.order.ids(epoch, self.positions(np.arange(k, end))))
            tick = epoch * self.epoch_ticks + end
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def tick_of(self, epoch: int, consumed: int) -> int:
        """The node's next tick once ``consumed`` global positions of
        ``epoch`` are read by every rank (``consumed`` as counted by the
        training loop: a multiple of ``batch_size * world_size``)."""
        if self.epoch_ticks is None:
            epoch, base = 0, 0
        else:
            if consumed >= self.order.epoch_size:
                epoch, consumed = epoch + 1, 0
            base = epoch * self.epoch_ticks
        return base + (consumed // self.world_size) * self.local_ranks
