"""The future sample order of a train sampler, asked where it is defined.

A cache planner needs ``(epoch, global position) -> sample id`` for any
rank. The samplers' order math lives in
:mod:`mmdata_plugin.datasets.rank_sharded_sampler` (ours) and
:mod:`.index_streams` (mmengine's); the classes
here only call it, so the planner and a resumed run can never disagree.
"""
import abc
from typing import Dict, Iterator, NamedTuple, Optional, Tuple

import numpy as np
import torch

from .index_streams import default_sampler_epoch, infinite_sampler_passes
from .batch_order import choose_strategy


class SamplePlaces(NamedTuple):
    """Where one cycle of an order reads some samples (arrays, one entry
    per sample): in ``epoch``, at the global positions ``first``,
    ``first + period``, ``first + 2 * period`` ... below ``end`` (none when
    ``first >= end``). A cycle (a permutation pass) reads every sample in
    one epoch; the rank padding may read it more than once there."""
    epoch: np.ndarray
    first: np.ndarray
    period: np.ndarray
    end: np.ndarray


class SampleOrder(abc.ABC):
    """Sample ids of the global stream, by epoch and position.

    Attributes:
        epoch_size (int | None): Global positions of every epoch (padding
            included) when they are all equal; None for an endless stream
            (which is epoch 0) or epochs of different lengths (ask
            :meth:`epoch_length`).
        endless (bool): One endless stream (epoch 0), no epoch ends.
    """

    epoch_size: Optional[int] = None
    endless: bool = False

    @abc.abstractmethod
    def ids(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Sample ids at global ``positions`` of ``epoch`` (int64)."""

    def epoch_length(self, epoch: int) -> Optional[int]:
        """Global positions of ``epoch`` (padding included); None for an
        endless stream."""
        return None if self.endless else self.epoch_size

    def entering(self, epoch: int) -> Optional[np.ndarray]:
        """Sample ids first needed at ``epoch``'s start that the epoch
        before did not read (a growing window's arrivals); None for orders
        that read the same set every epoch."""
        return None

    def places(self, cycle: int, ids: np.ndarray) -> Optional[SamplePlaces]:
        """Where cycle ``cycle`` reads sample ``ids``; None for orders
        without an inverse (planners then look ahead)."""
        return None

    def cycle_of(self, epoch: np.ndarray, position: np.ndarray) -> np.ndarray:
        """The cycles holding global ``position`` of ``epoch`` (int
        arrays; orders with :meth:`places` only)."""
        raise NotImplementedError(f'{type(self).__name__} has no cycles')

    def cycle_start(self, cycle: int) -> Tuple[int, int]:
        """``(epoch, global position)`` where ``cycle`` starts (orders
        with :meth:`places` only)."""
        raise NotImplementedError(f'{type(self).__name__} has no cycles')


class RankShardedOrder(SampleOrder):
    """Order of ``RankShardedSampler``, ``RankShardedInfiniteSampler``,
    ``ShardWindowSampler`` and ``GrowingWindowSampler`` (epochs of
    different lengths, asked of the sampler's ``epoch_total_size``)."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler
        # GrowingWindowSampler says None (its epochs end, unequal).
        self.endless = bool(sampler.infinite)
        equal = getattr(sampler, 'equal_epochs', True)
        self.epoch_size = (None if self.endless or not equal else
                           sampler.total_size)

    def ids(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        if self.endless:
            return self.sampler.ids_at(positions)
        return self.sampler.ids_at(epoch, positions)

    def epoch_length(self, epoch: int) -> Optional[int]:
        if self.endless:
            return None
        if self.epoch_size is not None:
            return self.epoch_size
        return int(self.sampler.epoch_total_size(epoch))

    def entering(self, epoch: int) -> Optional[np.ndarray]:
        changes = getattr(self.sampler, 'window_changes', None)
        return None if changes is None else changes(epoch).entering

    def places(self, cycle: int, ids: np.ndarray) -> Optional[SamplePlaces]:
        if getattr(self.sampler, 'places', None) is None:
            return None
        return self.sampler.places(cycle, ids)

    def cycle_of(self, epoch: np.ndarray, position: np.ndarray) -> np.ndarray:
        return self.sampler.cycle_of(epoch, position)

    def cycle_start(self, cycle: int) -> Tuple[int, int]:
        return self.sampler.cycle_start(cycle)


class DefaultSamplerOrder(SampleOrder):
    """Order of mmengine's ``DefaultSampler`` (one epoch held at a time)."""

    def __init__(self, sampler, world_size: int) -> None:
        self.sampler = sampler
        self.world_size = world_size
        self.epoch_size = sampler.total_size
        self._epochs: Dict[int, np.ndarray] = {}

    def ids(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        order = self._epochs.get(epoch)
        if order is None:
            order = default_sampler_epoch(
                len(self.sampler.dataset), self.sampler.seed, epoch,
                self.sampler.shuffle, self.sampler.round_up,
                self.world_size).numpy()
            # The planner looks at most one epoch ahead.
            self._epochs = {e: o for e, o in self._epochs.items()
                            if e == epoch - 1}
            self._epochs[epoch] = order
        return order[np.asarray(positions, np.int64)]


class InfiniteSamplerOrder(SampleOrder):
    """Order of mmengine's ``InfiniteSampler``: consecutive passes."""

    endless = True

    def __init__(self, sampler) -> None:
        self.sampler = sampler
        self.size = len(sampler.dataset)
        self._passes: Optional[Iterator[torch.Tensor]] = None
        self._next_pass = 0
        self._held: Dict[int, np.ndarray] = {}

    def _pass(self, number: int) -> np.ndarray:
        if number not in self._held:
            if self._passes is None or number < self._next_pass:
                self._passes = infinite_sampler_passes(
                    self.size, self.sampler.seed, self.sampler.shuffle,
                    number)
                self._next_pass = number
            while self._next_pass <= number:
                order = next(self._passes).numpy()
                self._held = {p: o for p, o in self._held.items()
                              if p >= self._next_pass - 1}
                self._held[self._next_pass] = order
                self._next_pass += 1
        return self._held[number]

    def ids(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, np.int64)
        passes = positions // self.size
        ids = np.empty_like(positions)
        for number in np.unique(passes).tolist():
            inside = passes == number
            ids[inside] = self._pass(number)[positions[inside] -
                                             number * self.size]
        return ids


class UnplannableSampler(TypeError):
    """The sampler's future order cannot be computed by index arithmetic."""


def sample_order_of(batch_sampler, world_size: int) -> SampleOrder:
    """The :class:`SampleOrder` of a DataLoader's batch sampler.

    Args:
        batch_sampler: The DataLoader's batch sampler (a fast-resume
            loop's ``ResumableBatchSampler`` or torch's ``BatchSampler``).
        world_size (int): Ranks sharing the stream.

    Raises:
        UnplannableSampler: For samplers whose order is not index
            arithmetic (custom batch samplers, foreign samplers).
    """
    inner = getattr(batch_sampler, 'batch_sampler', batch_sampler)
    strategy = choose_strategy(inner)
    sampler = inner.sampler
    if strategy == 'fast_forward' and callable(getattr(sampler, 'ids_at',
                                                       None)):
        return RankShardedOrder(sampler)
    if strategy == 'default':
        return DefaultSamplerOrder(sampler, world_size)
    if strategy == 'infinite':
        return InfiniteSamplerOrder(sampler)
    raise UnplannableSampler(
        f'The remote cache planner cannot compute the future order of '
        f'{type(sampler).__name__} under {type(inner).__name__}: use '
        'RankShardedSampler, RankShardedInfiniteSampler, or mmengine\'s '
        'DefaultSampler / InfiniteSampler with a plain batch sampler.')
