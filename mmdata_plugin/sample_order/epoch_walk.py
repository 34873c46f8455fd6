"""Where mmengine's iteration-based loop stands in a node's stream.

mmengine's infinite iterator restarts the DataLoader at each epoch end, so
an epoch of an order with epoch ends spans ``ceil`` (``floor`` with
``drop_last``) ``per-rank positions / batch_size`` batches; the prefetcher
needs the position after N of them.
"""
from .batch_order import batch_count
from .node_stream import NodeStream


class EpochWalk:
    """Where an iteration-based loop is in an order with epoch ends:
    mmengine's infinite iterator restarts the DataLoader at each, so an
    epoch spans ``ceil`` (``floor`` with ``drop_last``) ``per-rank
    positions / batch_size`` batches. It remembers the epoch it reached,
    so positions asked in increasing order (one per iteration) cost O(1)
    each, whatever the epoch.

    Args:
        stream (NodeStream): The node's stream (its order and world size).
        batch_size (int): Batch size of one rank.
        drop_last (bool): Whether a last partial batch is dropped.
    """

    def __init__(self, stream: NodeStream, batch_size: int,
                 drop_last: bool) -> None:
        self.stream = stream
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._epoch, self._before = 0, 0  # an epoch, iterations before it

    def _batches(self, epoch: int) -> int:
        return batch_count(
            self.stream.order.epoch_length(epoch) // self.stream.world_size,
            self.batch_size, self.drop_last)

    def position(self, iters: int) -> tuple:
        """``(epoch, global samples consumed in it)`` after ``iters``
        batches (the end of an epoch, not the start of the next)."""
        if iters < self._before:
            self._epoch, self._before = 0, 0
        while True:
            batches = self._batches(self._epoch)
            if iters - self._before <= batches:
                return self._epoch, ((iters - self._before) * self.batch_size *
                                     self.stream.world_size)
            if not batches and self._epoch > iters:
                raise ValueError(
                    f'the train sampler yields no batch of {self.batch_size} '
                    f'in epochs up to {self._epoch}')
            self._before += batches
            self._epoch += 1


def iteration_stop(stream: NodeStream, max_iters: int, batch_size: int,
                   drop_last: bool) -> tuple:
    """``(stop tick, epochs)`` of an iteration-based loop of ``max_iters``
    batches over an order with epoch ends (see :class:`EpochWalk`)."""
    epoch, consumed = EpochWalk(stream, batch_size,
                                drop_last).position(max_iters)
    return stream.tick_of(epoch, consumed), epoch + 1
