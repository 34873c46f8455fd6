"""An epoch sampler over a local set that grows every epoch, then slides."""
from typing import Optional, Sized, Union

import numpy as np
from mmengine.registry import DATA_SAMPLERS

from ..cache.size_units import parse_size
from ..sample_order.global_order import SamplePlaces
from ..sample_order.growing_window import GrowingWindow, WindowChanges
from .rank_sharded_sampler import RankShardedSampler


def window_capacity(size: int,
                    growth: int,
                    capacity: Optional[int] = None,
                    cache_limit: Union[int, str, None] = None,
                    sample_bytes: Union[int, str, None] = None) -> int:
    """The window's capacity in samples, from samples or from bytes.

    A cache of ``cache_limit`` bytes must hold the window an epoch trains on
    *and* the ``growth`` samples fetched meanwhile for the next epoch, so
    the window gets ``cache_limit // sample_bytes - growth`` samples.

    Args:
        size (int): Samples in the dataset (the default capacity).
        growth (int): Samples fetched per epoch.
        capacity (int, optional): Capacity in samples.
        cache_limit (int | str, optional): Local cache budget (``'200GB'``);
            needs ``sample_bytes``.
        sample_bytes (int | str, optional): Mean bytes per sample.
    """
    if capacity is not None and cache_limit is not None:
        raise ValueError(
            'GrowingWindowSampler: set capacity (samples) or cache_limit '
            '(bytes, with sample_bytes), not both')
    if cache_limit is None:
        if sample_bytes is not None:
            raise ValueError('GrowingWindowSampler: sample_bytes is only '
                             'used with cache_limit')
        return size if capacity is None else capacity
    if sample_bytes is None:
        raise ValueError(
            'GrowingWindowSampler: cache_limit needs sample_bytes (the mean '
            'size of a sample) to say how many samples fit')
    limit = parse_size(cache_limit, 'cache_limit')
    mean = parse_size(sample_bytes, 'sample_bytes')
    if mean < 1:
        raise ValueError(f'GrowingWindowSampler: sample_bytes must be at '
                         f'least 1 byte, got {sample_bytes!r}')
    fits = limit // mean
    if fits <= growth:
        raise ValueError(
            f'GrowingWindowSampler: cache_limit={cache_limit!r} holds {fits} '
            f'samples of sample_bytes={sample_bytes!r}, not more than '
            f'growth={growth}: no room for a window next to the samples '
            'fetched for the next epoch')
    return fits - growth


@DATA_SAMPLERS.register_module()
class GrowingWindowSampler(RankShardedSampler):
    """Each epoch trains on a window of a seeded order that grows, then slides.

    For data that does not fit on local disk and arrives from a remote while
    training runs: epoch 0 trains on the first ``initial`` samples of a
    seeded arrival order, each later epoch on ``growth`` more (what the
    remote delivers while an epoch trains), until the window holds
    ``capacity`` samples (the cache); from then on it slides, the oldest
    ``growth`` samples leaving as new ones enter (see
    :class:`GrowingWindow`). Within an epoch the window is shuffled and
    split between ranks exactly like :class:`RankShardedSampler` (every
    sample once over all ranks, padded to equal per-rank counts).

    The stream is a pure function of (seed, epoch, position), so the
    fast-resume loops position it in O(1), also after a world-size change;
    ``len(sampler)`` follows the epoch set by ``set_epoch``. Which samples
    enter and leave the window at an epoch start is
    :meth:`window_changes`, for prefetchers that fetch the next epoch's
    samples while the current one trains.

    Args:
        dataset (Sized): The dataset (global: the same on all ranks).
        initial (int): Samples in epoch 0's window.
        growth (int): Samples added to the window per epoch.
        capacity (int, optional): Most samples the window holds. None
            (and no ``cache_limit``): the whole dataset.
        cache_limit (int | str, optional): The local cache budget in bytes
            (``'200GB'``), instead of ``capacity``; the capacity is then
            ``cache_limit // sample_bytes - growth`` (the next epoch's
            samples are fetched while the window is still in use).
        sample_bytes (int | str, optional): Mean bytes per sample (with
            ``cache_limit``).
        shuffle (bool): Shuffle the arrival order and each epoch's window.
            Default: True.
        seed (int, optional): Seed of the order; the same on all ranks.
            ``None`` draws one and broadcasts it from rank 0.
        round_up (bool): Pad to equal per-rank counts (True) or drop the
            remainder (False). Default: True.
        rounds (int): Feistel rounds of the permutations (>= 4). Default: 6.
    """

    #: Fast-resume protocol: epochs end, but their lengths differ, so a
    #: stock checkpoint (``meta.iter`` only) cannot be placed by
    #: ``divmod(iter, len(dataloader))``: None makes it replay indices.
    infinite = None
    #: Epoch lengths follow the window (:meth:`epoch_total_size`).
    equal_epochs = False
    #: Fast-resume protocol: with the seed and the dataset size, what
    #: defines the stream (``cache_limit`` counts through ``capacity``).
    stream_defining_attrs = ('shuffle', 'round_up', 'rounds', 'initial',
                             'growth', 'capacity')

    def __init__(self,
                 dataset: Sized,
                 initial: int,
                 growth: int,
                 capacity: Optional[int] = None,
                 cache_limit: Union[int, str, None] = None,
                 sample_bytes: Union[int, str, None] = None,
                 shuffle: bool = True,
                 seed: Optional[int] = None,
                 round_up: bool = True,
                 rounds: int = 6) -> None:
        super().__init__(dataset, shuffle, seed, 1, round_up, rounds)
        schedule = GrowingWindow(
            self.size, initial, growth,
            window_capacity(self.size, growth, capacity, cache_limit,
                            sample_bytes),
            self.seed, shuffle, rounds)
        self.initial = schedule.initial
        self.growth = schedule.growth
        self.capacity = schedule.capacity
        self._window = schedule
        self.set_epoch(0)

    @property
    def window(self) -> GrowingWindow:
        """The window schedule under the current seed (a resume may restore
        a checkpoint's seed after the sampler was built)."""
        if self._window.seed != self.seed:
            self._window = GrowingWindow(self.size, self.initial, self.growth,
                                         self.capacity, self.seed,
                                         self.shuffle, self.rounds)
        return self._window

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration yields (and ``len``)."""
        self.epoch = epoch
        self._size_epoch(self.window.window_size(epoch))

    def epoch_total_size(self, epoch: int) -> int:
        """Global positions of ``epoch`` (its window, padded for the ranks):
        what ``total_size`` is once ``set_epoch(epoch)``, for any epoch
        (cache planners ask it for the epochs ahead)."""
        return self._padded_sizes(self.window.window_size(epoch))[1]

    def window_ids(self, epoch: int) -> np.ndarray:
        """Every sample id of ``epoch``'s window, oldest arrival first."""
        return self.window.window_ids(epoch)

    def window_changes(self, epoch: int) -> WindowChanges:
        """Ids entering and leaving the window when ``epoch`` starts."""
        return self.window.changes(epoch)

    def ids_at(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Sample ids at global ``positions`` of ``epoch``'s window pass
        (positions past its end, the rank padding, wrap around)."""
        return self.window.ids(
            epoch,
            np.asarray(positions, np.int64) % self.window.window_size(epoch))

    def cycle_of(self, epoch: np.ndarray, position: np.ndarray) -> np.ndarray:
        """Each epoch shuffles its own window: a cycle is an epoch."""
        return epoch

    def cycle_start(self, cycle: int) -> tuple:
        """``(epoch, global position)`` where cycle ``cycle`` starts."""
        return cycle, 0

    def places(self, cycle: int, ids: np.ndarray) -> SamplePlaces:
        """Where epoch ``cycle`` reads sample ``ids`` (the inverse of
        :meth:`ids_at`): nowhere outside its window; inside, at the
        window's position and, with the rank padding, again every window
        length up to the epoch's total size."""
        length = self.window.window_size(cycle)
        end = np.full(len(ids), self.epoch_total_size(cycle), np.int64)
        first = self.window.positions_of(cycle, ids)
        return SamplePlaces(np.full_like(end, cycle),
                            np.where(first < length, first, end),
                            np.full_like(end, length), end)
