"""Put the worker-side timers into a DataLoader's dataset tree and collate.

The dataset tree is walked generically: ``.dataset`` (Repeat, ClassBalanced,
MultiImageMix, per-sample seeding wrappers, ``Subset``), ``.datasets``
(Concat) and each dataset's ``.pipeline`` (an mmengine/mmcv ``Compose`` or a
plain list), down into wrapper transforms (``RandomChoice``, ``RandomApply``,
``KeyMapper`` ...) through their ``.transforms``. Every change is recorded
and undone by :meth:`LoaderInstrumentation.uninstall`.
"""
import logging
from collections.abc import Mapping
from functools import partial
from typing import Callable, Iterator, List, Optional, Tuple

from mmengine.logging import print_log
from torch.utils.data import DataLoader, IterableDataset

from . import probes
from .worker_timing import (ACCUMULATOR, TimedCollate, TimedFetch,
                            TimedTransform, TimingPlan, timed_dataset_class)

# Instrumentations that may have probes installed in this process (when the
# loader has no workers, the main process loads the data).
_probe_users: List['LoaderInstrumentation'] = []


def _release_probes(user: 'LoaderInstrumentation') -> None:
    _probe_users.remove(user)
    if not _probe_users:
        probes.uninstall()


def _warn_untimed_fetches(base: type, error: Exception) -> None:
    print_log(
        f'DataMonitor cannot time whole fetches of {base.__name__} '
        f'({error}); pipeline stages are still timed.',
        logger='current',
        level=logging.WARNING)


def _is_dataset(obj) -> bool:
    return (obj is not None and not isinstance(obj,
                                               (str, bytes, Mapping, type))
            and (hasattr(obj, '__getitem__') or hasattr(obj, '__iter__')))


def _is_compose(obj) -> bool:
    return (type(obj).__name__ == 'Compose'
            and isinstance(getattr(obj, 'transforms', None), list))


def _transform_list(pipeline):
    """The mutable list of transforms of a dataset's ``pipeline``, if any."""
    if _is_compose(pipeline):
        return pipeline.transforms
    if isinstance(pipeline, list):
        return pipeline
    return None


def iter_pipelines(dataset) -> Iterator[Tuple[str, object, list]]:
    """``(path, dataset, transforms)`` for every pipeline in the tree.

    A wrapper that forwards attribute reads (``pipeline``) to the dataset
    it wraps shows the same list; it is reported once, under the deepest
    dataset that has it (its owner).
    """
    seen, found = set(), {}
    pending = [('dataset', dataset)]
    while pending:
        path, node = pending.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        transforms = _transform_list(getattr(node, 'pipeline', None))
        if transforms is not None:
            found[id(transforms)] = (path, node, transforms)
        child = getattr(node, 'dataset', None)
        if _is_dataset(child):
            pending.append((f'{path}.dataset', child))
        children = getattr(node, 'datasets', None)
        if isinstance(children, (list, tuple)):
            pending += [(f'{path}.datasets[{i}]', c)
                        for i, c in enumerate(children) if _is_dataset(c)]
    return iter(found.values())


class LoaderInstrumentation:
    """The worker-side half of the monitor on one DataLoader.

    Args:
        dataloader (DataLoader): The loader to instrument.
        per_transform (bool): Time each pipeline transform.
        split_io_decode (bool): Probe ``fileio.get``/``imfrombytes``.
        sample_every (int, optional): Time one batch in this many in
            stages; None chooses it from the measured cost (see
            :mod:`.worker_timing`), 1 times every batch.
    """

    def __init__(self,
                 dataloader: DataLoader,
                 per_transform: bool = True,
                 split_io_decode: bool = True,
                 sample_every: Optional[int] = None) -> None:
        self.dataloader = dataloader
        self.per_transform = per_transform
        self.split_io_decode = split_io_decode
        self.sample_every = sample_every
        self.pipelines: List[dict] = []
        self.plan: Optional[TimingPlan] = None
        self._undo: List[Callable[[], None]] = []

    def install(self) -> None:
        if self._undo:
            return
        self.pipelines = []
        self.plan = TimingPlan(self.sample_every, self.split_io_decode)
        if self.split_io_decode:
            _probe_users.append(self)
            self._undo.append(lambda: _release_probes(self))
        if self.per_transform:
            found = list(iter_pipelines(self.dataloader.dataset))
            for index, (path, dataset, transforms) in enumerate(found):
                tag = f'p{index}:' if len(found) > 1 else ''
                keys = self._wrap_list(transforms, tag, index, top=True)
                self.pipelines.append(
                    dict(
                        id=tag.rstrip(':') or 'p0',
                        dataset=path,
                        dataset_type=type(dataset).__name__,
                        transforms=keys))
        self._time_fetches(self.dataloader.dataset)
        loader = self.dataloader
        original_collate = loader.collate_fn
        loader.collate_fn = TimedCollate(original_collate)
        self._undo.append(
            lambda: setattr(loader, 'collate_fn', original_collate))

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _time_fetches(self, dataset) -> None:
        """Give the dataset a :class:`TimedFetch` as its ``__getitems__``
        (an instance attribute: its class and attribute storage stay as
        they are); a loader without automatic batching also needs the
        timed class (``dataset[i]`` is looked up on the class).

        Without them (an iterable dataset, a ``__slots__`` layout) nothing
        sees batch boundaries before the collate: every batch is timed.
        """
        if isinstance(dataset, IterableDataset):
            return  # no per-index fetch; transforms and collate are timed
        base = type(dataset)
        fetch = TimedFetch(dataset, base, self.plan, self.split_io_decode)
        try:
            # object.__setattr__: wrappers may forward attribute writes to
            # the dataset they wrap.
            object.__setattr__(dataset, '__getitems__', fetch)
        except AttributeError as error:  # e.g. a __slots__ layout
            _warn_untimed_fetches(base, error)
            return
        self._undo.append(
            partial(object.__delattr__, dataset, '__getitems__'))
        # Registered where the first timed fetch runs (a worker, or here).
        self._undo.append(partial(ACCUMULATOR.unregister, self.plan))
        if self.dataloader.batch_sampler is not None:
            return
        try:
            object.__setattr__(dataset, '__class__', timed_dataset_class(base))
        except TypeError as error:
            _warn_untimed_fetches(base, error)
            return
        self._undo.append(
            partial(object.__setattr__, dataset, '__class__', base))

    def _wrap_list(self, items: list, prefix: str, pipeline: int,
                   top: bool) -> List[str]:
        plain = [
            t.transform if isinstance(t, TimedTransform) else t for t in items
        ]
        keys = []
        for pos, transform in enumerate(items):
            if isinstance(transform, TimedTransform):
                keys.append(transform.key)  # a pipeline shared by datasets
                continue
            if not top and _is_compose(transform):
                keys += self._wrap_list(transform.transforms,
                                        f'{prefix}{pos}.', pipeline, False)
                continue
            name = type(transform).__name__
            key = f'{prefix}{pos:02d}_{name}' if top else (
                f'{prefix}{pos}_{name}')
            items[pos] = TimedTransform(transform, key, pipeline,
                                        pos if top else None)
            self._undo.append(partial(items.__setitem__, pos, transform))
            keys.append(key)
            inner = _transform_list(getattr(transform, 'transforms', None))
            if inner is not None:
                keys += self._wrap_list(inner, f'{key}.', pipeline, False)
        self.plan.add_list(items, plain)
        return keys
