"""An epoch sampler that shuffles packed data a few shards at a time.

A global shuffle of samples packed in shards (tar, chunk files) reads a
different shard at almost every sample. LitData's chunk shuffle and
MosaicML Streaming's block shuffles (``py1b``/``py1e``) trade some shuffle
quality for locality; this is that order for our samplers::

    slot order   shards permuted by perm(seed, epoch)
    windows      slots 0..k-1, k..2k-1, ... (k = window_shards)
    stream[p]    the samples of p's window, permuted by
                 perm(mix(seed, epoch), window)

Ranks split ``stream`` exactly as :class:`RankShardedSampler` does, so a
resume with another world size continues it. Memory is O(shards): per
epoch the slot order and its prefix sums, never an array per sample.
"""
from typing import NamedTuple, Optional, Sized

import numpy as np
from mmengine.registry import DATA_SAMPLERS

from ..sample_order.index_permutation import IndexPermutation, permute_each
from ..utils.seeding import mix_seed
from .rank_sharded_sampler import RankShardedSampler


class _EpochLayout(NamedTuple):
    """Where the shards lie in one epoch's stream (O(shards) arrays)."""
    shard_order: IndexPermutation
    shard_of_slot: np.ndarray
    slot_starts: np.ndarray
    window_starts: np.ndarray


@DATA_SAMPLERS.register_module()
class ShardWindowSampler(RankShardedSampler):
    """Epoch sampler that reads a window of a few shards at a time.

    Each epoch visits the shards in a seeded order; ``window_shards``
    consecutive shards of that order form a window, and the samples of a
    window are shuffled among themselves. A node therefore needs about
    ``window_shards`` shards at a time instead of all of them, at the cost
    of batches drawn from those shards only. Every sample is read once
    per epoch; the rank split, the padding and ``shuffle=False`` (the
    natural order) are :class:`RankShardedSampler`'s.

    The dataset tells the shards: ``dataset.shard_sizes()`` gives the
    samples of each shard, in the order of the dataset's indices
    (:class:`TarShardDataset` has it).

    Args:
        dataset (Sized): The dataset (global: the same on all ranks), with
            a ``shard_sizes()`` method.
        shuffle (bool): Shuffle the shards and each window. Default: True.
        seed (int, optional): Seed of the order; the same on all ranks.
            ``None`` draws one and broadcasts it from rank 0.
        window_shards (int): Shards shuffled together. More shards mix
            better and need more of them at once. Default: 4.
        round_up (bool): Pad to equal per-rank counts (True) or drop the
            remainder (False). Default: True.
        rounds (int): Feistel rounds of the permutations (>= 4). Default: 6.
    """

    #: Fast-resume protocol: with the seed and the dataset size, what
    #: defines the stream; a resume with other values is refused.
    stream_defining_attrs = ('shuffle', 'round_up', 'rounds', 'window_shards')

    def __init__(self,
                 dataset: Sized,
                 shuffle: bool = True,
                 seed: Optional[int] = None,
                 window_shards: int = 4,
                 round_up: bool = True,
                 rounds: int = 6) -> None:
        if not isinstance(window_shards, int) or window_shards < 1:
            raise ValueError(f'window_shards must be a positive int, got '
                             f'{window_shards!r}')
        super().__init__(dataset, shuffle, seed, 1, round_up, rounds)
        self.window_shards = window_shards
        sizes = getattr(dataset, 'shard_sizes', None)
        if sizes is None:
            raise TypeError(
                f'ShardWindowSampler needs a dataset that knows its shards '
                f'(a shard_sizes() method, as TarShardDataset has); '
                f'{type(dataset).__name__} has none.')
        sizes = np.asarray(sizes(), np.int64)
        if sizes.ndim != 1 or (sizes < 0).any() or sizes.sum() != self.size:
            raise ValueError(
                f'{type(dataset).__name__}.shard_sizes() gives '
                f'{int(sizes.sum())} samples in {sizes.size} shards, '
                f'but the dataset has {self.size}.')
        self.num_shards = sizes.size
        self._shard_starts = np.concatenate(([0], np.cumsum(sizes)))
        self._layouts = {}

    def _layout(self, perm_epoch: int) -> _EpochLayout:
        return self._of_pass(self._layouts, perm_epoch,
                             lambda: self._build_layout(perm_epoch))

    def _build_layout(self, perm_epoch: int) -> _EpochLayout:
        shard_order = IndexPermutation(self.num_shards, self.seed,
                                       perm_epoch, self.rounds)
        shard_of_slot = shard_order(np.arange(self.num_shards))
        slot_starts = np.concatenate(
            ([0], np.cumsum(np.diff(self._shard_starts)[shard_of_slot])))
        window_starts = slot_starts[np.append(
            np.arange(0, self.num_shards, self.window_shards),
            self.num_shards)]
        return _EpochLayout(shard_order, shard_of_slot, slot_starts,
                            window_starts)

    def _in_windows(self, perm_epoch: int, layout: _EpochLayout,
                    windows: np.ndarray, offsets: np.ndarray,
                    inverse: bool) -> np.ndarray:
        """Each window's permutation (its inverse) of the ``offsets`` in
        it, all windows in one pass."""
        lengths = (layout.window_starts[windows + 1] -
                   layout.window_starts[windows])
        return permute_each(offsets, lengths,
                            mix_seed(self.seed, perm_epoch), windows,
                            self.rounds, inverse)

    def _ids(self, perm_epoch: int, positions: np.ndarray) -> np.ndarray:
        """Sample ids at ``positions`` of pass ``perm_epoch``."""
        positions = np.asarray(positions, np.int64)
        if not self.shuffle:
            return positions
        layout = self._layout(perm_epoch)
        windows = np.searchsorted(layout.window_starts, positions, 'right') - 1
        starts = layout.window_starts[windows]
        # `drawn`: the position, in slot order, of the sample read there.
        drawn = starts + self._in_windows(perm_epoch, layout, windows,
                                          positions - starts, False)
        slots = np.searchsorted(layout.slot_starts, drawn, 'right') - 1
        shards = layout.shard_of_slot[slots]
        return self._shard_starts[shards] + drawn - layout.slot_starts[slots]

    def _offsets(self, perm_epoch: int, ids: np.ndarray) -> np.ndarray:
        """Positions of sample ``ids`` in pass ``perm_epoch`` (the inverse
        of :meth:`_ids`)."""
        ids = np.asarray(ids, np.int64)
        if not self.shuffle:
            return ids
        layout = self._layout(perm_epoch)
        shards = np.searchsorted(self._shard_starts, ids, 'right') - 1
        slots = layout.shard_order.inverse(shards)
        drawn = layout.slot_starts[slots] + ids - self._shard_starts[shards]
        windows = slots // self.window_shards
        starts = layout.window_starts[windows]
        return starts + self._in_windows(perm_epoch, layout, windows,
                                         drawn - starts, True)
