"""mmengine's infinite DataLoader iterator, made lazy and trackable."""
import logging
import time
from typing import Sequence

from mmengine.logging import print_log
from torch.utils.data import DataLoader

from ...sample_order.data_position import DataPosition
from ...utils.seeding import preserved_global_rngs
from .resumable_batch_sampler import set_sampler_epoch


def new_dataloader_iterator(dataloader: DataLoader):
    """``iter(dataloader)`` without touching the global RNGs.

    Creating a DataLoader iterator draws its workers' base seed from the
    global torch generator. A resumed run creates it at another iteration
    than the uninterrupted run, which would shift all later main-process
    randomness (dropout, batch augmentations).
    """
    with preserved_global_rngs():
        return iter(dataloader)


_END_OF_PASS = object()


class ResumableDataloaderIterator:
    """Endless batches from a DataLoader, restarting it at each epoch end.

    Behaves like mmengine's ``_InfiniteDataloaderIterator`` (warning,
    ``set_epoch`` of the next epoch and a pause at each epoch end) except
    that ``iter(dataloader)`` -- which starts the workers and dispatches
    ``prefetch_factor * num_workers`` batches of indices -- only happens at
    the first ``next()``, after the loop has positioned the stream. Each
    batch handed out advances ``position``.

    Args:
        dataloader (DataLoader): The train dataloader.
        position (DataPosition): Tracker of the stream position.
        epoch_transition_sleep (float): Seconds to pause before restarting
            the DataLoader (mmengine pauses 2 s against a deadlock in the
            epoch transition).
    """

    def __init__(self,
                 dataloader: DataLoader,
                 position: DataPosition,
                 epoch_transition_sleep: float = 2.0) -> None:
        self._dataloader = dataloader
        self._position = position
        self._epoch_transition_sleep = epoch_transition_sleep
        self._pass = None

    @property
    def started(self) -> bool:
        """Whether the DataLoader iterator exists (workers may run)."""
        return self._pass is not None

    def __iter__(self):
        return self

    def __next__(self) -> Sequence[dict]:
        if self._pass is None:
            self._pass = new_dataloader_iterator(self._dataloader)
        # Not `except StopIteration`: the next pass must not start while an
        # exception is handled. Code that catches one inside the sampler's
        # generator (numpy's seeding does) can leave the generator holding
        # the handled exception, whose traceback holds this frame and the
        # DataLoader iterator: a cycle, and worker processes that only
        # stop when the garbage collector finds it.
        data = next(self._pass, _END_OF_PASS)
        if data is _END_OF_PASS:
            print_log(
                'Reach the end of the dataloader, it will be restarted and '
                'continue to iterate. It is recommended to use '
                '`mmengine.dataset.InfiniteSampler` to enable the '
                'dataloader to iterate infinitely.',
                logger='current',
                level=logging.WARNING)
            self._position.start_epoch(self._position.epoch + 1)
            set_sampler_epoch(self._dataloader, self._position.epoch)
            time.sleep(self._epoch_transition_sleep)
            self._pass = new_dataloader_iterator(self._dataloader)
            data = next(self._pass)
        self._position.advance()
        return data
