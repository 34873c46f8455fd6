"""A stand-in for the DataLoader's batch sampler that can start anywhere."""
from typing import Iterator, Optional, Tuple

from ...sample_order.batch_order import BatchOrder
from ...sample_order.data_position import DataPosition


def set_sampler_epoch(dataloader, epoch: int) -> None:
    """``set_epoch`` the way mmengine's infinite iterator does it."""
    if hasattr(getattr(dataloader, 'sampler', None), 'set_epoch'):
        dataloader.sampler.set_epoch(epoch)
    elif hasattr(getattr(dataloader.batch_sampler, 'sampler', None),
                 'set_epoch'):
        dataloader.batch_sampler.sampler.set_epoch(epoch)


class ResumableBatchSampler:
    """Serves a batch sampler's batches from any position of its stream.

    Installed by the fast-resume loops in the train DataLoader's
    ``batch_sampler`` slot. Its batches are those of its
    :class:`~mmdata_plugin.sample_order.BatchOrder`: the ones the wrapped
    batch sampler would yield, with per-sample seeds, but :meth:`seek` can
    start the next pass anywhere.

    A prepared position is consumed by the first pass that *starts*
    (``__iter__`` is a generator, so the DataLoader's extra ``iter()`` calls
    do not use it up). Other attributes (``sampler``, ``batch_size``,
    ``drop_last`` ...) are the wrapped batch sampler's.

    Args:
        batch_sampler: The DataLoader's batch sampler.
        position (DataPosition): The loop's position tracker; its epoch
            labels the seeds of a pass.
        seed (int): Seed for the per-sample seeds when the sampler has no
            ``seed`` attribute of its own.
        seed_samples (bool): Tag indices with per-sample seeds.
    """

    def __init__(self, batch_sampler, position: DataPosition, seed: int,
                 seed_samples: bool = True) -> None:
        self.batch_sampler = batch_sampler
        self.order = BatchOrder(batch_sampler, seed, seed_samples)
        self.position = position
        self._pending: Optional[Iterator[list]] = None

    def __getattr__(self, name: str):
        if name == 'batch_sampler':
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list]:
        batches, self._pending = self._pending, None
        if batches is None:
            batches = self.order.batches(self.position.epoch, 0, 0)
        yield from batches

    def seek(self, epoch: int, samples_in_epoch: int,
             batches_in_epoch: int) -> None:
        """Make the next pass start at a position of epoch ``epoch``
        (see :meth:`BatchOrder.batches`). The work is done here, so that
        the pass starts without delay."""
        self._pending = self.order.batches(epoch, samples_in_epoch,
                                           batches_in_epoch)

    def replay(self, num_batches: int, epoch: int) -> Tuple[int, int]:
        """Replay ``num_batches`` batches from the start of ``epoch``; the
        next pass continues right after them.

        Returns:
            tuple[int, int]: The epoch reached and the batches done in it.
        """
        epoch, done, self._pending = self.order.skip(num_batches, epoch)
        return epoch, done
