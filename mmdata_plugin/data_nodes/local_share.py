"""The trainer's own DataLoader workers making a share of the batches of a
Ray data-node stream (``RayDataNodesHook(local_workers=True)``).

The batch sampler of the training loop is the one source of the order. It
is drawn by two producers: the Ray window of the stream and a local torch
DataLoader iterator, whose batch sampler is a *tap* on that order. Every
batch of indices is drawn once, by one of them, and the ordered window
records which: the stream hands the batches out in the sampler's order.

What this relies on of torch's DataLoader (checked in ``_BaseDataLoaderIter``
and ``_MultiProcessingDataLoaderIter`` of torch 2.13, and by
``tests/test_data_nodes/test_ray_local_share.py``): an iterator takes its
batch sampler with ``iter()`` once per pass; it asks it for
``prefetch_factor * num_workers`` batches when the pass starts and for one
more each time it returns a batch; a ``StopIteration`` from it only stops
the asking; with ``in_order=True`` it returns the batches in the order it
drew them; asked for a batch with none outstanding it ends the pass (and
shuts its workers down unless they are persistent).
"""
from collections import deque
from typing import Any, Deque, Iterator, List, Optional

from torch.utils.data import DataLoader

from ..utils.started_iterators import shutdown_persistent_iterator


class _Local:
    """The window's entry of a batch the local workers make."""

    def __repr__(self) -> str:
        return 'LOCAL'


#: A batch of the window made by the local workers (the others are the
#: actors' :class:`~.actor_pool.Pending`).
LOCAL = _Local()


class BatchOrder:
    """The training loop's batches of indices, each drawn once, and the
    window of those drawn and not yet handed out, in the sampler's order.

    Args:
        batches (Iterator[list]): The batch sampler's batches of indices.
    """

    def __init__(self, batches: Iterator[List[Any]]) -> None:
        self._batches = batches
        self.window: Deque[Any] = deque()
        self.exhausted = False

    def draw(self) -> Optional[List[Any]]:
        """The next batch of indices; None once the sampler has ended."""
        if self.exhausted:
            return None
        indices = next(self._batches, None)
        if indices is None:
            self.exhausted = True
        return indices


class _Tap:
    """A local DataLoader iterator's batch sampler for one pass: draws
    from the :class:`BatchOrder` and enters each batch as :data:`LOCAL`.
    A class, not a generator: it may stop and be asked again."""

    def __init__(self, order: BatchOrder) -> None:
        self._order = order

    def __iter__(self) -> '_Tap':
        return self

    def __next__(self) -> List[Any]:
        indices = self._order.draw()
        if indices is None:
            raise StopIteration
        self._order.window.append(LOCAL)
        return indices


class _Taps:
    """The local DataLoader's batch sampler: each ``iter()`` (a new pass,
    or a persistent iterator's reset) taps the order of the stream now
    starting. Holds no stream, so a dropped stream is freed at once."""

    def __init__(self) -> None:
        self.order: Optional[BatchOrder] = None

    def __iter__(self) -> _Tap:
        return _Tap(self.order)


class LocalShare:
    """The train DataLoader's own workers, making the batches a stream's
    tap draws.

    A second DataLoader over the same dataset with the train DataLoader's
    ``num_workers``, ``collate_fn``, ``worker_init_fn``, ``generator``,
    ``prefetch_factor``, ``persistent_workers``, ``pin_memory``,
    ``timeout`` and ``multiprocessing_context`` (``in_order`` is forced:
    the stream needs its batches in order). It is built at the first pass,
    once the data monitor (if any) has put its timed collate on the train
    DataLoader, and kept for the run (persistent workers across epochs).

    Args:
        loader (DataLoader): The train DataLoader.
    """

    def __init__(self, loader: DataLoader) -> None:
        if not loader.num_workers:
            raise ValueError(
                'RayDataNodesHook: local_workers=True needs local workers, '
                'but the train DataLoader has num_workers=0: set '
                'train_dataloader.num_workers >= 1, or local_workers=False '
                '(the actors make every batch)')
        self._train_loader = loader
        self._taps = _Taps()
        self._loader: Optional[DataLoader] = None

    @property
    def num_workers(self) -> int:
        return self._train_loader.num_workers

    @property
    def depth(self) -> int:
        """Batches the local workers have in production at once."""
        return self._train_loader.prefetch_factor * self.num_workers

    def start(self, order: BatchOrder) -> Iterator:
        """The local iterator of a pass drawing from ``order``.

        It draws the DataLoader workers' base seed from the train
        DataLoader's generator, as the train DataLoader's own iterator
        would, and its first :attr:`depth` batches at once.
        """
        if self._loader is None:
            self._loader = self._build()
        self._taps.order = order
        return iter(self._loader)

    def _build(self) -> DataLoader:
        train = self._train_loader
        return DataLoader(
            train.dataset,
            batch_sampler=self._taps,
            num_workers=train.num_workers,
            collate_fn=train.collate_fn,
            pin_memory=train.pin_memory,
            timeout=train.timeout,
            worker_init_fn=train.worker_init_fn,
            multiprocessing_context=train.multiprocessing_context,
            generator=train.generator,
            prefetch_factor=train.prefetch_factor,
            persistent_workers=train.persistent_workers,
            pin_memory_device=train.pin_memory_device,
            in_order=True)

    def close(self) -> None:
        """Shut the persistent workers down (others end with their pass,
        or when their iterator is dropped)."""
        if self._loader is not None:
            shutdown_persistent_iterator(self._loader)
            self._loader = None
