"""DataLoader-level exactness of the fast-resume machinery.

Each test runs the loops' own pieces (``DataStreamResumer`` positioning a
real DataLoader, ``ResumableDataloaderIterator`` reading it) once without
interruption and once interrupted after N batches and resumed from the
saved (plain-data) position in a fresh DataLoader, then compares indices
and augmented values bitwise.
"""
import gc
import itertools
import math
import multiprocessing
import random
import weakref
from unittest import mock

import numpy as np
import pytest
import torch
from mmengine.dataset import DefaultSampler, InfiniteSampler
from torch.utils.data import (DataLoader, Dataset, DistributedSampler,
                              IterableDataset, RandomSampler)

from mmdata_plugin.datasets import (GrowingWindowSampler,
                                    RankShardedInfiniteSampler,
                                    RankShardedSampler, SampleSeededDataset)
from mmdata_plugin.engine.runner import (DataStreamResumer,
                                         ResumableDataloaderIterator)
from mmdata_plugin.engine.runner.data_stream_resumer import describe
from mmdata_plugin.sample_order import DataPositionError, SampleIndex

BATCH = 4

pytestmark = pytest.mark.filterwarnings(
    'ignore:This DataLoader will create:UserWarning')


class RandomAugDataset(Dataset):
    """A pipeline stand-in drawing from all three global RNGs per sample.

    Counts its fetches across worker processes.
    """

    def __init__(self, size=23):
        self.size = size
        self.fetches = multiprocessing.Value('i', 0)

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        with self.fetches.get_lock():
            self.fetches.value += 1
        draws = [random.random(), np.random.rand(), torch.rand(1).item()]
        return int(index), torch.tensor(draws, dtype=torch.float64)


class ParityBucketBatchSampler:
    """Aspect-ratio bucketing stand-in: batches of equal index parity."""

    def __init__(self, sampler, batch_size):
        self.sampler = sampler
        self.batch_size = batch_size

    def __iter__(self):
        buckets = ([], [])
        for index in self.sampler:
            bucket = buckets[int(index) % 2]
            bucket.append(index)
            if len(bucket) == self.batch_size:
                yield bucket[:]
                bucket.clear()

    def __len__(self):
        return len(self.sampler) // self.batch_size


class FastForwardSampler:
    """A sampler implementing the fast-forward protocol (epoch-based).

    Rank-interleaved permutation of ``seed + epoch``; records how it was
    positioned and how many indices it produced.
    """

    def __init__(self, dataset, seed, rank=0, world_size=1):
        self.size = len(dataset)
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.offsets = []
        self.produced = 0
        self._offset = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def fast_forward(self, global_offset):
        self.offsets.append(global_offset)
        self._offset = global_offset

    def __iter__(self):
        offset, self._offset = self._offset, 0
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        for position in range(offset + self.rank, self.size,
                              self.world_size):
            self.produced += 1
            yield order[position]

    def __len__(self):
        return math.ceil(self.size / self.world_size)


def make_loader(sampler='infinite',
                shuffle=True,
                size=23,
                num_workers=0,
                persistent=False,
                prefetch=None,
                rank=0,
                world_size=1,
                seed=3,
                drop_last=False,
                bucketed=False,
                in_order=True,
                **sampler_options):
    dataset = RandomAugDataset(size)
    with mock.patch('mmengine.dataset.sampler.get_dist_info',
                    return_value=(rank, world_size)), mock.patch(
                        'mmdata_plugin.datasets.rank_sharded_sampler.'
                        'get_dist_info',
                        return_value=(rank, world_size)):
        if sampler == 'infinite':
            sampler = InfiniteSampler(dataset, shuffle=shuffle, seed=seed)
        elif sampler == 'default':
            sampler = DefaultSampler(
                dataset, shuffle=shuffle, seed=seed, **sampler_options)
        elif sampler == 'fast_forward':
            sampler = FastForwardSampler(dataset, seed, rank, world_size)
        elif sampler == 'rank_sharded':
            sampler = RankShardedSampler(
                dataset, shuffle=shuffle, seed=seed, **sampler_options)
        elif sampler == 'growing':
            sampler = GrowingWindowSampler(
                dataset, shuffle=shuffle, seed=seed, **sampler_options)
        elif sampler == 'rank_sharded_infinite':
            sampler = RankShardedInfiniteSampler(
                dataset, shuffle=shuffle, seed=seed, **sampler_options)
        elif sampler == 'random':
            # No generator: draws its order from torch's global one.
            sampler = RandomSampler(dataset)
        else:
            sampler = DistributedSampler(
                dataset, world_size, rank, shuffle=shuffle, seed=seed)
    options = dict(
        num_workers=num_workers, collate_fn=list, in_order=in_order)
    if num_workers:
        options.update(persistent_workers=persistent, prefetch_factor=prefetch)
    if bucketed:
        return DataLoader(
            dataset,
            batch_sampler=ParityBucketBatchSampler(sampler, BATCH),
            **options)
    return DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=sampler,
        drop_last=drop_last,
        **options)


def read(loader, batches, meta=None, iteration=0):
    """Resume ``loader`` at ``iteration`` and read ``batches`` batches.

    Returns:
        tuple: ``[(epoch, [(index, augmented values)])]`` per batch, the
        state to save at the end, and the resumer.
    """
    resumer = DataStreamResumer(loader, seed=0)
    iterator = ResumableDataloaderIterator(
        loader, resumer.position, epoch_transition_sleep=0)
    if meta is not None:
        resumer.load_checkpoint_meta(meta)
    resumer.resume(iteration)
    out = []
    for _ in range(batches):
        batch = next(iterator)
        out.append((resumer.position.epoch,
                    [(index, values.tolist()) for index, values in batch]))
    return out, resumer.state_dict(), resumer


def interrupted_and_resumed(first, then, skip, more, meta_of=None):
    """``skip`` batches from ``first()``, then ``more`` from ``then()``."""
    part, state, _ = read(first(), skip)
    meta = dict(data_position=state) if meta_of is None else meta_of(state)
    loader = then()
    rest, _, _ = read(loader, more, meta, iteration=skip)
    return part, rest, loader


MATRIX = [
    # sampler, shuffle, workers before, after, persistent, prefetch, skip
    ('infinite', True, 0, 0, False, None, 5),
    ('infinite', True, 2, 2, True, 2, 5),
    ('infinite', False, 1, 4, False, 1, 7),
    ('infinite', True, 4, 1, True, 4, 9),
    ('infinite', True, 2, 0, False, 3, 6),
    ('default', True, 0, 2, False, 2, 8),
    ('default', True, 2, 2, True, 1, 3),
    ('default', False, 4, 0, True, 2, 13),
    ('default', True, 1, 1, False, 4, 6),
    ('default', False, 2, 4, True, 2, 5),
]


@pytest.mark.parametrize(
    'sampler,shuffle,workers,workers_after,persistent,prefetch,skip', MATRIX)
def test_resumed_stream_equals_uninterrupted(sampler, shuffle, workers,
                                             workers_after, persistent,
                                             prefetch, skip):
    more = 6

    def loader(num_workers):
        return make_loader(
            sampler,
            shuffle,
            num_workers=num_workers,
            persistent=persistent and num_workers > 0,
            prefetch=prefetch if num_workers else None)

    reference, _, _ = read(loader(workers), skip + more)
    part, rest, resumed = interrupted_and_resumed(
        lambda: loader(workers), lambda: loader(workers_after), skip, more)
    assert part == reference[:skip]
    assert rest == reference[skip:]
    # Only the batches read plus those in flight were ever loaded.
    in_flight = (prefetch or 2) * workers_after
    assert resumed.dataset.fetches.value <= (more + in_flight) * BATCH


def test_skipped_samples_are_never_loaded():
    _, state, _ = read(make_loader(), 3)
    state.update(iter=100_000, samples_in_epoch=400_000,
                 consumed_samples=400_000)
    for workers in (0, 2):
        loader = make_loader(num_workers=workers, prefetch=2 if workers else
                             None)
        read(loader, 2, dict(data_position=state), iteration=100_000)
        fetched = loader.dataset.fetches.value
        if workers:
            assert fetched <= (2 + 2 * workers) * BATCH
        else:
            assert fetched == 2 * BATCH


def test_drop_last_and_epoch_boundaries():
    reference, _, _ = read(make_loader('default', drop_last=True), 16)
    assert [epoch for epoch, _ in reference[:6]] == [0] * 5 + [1]
    for skip in (4, 5, 7):
        _, rest, _ = interrupted_and_resumed(
            lambda: make_loader('default', drop_last=True),
            lambda: make_loader('default', drop_last=True, num_workers=2),
            skip, 16 - skip)
        assert rest == reference[skip:]


def by_position(batches, start, rank, world_size):
    """``{(epoch, global position): sample}`` in mmengine's rank layout."""
    out, epoch, local = {}, None, 0
    for batch_epoch, batch in batches:
        if batch_epoch != epoch:
            epoch, local = batch_epoch, 0 if epoch is not None else local
        for sample in batch:
            out[(epoch, start + rank + local * world_size)] = sample
            local += 1
    return out


@pytest.mark.parametrize('sampler', ['infinite', 'default'])
@pytest.mark.parametrize('world_size,new_world_size', [(2, 1), (1, 2)])
def test_world_size_change_continues_the_global_stream(
        sampler, world_size, new_world_size):
    skip, more = 2, 5
    reference, _, _ = read(make_loader(sampler), 14)
    expected = by_position(reference, 0, 0, 1)
    got, states = {}, []
    for rank in range(world_size):
        part, state, _ = read(
            make_loader(sampler, rank=rank, world_size=world_size), skip)
        states.append(state)
        got.update(by_position(part, 0, rank, world_size))
    assert all(state == states[0] for state in states)
    start = states[0]['samples_in_epoch']
    for rank in range(new_world_size):
        rest, _, _ = read(
            make_loader(sampler, rank=rank, world_size=new_world_size), more,
            dict(data_position=states[0]), iteration=skip)
        for (epoch, position), sample in by_position(
                rest, start, rank, new_world_size).items():
            # Past the end of epoch 0 the positions restart at 0.
            key = (epoch, position if epoch == 0 else position - start)
            assert key not in got, f'position {key} served twice'
            got[key] = sample
    epoch0 = sorted(p for e, p in got if e == 0)
    assert epoch0[:len(set(epoch0))] == list(range(len(epoch0)))
    for key, sample in got.items():
        if key in expected:
            assert sample == expected[key], key
    # Every position of epoch 0 up to the dataset size was served once.
    assert set(range(23)) <= set(epoch0) or sampler == 'infinite'


def test_sampler_seed_comes_from_the_checkpoint():
    reference, _, _ = read(make_loader(seed=3), 8)
    # seed=None / diff_rank_seed: mmengine builds the sampler with a fresh
    # seed before the checkpoint is read.
    _, rest, _ = interrupted_and_resumed(lambda: make_loader(seed=3),
                                         lambda: make_loader(seed=99), 3, 5)
    assert rest == reference[3:]


def stock_loop_indices(sampler, batches):
    """The indices of ``batches`` batches of mmengine's IterBasedTrainLoop
    (its infinite iterator restarts the DataLoader at each epoch end)."""
    from mmengine.runner.loops import _InfiniteDataloaderIterator
    with mock.patch('time.sleep'):
        stock = _InfiniteDataloaderIterator(make_loader(sampler, seed=3))
        return [[index for index, _ in next(stock)] for _ in range(batches)]


def indices_of(batches):
    return [[index for index, _ in batch] for _, batch in batches]


@pytest.mark.parametrize('sampler', ['infinite', 'default'])
def test_stock_checkpoint_resumes_where_the_stock_loop_was(sampler):
    rest, _, _ = read(
        make_loader(sampler, seed=99, num_workers=2), 6,
        dict(seed=3), iteration=8)
    assert indices_of(rest) == stock_loop_indices(sampler, 14)[8:]


@pytest.mark.parametrize('sampler', ['rank_sharded_infinite', 'rank_sharded'])
def test_stock_checkpoint_positions_fast_forward_samplers_directly(sampler):
    """Infinite or per-epoch (``sampler.infinite``): no index replay."""
    loader = make_loader(sampler, seed=99, num_workers=2)
    positioned = loader.batch_sampler.sampler
    with mock.patch.object(
            positioned, 'fast_forward',
            wraps=positioned.fast_forward) as fast_forward:
        rest, _, _ = read(loader, 6, dict(seed=3), iteration=8)
    assert indices_of(rest) == stock_loop_indices(sampler, 14)[8:]
    # 23 samples, batch 4: 6 batches per epoch, so iteration 8 is batch 2
    # of epoch 1 for the epoch sampler.
    offset = 8 * BATCH if positioned.infinite else 2 * BATCH
    assert fast_forward.call_args_list[0] == mock.call(offset)
    assert rest[0][0] == (0 if positioned.infinite else 1)  # epoch


def test_stock_epoch_checkpoint_of_unequal_epochs_is_placed_in_its_epoch():
    # A growing window of 6, 10, 14 of 23 samples, batch 4: epochs of 2, 3
    # and 4 batches, so mmengine's EpochBasedTrainLoop's iteration is not
    # epoch x len(dataloader) + batch.
    window = dict(initial=6, growth=4, capacity=15)
    stock = make_loader('growing', **window)
    epochs = []
    for epoch in range(3):
        stock.sampler.set_epoch(epoch)
        epochs += [epoch] * len(list(stock))
    assert epochs == [0, 0, 1, 1, 1, 2, 2, 2, 2]
    for iteration in range(1, len(epochs)):
        # Saved after the iteration, before the loop's epoch counter moves.
        epoch = epochs[iteration - 1]
        resumer = DataStreamResumer(make_loader('growing', **window), seed=0)
        resumer.load_checkpoint_meta(dict(seed=3, epoch=epoch))
        report = resumer.resume(iteration, epoch=epoch)
        assert (report.epoch, report.batches_in_epoch) == (
            epoch, epochs[:iteration].count(epoch)), iteration


def test_stock_checkpoint_of_an_undeclared_sampler_is_replayed_and_said():
    """FastForwardSampler does not say whether it is infinite."""
    reference, _, _ = read(make_loader('fast_forward', seed=3), 8)
    loader = make_loader('fast_forward', seed=99)
    resumer = DataStreamResumer(loader, seed=0)
    resumer.load_checkpoint_meta(dict(seed=3))
    report = resumer.resume(5)
    assert report.strategy == 'stream_replay'
    assert 'by index-only replay of the stream from its start' in describe(
        report)
    iterator = ResumableDataloaderIterator(
        loader, resumer.position, epoch_transition_sleep=0)
    assert [[i for i, _ in next(iterator)] for _ in range(3)] == \
        indices_of(reference[5:])


@pytest.mark.parametrize('sampler', ['infinite', 'default'])
def test_custom_batch_sampler_is_replayed_on_indices(sampler):
    reference, _, _ = read(make_loader(sampler, bucketed=True), 12)
    for meta_of in (None, lambda state: dict(seed=3)):
        part, rest, resumed = interrupted_and_resumed(
            lambda: make_loader(sampler, bucketed=True),
            lambda: make_loader(
                sampler, bucketed=True, num_workers=2, prefetch=1), 7, 5,
            meta_of)
        assert rest == reference[7:]
        assert resumed.dataset.fetches.value <= (5 + 2) * BATCH


def test_custom_batch_sampler_refuses_a_world_size_change():
    _, state, _ = read(make_loader(bucketed=True), 3)
    with pytest.raises(DataPositionError) as error:
        read(make_loader(bucketed=True, rank=0, world_size=2), 1,
             dict(data_position=state), iteration=3)
    assert 'world_size is 1 in the checkpoint but 2 in this run' in str(
        error.value)


@pytest.mark.parametrize('world_size,new_world_size', [(1, 1), (2, 1)])
def test_fast_forward_protocol(world_size, new_world_size):
    reference, _, _ = read(make_loader('fast_forward'), 12)
    expected = by_position(reference, 0, 0, 1)
    _, state, _ = read(
        make_loader('fast_forward', world_size=world_size), 2)
    loader = make_loader('fast_forward', seed=99, world_size=new_world_size)
    rest, _, _ = read(loader, 3, dict(data_position=state), iteration=2)
    start = 2 * BATCH * world_size
    sampler = loader.batch_sampler.sampler
    assert sampler.offsets[0] == start and sampler.seed == 3
    # Nothing before the offset was generated, let alone loaded.
    assert sampler.produced == sum(len(batch) for _, batch in rest)
    for key, sample in by_position(rest, start, 0, new_world_size).items():
        if key[0] == 0:
            assert sample == expected[key]


def test_other_samplers_are_replayed_on_indices():
    reference, _, _ = read(make_loader('distributed'), 12)
    _, rest, resumed = interrupted_and_resumed(
        lambda: make_loader('distributed'),
        lambda: make_loader('distributed', num_workers=2, prefetch=2), 8, 4)
    assert rest == reference[8:]
    assert resumed.dataset.fetches.value <= (4 + 4) * BATCH


def test_replayed_samplers_keep_their_own_order():
    """Index replay positions a sampler's stream without changing it: an
    uninterrupted read gives the sampler's own batches, epoch by epoch
    (the resume tests compare two runs of the same code, so a shift of
    every pass would pass them)."""
    loader = make_loader('distributed')
    got, _, _ = read(loader, 12)  # 23 samples: two passes of 6 batches
    sampler = loader.sampler  # with the seed the resumer gave it
    expected = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        order = list(sampler)
        expected += [(epoch, order[i:i + BATCH])
                     for i in range(0, len(order), BATCH)]
    assert [(epoch, [index for index, _ in batch])
            for epoch, batch in got] == expected


def test_replayed_batch_samplers_keep_their_own_batches():
    """The same for a batch sampler we cannot see into, replayed batch by
    batch: a read from the start gives its own batches (a batch dropped
    from every pass, the resumed and the reference read alike, passed
    the resume test above)."""
    loader = make_loader('default', bucketed=True)
    got, _, _ = read(loader, 4)
    # A bucket sampler of its own over the loader's sampler (seeded by the
    # resumer): the loader's is read through the resumer's replay.
    sampler = loader.batch_sampler.sampler
    sampler.set_epoch(0)
    expected = list(
        itertools.islice(iter(ParityBucketBatchSampler(sampler, BATCH)), 4))
    assert [[index for index, _ in batch] for _, batch in got] == expected


def under_torch_seed(seed, make):
    """``make()`` with torch's global generator seeded ``seed`` first, as
    other main-process work leaves it in another state in each run."""

    def made():
        torch.manual_seed(seed)
        return make()

    return made


@pytest.mark.parametrize('bucketed', [False, True])
def test_samplers_drawing_from_the_global_rng_replay_their_order(bucketed):
    """torch's RandomSampler without a generator draws each pass's order
    from the global generator; every pass starts under a seeded state."""

    def loader(num_workers=0):
        return make_loader(
            'random', bucketed=bucketed, num_workers=num_workers)

    reference, _, _ = under_torch_seed(1, lambda: read(loader(), 14))()
    # 8 batches: past the end of the first pass (6 batches, or fewer
    # bucketed), so a whole pass is replayed and the next one entered.
    part, rest, _ = interrupted_and_resumed(
        under_torch_seed(2, loader), under_torch_seed(3, lambda: loader(2)),
        8, 6)
    assert part == reference[:8]
    assert rest == reference[8:]


def test_a_finished_pass_is_freed_at_once():
    """Its workers stop when the pass ends, not when the garbage collector
    finds a reference cycle (which takes seconds per worker)."""
    loader = make_loader('random', num_workers=2, prefetch=1)
    resumer = DataStreamResumer(loader, seed=0)
    iterator = ResumableDataloaderIterator(
        loader, resumer.position, epoch_transition_sleep=0)
    resumer.resume(0)
    gc.disable()
    try:
        next(iterator)
        first_pass = weakref.ref(iterator._pass)
        for _ in range(6):  # 6 batches per pass
            next(iterator)
        assert resumer.position.epoch == 1
        assert first_pass() is None
    finally:
        gc.enable()


class GlobalRngEachIndexSampler:
    """Draws every index from Python's global ``random``."""

    def __init__(self, size):
        self.size = size

    def __iter__(self):
        for _ in range(self.size):
            yield random.randrange(self.size)

    def __len__(self):
        return self.size


def test_sampler_drawing_for_every_index_is_warned_about():
    dataset = RandomAugDataset()
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=GlobalRngEachIndexSampler(len(dataset)),
        collate_fn=list)
    with mock.patch(
            'mmdata_plugin.sample_order.batch_order.print_log'
    ) as log:
        read(loader, 7)
    warnings = [c for c in log.call_args_list if 'GlobalRngEachIndexSampler '
                'draws from the global random generators' in c.args[0]]
    assert len(warnings) == 1  # once, though two passes started


@pytest.mark.parametrize('change,message', [
    (dict(size=24), 'dataset_size is 23 in the checkpoint but 24 in this run'),
    (dict(sampler='default'),
     "sampler is 'InfiniteSampler' in the checkpoint but 'DefaultSampler'"),
    (dict(shuffle=False), 'shuffle is True in the checkpoint but False'),
])
def test_contradicting_data_state_is_refused(change, message):
    _, state, _ = read(make_loader(), 3)
    with pytest.raises(DataPositionError) as error:
        read(make_loader(**change), 1, dict(data_position=state),
             iteration=3)
    assert message in str(error.value)


@pytest.mark.parametrize('sampler,before,after,key', [
    ('rank_sharded', dict(mini_epochs=2), dict(mini_epochs=3),
     'sampler.mini_epochs'),
    ('rank_sharded', dict(rounds=6), dict(rounds=8), 'sampler.rounds'),
    ('rank_sharded', dict(round_up=True), dict(round_up=False),
     'sampler.round_up'),
    ('rank_sharded_infinite', dict(rounds=6), dict(rounds=8),
     'sampler.rounds'),
    ('default', dict(round_up=True), dict(round_up=False),
     'sampler.round_up'),
    ('default', dict(drop_last=False), dict(drop_last=True), 'drop_last'),
])
def test_changed_stream_settings_are_refused(sampler, before, after, key):
    _, state, _ = read(make_loader(sampler, **before), 3)
    with pytest.raises(DataPositionError) as error:
        read(make_loader(sampler, **after), 1, dict(data_position=state),
             iteration=3)
    (name, old), = before.items()
    new = after[name]
    assert (f'train_dataloader.{key} is {old!r} in the checkpoint but '
            f'{new!r} in this run') in str(error.value)


def test_settings_that_do_not_change_the_stream_may_change():
    # mini_epochs only sizes the infinite sampler's shard files.
    reference, _, _ = read(make_loader('rank_sharded_infinite'), 10)
    _, rest, _ = interrupted_and_resumed(
        lambda: make_loader('rank_sharded_infinite', mini_epochs=2),
        lambda: make_loader('rank_sharded_infinite', mini_epochs=3), 4, 6)
    assert rest == reference[4:]


def test_position_and_meta_iteration_must_agree():
    _, state, _ = read(make_loader(), 3)
    with pytest.raises(DataPositionError, match='for iteration 3 but the '
                       'runner resumed at iteration 5'):
        read(make_loader(), 1, dict(data_position=state), iteration=5)


def test_unordered_loader_is_refused():
    with pytest.raises(ValueError, match='in_order=False'):
        DataStreamResumer(
            make_loader(num_workers=2, in_order=False), seed=0)


class Counting(IterableDataset):

    def __iter__(self):
        return iter(range(1000))


def test_iterable_dataset_falls_back_to_load_and_drop():
    loader = DataLoader(Counting(), batch_size=BATCH)
    resumer = DataStreamResumer(loader, seed=0)
    assert resumer.strategy == 'load_and_drop'
    assert not isinstance(loader.dataset, SampleSeededDataset)
    assert resumer.resume(7).drop_batches == 7


class ShardTaggingSampler(FastForwardSampler):
    """Like a rank-sharded sampler: indices name the shard holding them."""

    def __iter__(self):
        for index in super().__iter__():
            yield SampleIndex(index, shard=f's{index}')


def test_indices_carry_position_seeds_and_keep_fields():
    sampler = ShardTaggingSampler(range(8), seed=1)
    loader = DataLoader(range(8), batch_size=BATCH, sampler=sampler)
    resumer = DataStreamResumer(loader, seed=0)
    resumer.resume(0)
    batch = next(iter(loader.batch_sampler))
    assert all(index.shard == f's{int(index)}' for index in batch)
    assert len({index.seed for index in batch}) == BATCH


def test_positioning_is_lazy_and_keeps_the_iterator_object():
    loader = make_loader(num_workers=2, prefetch=2)
    resumer = DataStreamResumer(loader, seed=0)
    iterator = ResumableDataloaderIterator(loader, resumer.position)
    assert not iterator.started
    resumer.resume(0)
    assert not iterator.started and loader.dataset.fetches.value == 0
    next(iterator)
    assert iterator.started
    assert list(itertools.islice(iterator, 1))


@pytest.mark.parametrize('rank', [0, 1])
def test_an_infinite_sampler_iterated_again_continues_its_stream(rank):
    """InfiniteSampler's passes share one generator: a second ``iter()``
    goes on where the first stopped, on each rank; so does the positioned
    stream (restarting it would feed the first samples again)."""

    def loader():
        sampler = InfiniteSampler(range(10), shuffle=True, seed=3)
        sampler.rank, sampler.world_size = rank, 2
        return DataLoader(range(10), batch_size=BATCH, sampler=sampler)

    def two_passes(batch_sampler):
        # The first pass is kept open: closing it closes the stock
        # sampler's shared generator too.
        passes = [iter(batch_sampler), iter(batch_sampler)]
        return [[list(map(int, batch))
                 for batch in itertools.islice(one_pass, 3)]
                for one_pass in passes]

    expected = two_passes(loader().batch_sampler)
    ours = loader()
    DataStreamResumer(ours, seed=0).resume(0)
    assert two_passes(ours.batch_sampler) == expected
