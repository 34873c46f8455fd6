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
# The DataLoader iterator base class is private; it identifies the already
# started iterators to restart.
from torch.utils.data.dataloader import _BaseDataLoaderIter


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
            sampler.indices = sampler._indices_of_rank()
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


def shutdown_iterator(iterator) -> None:
    """Stop a DataLoader iterator's workers (if it has any)."""
    shutdown = getattr(iterator, '_shutdown_workers', None)
    if shutdown is not None:
        shutdown()


def shutdown_persistent_iterator(loader: DataLoader) -> None:
    """Stop the workers of ``loader``'s persistent iterator and forget it
    (the next ``iter(loader)`` starts new ones)."""
    persistent = getattr(loader, '_iterator', None)
    if persistent is not None:
        shutdown_iterator(persistent)
        loader._iterator = None


def _restartable(iterator) -> bool:
    """Whether ``iterator`` is a pass a restart replaces: a torch iterator,
    or one that says it has handed nothing out (``restartable``: the Ray
    data nodes' stream)."""
    return isinstance(iterator, _BaseDataLoaderIter) or getattr(
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
    # Touches torch internals (`DataLoader._iterator`, the iterator's
    # `_shutdown_workers`) and mmengine's `_InfiniteDataloaderIterator.
    # _iterator`; this is the only place that does.
    persistent = getattr(loader, '_iterator', None)
    holder = getattr(loop, 'dataloader_iterator', None)
    if _restartable(getattr(holder, '_iterator', None)):
        started, replace = holder._iterator, lambda it: setattr(
            holder, '_iterator', it)
    elif _restartable(holder):
        started, replace = holder, lambda it: setattr(
            loop, 'dataloader_iterator', it)
    else:
        started, replace = None, None
    shutdown_persistent_iterator(loader)
    if started is not None and started is not persistent:
        shutdown_iterator(started)
    if started is None:
        return False
    rng_state = torch.get_rng_state()
    rewind_samplers(loader)
    replace(iter(loader))
    torch.set_rng_state(rng_state)
    return True
