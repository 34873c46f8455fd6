"""Samplers that split a global sample stream between ranks in O(1) memory.

The dataset stays global (``len(dataset) == N`` on every rank); these
samplers are the one place where ranks are split and epochs shuffled, so a
sample can never be sharded twice. Each epoch's order is a seeded Feistel
permutation (:class:`IndexPermutation`) evaluated block by block: no rank
ever holds a list of N indices, and starting an epoch costs O(1) in N.

The global stream and the rank split (shared by both samplers)::

    stream[p] = perm_e(p)                       (shuffle=False: p)
    rank r of W yields stream[G + r], stream[G + r + W], ...

with ``G`` the position set by :meth:`fast_forward` (0 otherwise). Ranks
take interleaved positions, like mmengine's samplers, so the stream does not
depend on ``W``: a run resumed with another world size continues it.
"""
import logging
import math
from typing import Callable, Iterator, Optional, Sized

import numpy as np
from mmengine.dataset import DefaultSampler, InfiniteSampler
from mmengine.dist import get_dist_info, sync_random_seed
from mmengine.logging import print_log
from mmengine.registry import DATA_SAMPLERS
from torch.utils.data import DataLoader, Sampler

from ..sample_order.global_order import SamplePlaces
from ..sample_order.index_permutation import IndexPermutation
from ..sample_order.sample_index import SampleIndex
from .rank_sharded_dataset import RankShardedDataset

# Positions mapped to ids per numpy call; bounds the transient memory of a
# rank (8 bytes each) and keeps the first index of an epoch fast.
_BLOCK = 8192


class _RankStream(Sampler):
    """What both samplers share: seed, rank split, fast-forward, shards."""

    def __init__(self,
                 dataset: Sized,
                 shuffle: bool = True,
                 seed: Optional[int] = None,
                 mini_epochs: int = 1,
                 rounds: int = 6) -> None:
        rank, world_size = get_dist_info()
        self.rank = rank
        self.world_size = world_size
        self.dataset = dataset
        self.size = len(dataset)
        self.shuffle = shuffle
        # Identical on all ranks, or the ranks would permute differently.
        self.seed = sync_random_seed() if seed is None else int(seed)
        if rounds < 4:
            raise ValueError(f'rounds must be >= 4 for a well-mixed '
                             f'permutation, got {rounds}')
        self.rounds = rounds
        if not isinstance(mini_epochs, int) or mini_epochs < 1:
            raise ValueError(
                f'mini_epochs must be a positive int, got {mini_epochs!r}')
        if self.size < mini_epochs:
            raise ValueError(
                f'The dataset has {self.size} samples, fewer than '
                f'mini_epochs={mini_epochs}; every mini-epoch needs one.')
        self.mini_epochs = mini_epochs
        self._start = 0
        # Materialising datasets (slow shared file systems) get each rank's
        # share written to a local file before the rank iterates over it.
        self._materialize = getattr(dataset, 'materialize_shards', False)
        _refuse_wrapped_shard_files(dataset)
        self._permutations = {}

    def fast_forward(self, global_offset: int) -> None:
        """Start the next ``__iter__`` (only) at ``global_offset``.

        Args:
            global_offset (int): A position of the global stream, counted in
                samples over all ranks: within the epoch chosen by the last
                ``set_epoch`` (epoch sampler) or since the start of the
                stream (infinite sampler).
        """
        if int(global_offset) < 0:
            raise ValueError(
                f'global_offset must be >= 0, got {global_offset}')
        self._start = int(global_offset)

    def _take_start(self) -> int:
        start, self._start = self._start, 0
        return start

    def _part_bounds(self, part: int):
        """``[lo, hi)`` of the permutation positions in mini-epoch ``part``."""
        return (part * self.size // self.mini_epochs,
                (part + 1) * self.size // self.mini_epochs)

    def _ids(self, perm_epoch: int, positions: np.ndarray) -> np.ndarray:
        """Sample ids at permutation ``positions`` of pass ``perm_epoch``."""
        if not self.shuffle:
            return positions
        return self._permutation(perm_epoch)(positions)

    def _offsets(self, perm_epoch: int, ids: np.ndarray) -> np.ndarray:
        """Permutation positions of sample ``ids`` in pass ``perm_epoch``
        (the inverse of :meth:`_ids`)."""
        ids = np.asarray(ids, np.int64)
        if not self.shuffle:
            return ids
        return self._permutation(perm_epoch).inverse(ids)

    def _permutation(self, perm_epoch: int) -> IndexPermutation:
        return self._of_pass(
            self._permutations, perm_epoch, lambda: IndexPermutation(
                self.size, self.seed, perm_epoch, self.rounds))

    def _of_pass(self, cache: dict, perm_epoch: int, build: Callable):
        """``build()``'s value for pass ``perm_epoch``, held in ``cache``
        with the pass before's only."""
        # Keyed by the seed too: a resume may re-apply a checkpoint's seed.
        key = (self.seed, perm_epoch)
        if key not in cache:
            # Two passes can be live at a pass boundary; keep just those.
            for old in [k for k in cache if k != (self.seed, perm_epoch - 1)]:
                del cache[old]
            cache[key] = build()
        return cache[key]

    def _yield_ids(self, count: int,
                   id_block: Callable[[int, int], np.ndarray]) -> Iterator:
        """Yield the ids of this rank's next ``count`` positions.

        ``id_block(a, b)`` maps the rank's positions ``a..b-1`` to ids; it is
        called block by block, so memory stays at one block -- except with a
        materialising dataset, which first gets the whole share written to a
        shard file (8 bytes per id) and each index tagged with that file.
        """
        blocks = ((k, min(k + _BLOCK, count)) for k in range(0, count, _BLOCK))
        if not self._materialize:
            for a, b in blocks:
                yield from id_block(a, b).tolist()
            return
        ids = np.empty(count, np.int64)
        for a, b in blocks:
            ids[a:b] = id_block(a, b)
        shard = self.dataset.write_shard(ids)
        for start in range(0, count, _BLOCK):
            for index in ids[start:start + _BLOCK].tolist():
                yield SampleIndex(index, shard=shard)


# Instead of a dataset wrapper around a shard-materialising dataset.
_WRAPPER_ALTERNATIVES = dict(
    RepeatDataset='multiply max_epochs/max_iters by `times` instead',
    ConcatDataset='concatenate the .jsonl files into one (`cat a.jsonl '
    'b.jsonl`; keep one metainfo line) instead')


def inner_datasets(dataset) -> Iterator:
    """The datasets under ``dataset``'s wrappers (``dataset`` first)."""
    yield dataset
    for inner in getattr(dataset, 'datasets', None) or (getattr(
            dataset, 'dataset', None), ):
        if inner is not None and inner is not dataset:
            yield from inner_datasets(inner)


def _refuse_wrapped_shard_files(dataset) -> None:
    if isinstance(dataset, RankShardedDataset):
        return
    for inner in inner_datasets(dataset):
        if getattr(inner, 'materialize_shards', False):
            name = type(dataset).__name__
            alternative = _WRAPPER_ALTERNATIVES.get(
                name, 'put the RankShardedDataset directly under the sampler')
            raise ValueError(
                f'A RankShardedDataset with materialize_shards=True inside '
                f'a {name}: the sampler deals out indices of the {name}, so '
                'it cannot write the shard files the dataset would read. '
                f'Set materialize_shards=False, or {alternative}.')


@DATA_SAMPLERS.register_module()
class RankShardedSampler(_RankStream):
    """Epoch sampler: every sample once per epoch over all ranks, O(1) memory.

    A drop-in for mmengine's ``DefaultSampler`` (same rank split, same
    padding, same order with ``shuffle=False``), built for 1e7-1e9 samples:
    the epoch's permutation is computed block by block, never stored.

    Epoch ``e`` is mini-epoch ``e % mini_epochs`` of permutation pass
    ``e // mini_epochs``: a pass is cut into ``mini_epochs`` contiguous
    parts of its permutation, so the mini-epochs of a pass together are one
    exact epoch, while the DataLoader (and its persistent workers) stays.

    Padding: every rank yields ``ceil(ceil(N / M) / W)`` samples per
    (mini-)epoch; the shortfall of a part is filled by wrapping around to the
    start of that part, like ``DistributedSampler`` (at most ``W - 1``
    repeats per epoch with ``M = 1``, at most ``W`` per mini-epoch).
    ``round_up=False`` drops instead: ``floor(floor(N / M) / W)`` per rank.

    Args:
        dataset (Sized): The dataset (global: the same on all ranks).
        shuffle (bool): Shuffle each pass. Default: True.
        seed (int, optional): Seed of the permutations; the same on all
            ranks. ``None`` draws one and broadcasts it from rank 0.
        mini_epochs (int): Parts per pass. Default: 1.
        round_up (bool): Pad to equal per-rank counts (True) or drop the
            remainder (False). Default: True.
        rounds (int): Feistel rounds of the permutation (>= 4). Default: 6.
    """

    #: Fast-resume protocol: each (mini-)epoch ends; the position of a
    #: stock checkpoint is ``divmod(iteration, len(dataloader))``.
    infinite = False
    #: Every epoch has ``total_size`` positions (see
    #: :meth:`epoch_total_size`).
    equal_epochs = True
    #: Fast-resume protocol: with the seed and the dataset size, what
    #: defines the stream; a resume with other values is refused.
    stream_defining_attrs = ('shuffle', 'mini_epochs', 'round_up', 'rounds')

    def __init__(self,
                 dataset: Sized,
                 shuffle: bool = True,
                 seed: Optional[int] = None,
                 mini_epochs: int = 1,
                 round_up: bool = True,
                 rounds: int = 6) -> None:
        super().__init__(dataset, shuffle, seed, mini_epochs, rounds)
        self.round_up = round_up
        self.epoch = 0
        self._size_epoch(
            math.ceil(self.size / mini_epochs) if round_up else self.size //
            mini_epochs)

    def _padded_sizes(self, length: int) -> tuple:
        """``(per-rank count, padded global total)`` of an epoch of
        ``length`` positions: the one definition of the rank padding."""
        if self.round_up:
            per_rank = math.ceil(length / self.world_size)
        else:
            per_rank = length // self.world_size
        return per_rank, per_rank * self.world_size

    def _size_epoch(self, length: int) -> None:
        """Per-rank and padded counts of an epoch of ``length`` positions."""
        self.num_samples, self.total_size = self._padded_sizes(length)

    def set_epoch(self, epoch: int) -> None:
        """Choose the (mini-)epoch the next iteration yields."""
        self.epoch = epoch

    def epoch_total_size(self, epoch: int) -> int:
        """Global positions of (mini-)epoch ``epoch``, padding included
        (``total_size`` once ``set_epoch(epoch)``; the same for every
        epoch here). Cache planners ask it for epochs ahead."""
        return self.total_size

    def __len__(self) -> int:
        """Samples per rank in a full (mini-)epoch."""
        return self.num_samples

    def ids_at(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Sample ids at global ``positions`` of (mini-)epoch ``epoch``.

        The one definition of an epoch's order: ``__iter__`` maps its
        rank's positions through it, and cache planners ask it for the
        future positions of any rank.

        Args:
            epoch (int): The (mini-)epoch, as given to ``set_epoch``.
            positions (np.ndarray): Global positions in
                ``[0, total_size)``.
        """
        perm_epoch, part = divmod(epoch, self.mini_epochs)
        lo, hi = self._part_bounds(part)
        return self._ids(perm_epoch,
                         lo + np.asarray(positions, np.int64) % (hi - lo))

    def cycle_of(self, epoch: np.ndarray, position: np.ndarray) -> np.ndarray:
        """The permutation passes that (mini-)epochs ``epoch`` read."""
        return epoch // self.mini_epochs

    def cycle_start(self, cycle: int) -> tuple:
        """``(epoch, global position)`` where pass ``cycle`` starts."""
        return cycle * self.mini_epochs, 0

    def places(self, cycle: int, ids: np.ndarray) -> SamplePlaces:
        """Where pass ``cycle`` reads sample ``ids``: the inverse of
        :meth:`ids_at`, so cache planners know every future read of a
        sample without looking ahead. A pass reads a sample in one
        (mini-)epoch, at the part's offset and, with the rank padding, again
        every part length up to ``total_size``."""
        offsets = self._offsets(cycle, ids)
        part = ((offsets + 1) * self.mini_epochs - 1) // self.size
        lo = part * self.size // self.mini_epochs
        period = (part + 1) * self.size // self.mini_epochs - lo
        return SamplePlaces(cycle * self.mini_epochs + part, offsets - lo,
                            period, np.full_like(offsets, self.total_size))

    def __iter__(self) -> Iterator[int]:
        start = self._take_start()
        epoch = self.epoch
        count = max(0, -(-(self.total_size - start) // self.world_size))
        first = start + self.rank
        yield from self._yield_ids(
            count, lambda a, b: self.ids_at(
                epoch, first + self.world_size * np.arange(a, b)))


@DATA_SAMPLERS.register_module()
class RankShardedInfiniteSampler(_RankStream):
    """Endless sampler for iteration-based training, O(1) memory.

    A drop-in for mmengine's ``InfiniteSampler``: the stream is pass 0's
    permutation of all N samples, then pass 1's, and so on (each pass a fresh
    permutation; ``shuffle=False``: 0..N-1 repeated); rank r of W takes
    positions ``r, r + W, ...``. ``set_epoch`` is accepted and ignored, like
    mmengine's. ``mini_epochs`` does not change the stream; with a
    materialising dataset it is how many shard files each pass is split
    into.

    Args:
        dataset (Sized): The dataset (global: the same on all ranks).
        shuffle (bool): Shuffle each pass. Default: True.
        seed (int, optional): Seed of the permutations; the same on all
            ranks. ``None`` draws one and broadcasts it from rank 0.
        mini_epochs (int): Shard files per pass (materialising datasets).
            Default: 1.
        rounds (int): Feistel rounds of the permutation (>= 4). Default: 6.
    """

    #: Fast-resume protocol: one endless stream; the position of a stock
    #: checkpoint is ``iteration * batch_size * world_size``.
    infinite = True
    #: Fast-resume protocol (``mini_epochs`` only sizes shard files).
    stream_defining_attrs = ('shuffle', 'rounds')

    def set_epoch(self, epoch: int) -> None:
        """Ignored: the infinite stream has no epochs."""

    def __len__(self) -> int:
        """N, like mmengine's ``InfiniteSampler``."""
        return self.size

    def ids_at(self, positions: np.ndarray) -> np.ndarray:
        """Sample ids at global ``positions`` of the endless stream.

        The one definition of the stream's order (see
        :meth:`RankShardedSampler.ids_at`); positions may span passes.
        """
        positions = np.asarray(positions, np.int64)
        passes = positions // self.size
        first, last = int(passes.min(initial=0)), int(passes.max(initial=0))
        if first == last:
            return self._ids(first, positions - first * self.size)
        ids = np.empty_like(positions)
        for perm_epoch in range(first, last + 1):
            inside = passes == perm_epoch
            ids[inside] = self._ids(perm_epoch,
                                    positions[inside] - perm_epoch * self.size)
        return ids

    def cycle_of(self, epoch: np.ndarray, position: np.ndarray) -> np.ndarray:
        """The permutation passes holding global ``position``."""
        return position // self.size

    def cycle_start(self, cycle: int) -> tuple:
        """``(epoch 0, global position)`` where pass ``cycle`` starts."""
        return 0, cycle * self.size

    def places(self, cycle: int, ids: np.ndarray) -> SamplePlaces:
        """Where pass ``cycle`` reads sample ``ids`` (once each): the
        inverse of :meth:`ids_at` (see :meth:`RankShardedSampler.places`)."""
        first = cycle * self.size + self._offsets(cycle, ids)
        return SamplePlaces(np.zeros_like(first), first,
                            np.full_like(first, self.size),
                            np.full_like(first, (cycle + 1) * self.size))

    def __iter__(self) -> Iterator[int]:
        position = self._take_start() + self.rank
        while True:
            perm_epoch, offset = divmod(position, self.size)
            part = offset * self.mini_epochs // self.size
            while self._part_bounds(part)[1] <= offset:
                part += 1
            _, hi = self._part_bounds(part)
            count = -(-(perm_epoch * self.size + hi - position) //
                      self.world_size)
            first = position
            yield from self._yield_ids(
                count, lambda a, b: self.ids_at(
                    first + self.world_size * np.arange(a, b)))
            position += count * self.world_size


# mmengine's samplers that hold O(N) index lists, and ours for the same job.
_STOCK_SAMPLER_REPLACEMENTS = ((InfiniteSampler, 'RankShardedInfiniteSampler'),
                               (DefaultSampler, 'RankShardedSampler'))


def stock_sampler_advice(dataloader: DataLoader) -> Optional[str]:
    """Warn when a ``RankShardedDataset`` is read through a stock sampler.

    The pairing is correct (the dataset is global, so the stock sampler
    shards it once), but mmengine's ``DefaultSampler`` and
    ``InfiniteSampler`` build a Python list of N indices per rank per epoch
    (~36 bytes a sample: 36 GB per rank at 1e9 lines), which is what the
    dataset exists to avoid. mmengine builds the sampler after the dataset
    and tells it nothing, so whoever holds the built DataLoader (the
    fast-resume loops) calls this.

    Args:
        dataloader (DataLoader): The built loader.

    Returns:
        str | None: The warning logged, None when the pairing is fine.
    """
    dataset = next((inner for inner in inner_datasets(dataloader.dataset)
                    if isinstance(inner, RankShardedDataset)), None)
    if dataset is None:
        return None
    batch_sampler = getattr(dataloader, 'batch_sampler', None)
    sampler = getattr(batch_sampler, 'sampler', None) or dataloader.sampler
    for stock, ours in _STOCK_SAMPLER_REPLACEMENTS:
        if isinstance(sampler, stock):
            message = (
                f'RankShardedDataset ({len(dataset)} samples) is read through '
                f"mmengine's {type(sampler).__name__}: correct, but it builds "
                'a list of every index on each rank each epoch. Set '
                f"train_dataloader.sampler=dict(type='{ours}', ...) to keep "
                'the index arithmetic O(1) in memory.')
            print_log(message, logger='current', level=logging.WARNING)
            return message
    return None
