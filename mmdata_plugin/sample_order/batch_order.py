"""The batches a DataLoader's batch sampler yields, from any position.

Every supported sampler -- mmengine's ``DefaultSampler`` and
``InfiniteSampler`` (index arithmetic), samplers with ``fast_forward()``
(ours), any other sampler or a custom batch sampler (index-only replay) --
is answered here: which batches of which dataset indices come at a position,
the per-sample seed of each index, whether the stream ends, and where the
stream stands after a number of batches.
"""
import itertools
import logging
from typing import (Callable, Iterable, Iterator, List, Optional, Sized,
                    Tuple)

from mmengine.dataset import DefaultSampler, InfiniteSampler
from mmengine.dist import get_dist_info
from mmengine.logging import print_log
from torch.utils.data import (BatchSampler, DistributedSampler, RandomSampler,
                              SequentialSampler, SubsetRandomSampler,
                              WeightedRandomSampler)

from ..utils.seeding import (global_rng_states, mix_seed,
                             preserved_global_rngs, same_global_rng_states,
                             seed_global_rngs)
from .data_position import DataPositionError
from .index_streams import default_sampler_stream, infinite_sampler_stream
from .sample_index import SampleIndex, with_fields

# Label of the global RNG state a foreign sampler starts each pass under.
# Sample seeds start with an epoch (>= 0) and the loops' per-iteration seeds
# with -1, so the families never meet.
_SAMPLER_PASS_STREAM = -2

# torch's samplers end each pass after len(sampler) indices; they cannot
# declare `infinite = False` themselves.
_PER_EPOCH_TORCH_SAMPLERS = (DistributedSampler, RandomSampler,
                             SequentialSampler, SubsetRandomSampler,
                             WeightedRandomSampler)

#: How each strategy positions the stream, for log lines.
STRATEGY_DESCRIPTIONS = dict(
    infinite='index arithmetic on InfiniteSampler',
    default='index arithmetic on DefaultSampler',
    fast_forward='the sampler\'s fast_forward()',
    sampler_replay='index-only replay of the sampler',
    batch_replay='index-only replay of the batch sampler',
    stream_replay='index-only replay of the stream from its start (the '
    'checkpoint has no data position and the sampler does not say whether '
    'it is infinite)',
    load_and_drop='loading and dropping batches (stock behaviour)')


def _overrides_none_of(obj, base: type, methods: Tuple[str, ...]) -> bool:
    return isinstance(obj, base) and all(
        getattr(type(obj), name) is getattr(base, name) for name in methods)


def choose_strategy(batch_sampler) -> str:
    """How a batch sampler's stream can be positioned without loading data.

    * ``batch_replay``: a custom batch sampler (e.g. aspect-ratio buckets)
      does not take a fixed number of indices per batch; its batches are
      replayed, indices only.
    * ``fast_forward``: the sampler implements the fast-forward protocol.
    * ``infinite`` / ``default``: mmengine's samplers (or subclasses that
      keep their index generation), positioned by arithmetic.
    * ``sampler_replay``: any other sampler; its indices are replayed.
    """
    if type(batch_sampler).__iter__ is not BatchSampler.__iter__:
        return 'batch_replay'
    sampler = batch_sampler.sampler
    if callable(getattr(sampler, 'fast_forward', None)):
        return 'fast_forward'
    if _overrides_none_of(sampler, InfiniteSampler,
                          ('__iter__', '_infinite_indices',
                           '_indices_of_rank')):
        return 'infinite'
    if _overrides_none_of(sampler, DefaultSampler, ('__iter__', )):
        return 'default'
    return 'sampler_replay'


def batch_count(positions: int, batch_size: int, drop_last: bool) -> int:
    """Batches torch's ``BatchSampler`` makes of a pass of ``positions``
    indices: ``ceil`` (``floor`` with ``drop_last``) of their ratio."""
    if drop_last:
        return positions // batch_size
    return -(-positions // batch_size)


def batches_into_epoch(
        iteration: int,
        epoch: int,
        loader: Sized,
        batches_of_epoch: Optional[Callable[[int], Optional[int]]] = None
) -> int:
    """Batches done in ``epoch`` after ``iteration`` batches of an
    epoch-based loop.

    Args:
        iteration (int): Batches taken in all.
        epoch (int): The epoch the loop is in.
        loader: What gives the batches per epoch as ``len(loader)`` (a
            DataLoader or a batch sampler); without a length the epoch
            restarts from its first batch (stock behaviour, warned).
        batches_of_epoch (callable, optional): The batches of each epoch
            when epochs differ in length (:meth:`BatchOrder.batches_of_epoch`).
    """
    try:
        per_epoch = len(loader)
    except TypeError:
        print_log(
            'Fast resume: the train dataloader has no length, so the '
            'position within the epoch is unknown; the epoch restarts '
            'from its first batch (stock behaviour).',
            logger='current',
            level=logging.WARNING)
        return 0
    earlier = epoch * per_epoch
    this_epoch = None if batches_of_epoch is None else batches_of_epoch(epoch)
    if this_epoch is not None:
        # Epochs of different lengths (a growing window).
        earlier = sum(map(batches_of_epoch, range(epoch)))
        per_epoch = this_epoch
    batches = iteration - earlier
    if not 0 <= batches <= per_epoch:
        raise DataPositionError(
            f'The checkpoint says iteration {iteration} in epoch {epoch}, '
            f'which does not fit the {per_epoch} batches per epoch of '
            'this train_dataloader.')
    return batches


class BatchOrder:
    """The stream of a batch sampler's batches, started anywhere.

    It yields the batches the batch sampler would yield, from any position,
    and every index is a :class:`SampleIndex` whose ``seed`` depends only on
    the sample's place in the stream.

    Args:
        batch_sampler: The DataLoader's batch sampler.
        seed (int): Seed for the per-sample seeds when the sampler has no
            ``seed`` attribute of its own.
        seed_samples (bool): Tag indices with per-sample seeds.
    """

    def __init__(self,
                 batch_sampler,
                 seed: int,
                 seed_samples: bool = True) -> None:
        self.batch_sampler = batch_sampler
        self.strategy = choose_strategy(batch_sampler)
        self.seed_samples = seed_samples
        sampler = getattr(batch_sampler, 'sampler', None)
        self.sampler = sampler
        self.seed = getattr(sampler, 'seed', None)
        if self.seed is None:
            self.seed = seed
        rank, world_size = get_dist_info()
        self.rank = getattr(sampler, 'rank', rank)
        self.world_size = getattr(sampler, 'world_size', world_size)
        self._infinite_next = 0
        self._warned_rng_draws = False

    @property
    def samples_per_batch(self) -> Optional[int]:
        """Global samples per batch (``batch_size * world_size``); None
        for a custom batch sampler, whose batches have no fixed size."""
        if self.strategy == 'batch_replay':
            return None
        return self.batch_sampler.batch_size * self.world_size

    @property
    def infinite(self) -> Optional[bool]:
        """Whether the sampler's stream never ends; None when unknown.

        mmengine's samplers are known; others tell with an ``infinite``
        attribute (part of the fast-forward protocol), torch's own samplers
        end every pass. Custom batch samplers are never trusted with it: how
        many batches their pass has is only known by running it.
        """
        if self.strategy == 'infinite':
            return True
        if self.strategy == 'default':
            return False
        if self.strategy == 'batch_replay':
            return None
        declared = getattr(self.sampler, 'infinite', None)
        if declared is not None:
            return bool(declared)
        if isinstance(self.sampler, _PER_EPOCH_TORCH_SAMPLERS):
            return False
        return None

    def batches_of_epoch(self, epoch: int) -> Optional[int]:
        """This rank's batches in ``epoch`` for a sampler whose epochs
        differ in length (``equal_epochs = False``, sized by
        ``epoch_total_size``); None when every epoch is
        ``len(batch_sampler)``."""
        sizes = getattr(self.sampler, 'epoch_total_size', None)
        if getattr(self.sampler, 'equal_epochs', True) or sizes is None:
            return None
        return batch_count(
            int(sizes(epoch)) // self.world_size,
            self.batch_sampler.batch_size,
            bool(getattr(self.batch_sampler, 'drop_last', False)))

    def position_after(self, iteration: int,
                       epoch: Optional[int]) -> Optional[Tuple[int, int]]:
        """``(epoch, batches done in it)`` once mmengine's loops have taken
        ``iteration`` batches from the stream's start.

        Args:
            iteration (int): Batches taken in all.
            epoch (int, optional): The epoch an epoch-based loop is in; None
                for an iteration-based loop, whose infinite iterator starts
                the next epoch after ``len(batch_sampler)`` batches.

        Returns:
            tuple | None: None when the sampler does not say whether its
            stream ends: only :meth:`skip` can then find the position.
        """
        if epoch is not None:
            return epoch, batches_into_epoch(iteration, epoch,
                                             self.batch_sampler,
                                             self.batches_of_epoch)
        if self.infinite:
            return 0, iteration
        if self.infinite is False:
            return divmod(iteration, len(self.batch_sampler))
        return None

    def set_seed(self, seed: int) -> None:
        """Use ``seed`` for the sampler's order and the per-sample seeds."""
        self.seed = seed
        if self.sampler is not None and hasattr(self.sampler, 'seed'):
            self.sampler.seed = seed

    def skip(self, num_batches: int,
             epoch: int) -> Tuple[int, int, Iterator[list]]:
        """Replay ``num_batches`` batches from the start of ``epoch``.

        Epochs wrap as in mmengine's infinite iterator (``set_epoch`` of the
        next epoch). Only indices are generated.

        Returns:
            tuple: The epoch reached, the batches done in it, and the
            batches that follow.
        """
        done = 0
        while True:
            batches = self.batches(epoch, 0, 0)
            skipped = sum(1 for _ in itertools.islice(batches,
                                                      num_batches - done))
            done += skipped
            if done == num_batches:
                return epoch, skipped, batches
            if skipped == 0:
                raise RuntimeError(
                    f'{type(self.batch_sampler).__name__} yields no batch in '
                    f'epoch {epoch}; cannot replay {num_batches} batches.')
            epoch += 1

    def _set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, 'set_epoch'):
            self.sampler.set_epoch(epoch)

    def batches(self, epoch: int, samples: int,
                batches: int) -> Iterator[list]:
        """The batches of epoch ``epoch`` from a position in it.

        Sample-level strategies start at global sample ``samples``; replay
        strategies skip ``batches`` of this rank's batches (index generation
        only). An infinite sampler asked for ``(0, 0)`` continues where its
        last pass stopped, as ``InfiniteSampler``'s shared generator does.
        """
        if self.strategy == 'batch_replay':
            return self._replayed_batches(epoch, batches)
        if self.strategy == 'infinite':
            if samples == 0 and batches == 0:
                samples = self._infinite_next
            pairs = self._track_infinite(
                infinite_sampler_stream(
                    len(self.sampler), self.seed, self.sampler.shuffle,
                    samples, self.rank, self.world_size))
        elif self.strategy == 'default':
            self._set_epoch(epoch)
            pairs = default_sampler_stream(
                len(self.sampler.dataset), self.seed, epoch,
                self.sampler.shuffle, self.sampler.round_up, samples,
                self.rank, self.world_size)
        elif self.strategy == 'fast_forward':
            self._set_epoch(epoch)
            self.sampler.fast_forward(samples)
            pairs = self._label(self._start_pass(self.sampler, epoch),
                                samples)
        else:
            self._set_epoch(epoch)
            indices = self._start_pass(self.sampler, epoch)
            skip = batches * self.batch_sampler.batch_size
            next(itertools.islice(indices, skip, skip), None)
            pairs = self._label(indices, skip * self.world_size)
        return self._batched(pairs, epoch)

    def _start_pass(self, iterable, epoch: int) -> Iterator:
        """``iter(iterable)``, its pass started under a seeded RNG state.

        Samplers without a generator of their own (torch's ``RandomSampler``
        ...) draw their order from the global RNGs when a pass starts. The
        uninterrupted run starts a pass when the DataLoader first asks for
        it, a resumed run when it replays it; both therefore start it under
        the global state seeded from ``(seed, epoch)``, and the main
        process's states are left as they were. A sampler that keeps drawing
        from the global RNGs while it iterates cannot be replayed: warned.
        """
        with preserved_global_rngs():
            seed_global_rngs(
                mix_seed(self.seed, _SAMPLER_PASS_STREAM, epoch))
            iterator = iter(iterable)
            head = list(itertools.islice(iterator, 1))
            after_first = global_rng_states()
            head += itertools.islice(iterator, 1)
            if len(head) == 2 and not same_global_rng_states(
                    after_first, global_rng_states()):
                self._warn_rng_draws(iterable)
        return itertools.chain(head, iterator)

    def _warn_rng_draws(self, iterable) -> None:
        if self._warned_rng_draws:
            return
        self._warned_rng_draws = True
        print_log(
            f'Fast resume: {type(iterable).__name__} draws from the global '
            'random generators (random, numpy.random or torch) for every '
            'index, not only when a pass starts, so the order of its '
            'indices depends on when the DataLoader asks for them and a '
            'resumed run cannot replay it. Give the sampler a generator of '
            'its own, seeded from its seed and epoch.',
            logger='current',
            level=logging.WARNING)

    def _label(self, indices: Iterable[int], start: int):
        # A sampler we cannot see into: label its i-th index with the global
        # position it has in mmengine's rank-interleaved layout.
        return zip(
            itertools.count(start + self.rank, self.world_size), indices)

    def _track_infinite(self, pairs):
        # Like InfiniteSampler's shared generator, a later pass continues
        # where this one stopped instead of restarting the stream.
        for position, index in pairs:
            self._infinite_next = position - self.rank + self.world_size
            yield position, index

    def _tag(self, index: int, *labels: int):
        if not self.seed_samples or getattr(index, 'seed', None) is not None:
            return index
        seed = mix_seed(self.seed, *labels)
        if type(index) is int:
            return SampleIndex(index, seed)
        return with_fields(index, seed=seed)

    def _batched(self, pairs, epoch: int) -> Iterator[List[int]]:
        size = self.batch_sampler.batch_size
        batch = []
        for position, index in pairs:
            batch.append(self._tag(index, epoch, position))
            if len(batch) == size:
                yield batch
                batch = []
        if batch and not self.batch_sampler.drop_last:
            yield batch

    def _replayed_batches(self, epoch: int, skip: int) -> Iterator[list]:
        self._set_epoch(epoch)
        batches = self._start_pass(self.batch_sampler, epoch)
        next(itertools.islice(batches, skip, skip), None)
        return self._tag_batches(batches, epoch, skip)

    def _tag_batches(self, batches: Iterator[list], epoch: int,
                     first: int) -> Iterator[list]:
        # Buckets hold samples across batches, so there is no sample
        # position: label by (batch in epoch, rank, slot) instead.
        for number, batch in enumerate(batches, first):
            yield [
                self._tag(index, epoch, number, self.rank, slot)
                for slot, index in enumerate(batch)
            ]
