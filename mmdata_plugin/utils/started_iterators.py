"""Restarting the DataLoader iterator a training loop started too early.

Stock ``IterBasedTrainLoop`` starts the train DataLoader's iterator (and
its workers) in ``__init__``, before any hook runs. A hook that changes how
the loader produces batches (``DataMonitorHook`` times the workers'
pipeline, ``RayDataNodesHook`` produces the batches elsewhere) must stop
that iterator and start the same pass again, so that the first batch is
the one the loop would have had.
"""
import torch
from mmengine.dataset import InfiniteSampler
from torch.utils.data import DataLoader

from .torch_internals import (forget_started_iterator, held_iterator,
                              is_dataloader_iterator, rewind_infinite_sampler,
                              set_held_iterator, shutdown_workers,
                              started_iterator)


def rewind_samplers(loader: DataLoader) -> None:
    """Make an iterator started again replay the same indices.

    mmengine's ``InfiniteSampler`` yields from one generator made in its
    ``__init__`` (a second ``iter()`` continues where the first one
    stopped, and closing the first closes it); a fresh one from its seed
    restarts the sequence. Samplers that draw their order in ``__iter__``
    from their own seed (``DefaultSampler``) need nothing.
    """
    batch_sampler = getattr(loader, 'batch_sampler', None)
    for sampler in (loader.sampler, getattr(batch_sampler, 'sampler', None)):
        if isinstance(sampler, InfiniteSampler):
            rewind_infinite_sampler(sampler)
    _empty_buckets(batch_sampler)


def _empty_buckets(batch_sampler) -> None:
    """Empty the pending buckets of a bucketing batch sampler.

    mmdet's aspect-ratio batch samplers keep the indices of unfinished
    batches on the instance (``_aspect_ratio_buckets``, ``_buckets``): the
    batches the first iterator prefetched left some there, which a restarted
    iterator would hand out first. A fresh sampler's buckets are empty.
    """
    for name, value in getattr(batch_sampler, '__dict__', {}).items():
        if 'bucket' in name and isinstance(value, list) and all(
                isinstance(bucket, list) for bucket in value):
            for bucket in value:
                bucket.clear()


def shutdown_persistent_iterator(loader: DataLoader) -> None:
    """Stop the workers of ``loader``'s persistent iterator and forget it
    (the next ``iter(loader)`` starts new ones)."""
    persistent = started_iterator(loader)
    if persistent is not None:
        shutdown_workers(persistent)
        forget_started_iterator(loader)


def _restartable(iterator) -> bool:
    """Whether ``iterator`` is a pass a restart replaces: a torch iterator,
    or one that says it has handed nothing out (``restartable``: the Ray
    data nodes' stream)."""
    return is_dataloader_iterator(iterator) or getattr(
        iterator, 'restartable', False)


def restart_started_iterator(loader: DataLoader, loop) -> bool:
    """Restart the iterators already started on ``loader``.

    The loader's persistent iterator is shut down; the one ``loop`` holds
    (in mmengine's ``_InfiniteDataloaderIterator`` or as
    ``loop.dataloader_iterator`` itself) is shut down and replaced by a new
    ``iter(loader)`` of the same pass (samplers rewound, the global torch
    RNG as it was).

    Args:
        loader (DataLoader): The train DataLoader.
        loop (optional): Object with a ``dataloader_iterator`` to check.

    Returns:
        bool: Whether the loop's iterator was replaced.
    """
    persistent = started_iterator(loader)
    holder = getattr(loop, 'dataloader_iterator', None)
    if _restartable(held_iterator(holder)):
        started, replace = held_iterator(holder), lambda it: \
            set_held_iterator(holder, it)
    elif _restartable(holder):
        started, replace = holder, lambda it: setattr(
            loop, 'dataloader_iterator', it)
    else:
        started, replace = None, None
    shutdown_persistent_iterator(loader)
    if started is not None and started is not persistent:
        shutdown_workers(started)
    if started is None:
        return False
    rng_state = torch.get_rng_state()
    rewind_samplers(loader)
    replace(iter(loader))
    torch.set_rng_state(rng_state)
    return True
