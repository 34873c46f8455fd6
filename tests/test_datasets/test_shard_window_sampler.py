"""ShardWindowSampler with simulated ranks: each epoch a permutation read a
window of shards at a time, its inverse, fast-forward, O(shards) memory
(the resumed training run is in test_engine/test_shard_window_training.py).
"""
import itertools
import tracemalloc
from collections import Counter

import numpy as np
import pytest
from torch.utils.data import BatchSampler

from test_rank_sharded_sampler import _epoch
from test_rank_sharded_sampler import _ranks as simulated_ranks
from test_rank_sharded_sampler import block  # noqa: F401
from test_rank_sharded_sampler import check_fast_forward

from mmdata_plugin.datasets import ShardWindowSampler
from mmdata_plugin.sample_order import sample_order_of
from mmdata_plugin.testing import process_memory

# Empty shards too: a tar shard may hold no sample with the members asked.
SIZES = [5, 0, 7, 3, 9, 1, 4, 6, 2, 8, 0, 5, 7]


class Shards:
    """A packed data set stand-in: only its length and its shards."""

    def __init__(self, sizes):
        self.sizes = np.asarray(sizes, np.int64)

    def __len__(self):
        return int(self.sizes.sum())

    def shard_sizes(self):
        return self.sizes


def _ranks(world_size, monkeypatch, sizes=SIZES, **kwargs):
    return simulated_ranks(ShardWindowSampler, Shards(sizes), world_size,
                           monkeypatch, **kwargs)


def _stream(epoch, monkeypatch, sizes=SIZES, **kwargs):
    """The global stream of an epoch = what a single rank yields."""
    (single, ) = _ranks(1, monkeypatch, sizes, **kwargs)
    return _epoch([single], epoch)[0]


def _shard_of(sizes):
    return np.repeat(np.arange(len(sizes)), sizes)


@pytest.mark.parametrize('world_size', [1, 2, 3, 8])
@pytest.mark.parametrize('window_shards', [1, 3, 4, 100])
def test_every_epoch_is_a_permutation_with_padding(block, monkeypatch,
                                                   world_size,
                                                   window_shards):
    samplers = _ranks(world_size, monkeypatch, seed=5,
                      window_shards=window_shards)
    for epoch in range(2):
        per_rank = _epoch(samplers, epoch)
        # Equal per-rank counts (DDP must not hang), as __len__ says.
        assert {len(ids) for ids in per_rank} == {len(samplers[0])}
        seen = Counter(itertools.chain(*per_rank))
        assert set(seen) == set(range(sum(SIZES)))
        assert sum(seen.values()) - len(seen) <= world_size - 1


def test_round_up_false_drops_instead(monkeypatch):
    samplers = _ranks(3, monkeypatch, seed=0, round_up=False)
    ids = list(itertools.chain(*_epoch(samplers, 0)))
    assert len(ids) == len(set(ids)) == sum(SIZES) // 3 * 3


@pytest.mark.parametrize('window_shards', [1, 2, 4])
def test_windows_hold_only_their_shards(monkeypatch, window_shards):
    # Cut the stream where every shard begun so far is finished: a window
    # ends at such a point, so no stretch between two of them may touch
    # more than window_shards shards (a global shuffle has one stretch).
    shard_of = _shard_of(SIZES)
    for epoch in range(3):
        stream = _stream(epoch, monkeypatch, seed=epoch,
                         window_shards=window_shards)
        left, stretch, stretches = Counter(shard_of), set(), 0
        for sample in stream:
            shard = shard_of[sample]
            stretch.add(shard)
            left[shard] -= 1
            if all(left[s] == 0 for s in stretch):
                assert len(stretch) <= window_shards, (epoch, stretch)
                stretch, stretches = set(), stretches + 1
        nonempty = sum(1 for size in SIZES if size)
        assert stretches >= -(-nonempty // window_shards)


def test_each_window_is_shuffled_its_own_way(monkeypatch):
    # Equal shards: windows with one shared permutation would read the
    # same offsets inside their shards in the same order.
    sizes = [10] * 12
    stream = np.array(_stream(0, monkeypatch, sizes, seed=1,
                              window_shards=3))
    offsets = (stream % 10).reshape(4, 30)
    assert len({tuple(row) for row in offsets.tolist()}) == 4


def test_shards_and_windows_are_reshuffled_by_seed_and_epoch(monkeypatch):
    shard_of = _shard_of(SIZES)

    def shard_order(epoch, seed):
        # One shard per window: the shards in the order they are read.
        stream = _stream(epoch, monkeypatch, seed=seed, window_shards=1)
        return list(dict.fromkeys(shard_of[stream].tolist()))

    def window_order(epoch, seed):
        # One shard, one window: the order inside a window alone.
        return _stream(epoch, monkeypatch, [50], seed=seed)

    for order in (shard_order, window_order):
        assert order(1, 3) == order(1, 3)
        assert order(2, 3) != order(1, 3) != order(1, 4)


def test_shuffle_false_is_the_natural_order(monkeypatch):
    samplers = _ranks(2, monkeypatch, shuffle=False)
    n = sum(SIZES)
    assert _epoch(samplers, 3) == [
        [p % n for p in range(rank, n + 1, 2)] for rank in range(2)
    ]


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_ids_at_equals_iterating(block, monkeypatch, world_size):
    samplers = _ranks(world_size, monkeypatch, seed=7)
    for epoch in range(2):
        for rank, ids in enumerate(_epoch(samplers, epoch)):
            positions = rank + world_size * np.arange(len(ids))
            assert samplers[0].ids_at(epoch, positions).tolist() == ids


@pytest.mark.parametrize('world_size', [1, 3])
def test_places_invert_ids_at(monkeypatch, world_size):
    sampler = _ranks(world_size, monkeypatch, seed=11)[0]
    order = sample_order_of(BatchSampler(sampler, 4, False), world_size)
    n = sum(SIZES)
    ids = np.arange(n)
    for cycle in range(3):
        assert order.cycle_start(cycle) == (cycle, 0)
        places = order.places(cycle, ids)
        assert (places.epoch == cycle).all()
        assert (order.cycle_of(places.epoch, places.first) == cycle).all()
        # Every place a pass reads a sample at, padding repeats included.
        reads = Counter()
        for i in ids.tolist():
            for position in range(places.first[i], places.end[i],
                                  places.period[i]):
                assert order.ids(cycle, np.array([position]))[0] == i
                reads[position] += 1
        assert sorted(reads) == list(range(order.epoch_length(cycle)))
        assert set(reads.values()) == {1}


def test_fast_forward_then_iterate_is_the_tail(block, monkeypatch):
    for world_size in (1, 2, 3):
        samplers = _ranks(world_size, monkeypatch, seed=2)
        full = _epoch(samplers, 4)
        consumed = 6 * world_size  # 3 iterations x batch 2 on each rank
        for sampler in samplers:
            sampler.fast_forward(consumed)
        assert _epoch(samplers, 4) == [ids[6:] for ids in full]


@pytest.mark.parametrize('old_world, new_world', [(1, 2), (2, 3), (3, 1),
                                                  (3, 2)])
def test_fast_forward_continues_the_epoch_across_world_sizes(
        block, monkeypatch, old_world, new_world):
    stream = _stream(4, monkeypatch, seed=9)
    consumed = 6 * old_world  # e.g. 3 iterations x batch 2 x old ranks
    check_fast_forward(_ranks(new_world, monkeypatch, seed=9), stream, 4,
                       consumed)


def test_a_seed_set_after_build_takes_effect(monkeypatch):
    (sampler, ) = _ranks(1, monkeypatch, seed=1)
    first = list(sampler)
    sampler.seed = 2  # e.g. re-applied from a checkpoint on resume
    (other, ) = _ranks(1, monkeypatch, seed=2)
    assert list(sampler) == list(other) != first
    assert (sampler._offsets(0, np.array(list(sampler))) == np.arange(
        len(first))).all()


@pytest.mark.parametrize('dataset, kwargs, error, match', [
    (Shards([3, 4]), dict(window_shards=0), ValueError, 'positive int'),
    (range(7), {}, TypeError, 'shard_sizes'),
    (type('Short', (Shards, ), dict(__len__=lambda self: 8))([3, 4]), {},
     ValueError, 'gives 7 samples in 2 shards, but the dataset has 8'),
])
def test_bad_arguments(dataset, kwargs, error, match):
    with pytest.raises(error, match=match):
        ShardWindowSampler(dataset, seed=0, **kwargs)


def test_a_billion_samples_in_memory_of_the_shards():
    # 1e9 samples in 1e5 shards of 5,000-15,000: an array per sample would
    # be 8 GB (1 GB as bytes); the sampler holds a few arrays per shard.
    sizes = np.random.default_rng(0).integers(5_000, 15_001, 100_000)
    sizes = sizes * 10**9 // sizes.sum()
    sizes[-1] += 10**9 - sizes.sum()
    rss = process_memory()['rss']
    tracemalloc.start()
    try:
        sampler = ShardWindowSampler(Shards(sizes), seed=0, window_shards=4)
        positions = np.random.default_rng(1).integers(0, 10**9, 2_000)
        ids = sampler.ids_at(3, positions)
        places = sampler.places(3, ids)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    grown = process_memory()['rss'] - rss
    assert len(sampler) == 10**9
    assert ((0 <= ids) & (ids < 10**9)).all()
    assert (places.first == positions).all()
    # Every position reads a sample of one of its window's 4 shards.
    starts = np.concatenate(([0], np.cumsum(sizes)))
    shards = np.searchsorted(starts, ids, 'right') - 1
    layout = sampler._layout(3)
    slots = np.argsort(layout.shard_of_slot)[shards]
    windows = np.searchsorted(layout.window_starts, positions, 'right') - 1
    assert (slots // 4 == windows).all()
    print(f'1e9 samples: traced peak {peak / 2**20:.1f} MiB, '
          f'RSS +{grown / 2**20:.1f} MiB')
    # Both: numpy's zero-filled arrays are traced but not resident until
    # written; RSS also sees what numpy does not allocate itself.
    assert peak < 32 * 2**20
    assert grown < 64 * 2**20
