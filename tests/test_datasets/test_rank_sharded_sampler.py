"""Sampler maths with simulated ranks (the real 2-rank run is in
test_rank_sharded_dist.py)."""
import itertools
from collections import Counter

import pytest
from mmengine.dataset import DefaultSampler

from mmdata_plugin.datasets import (RankShardedInfiniteSampler,
                                    RankShardedSampler)
from mmdata_plugin.datasets import rank_sharded_sampler as sampler_module


@pytest.fixture(params=[3, 1 << 20], ids=['tiny_blocks', 'one_block'])
def block(request, monkeypatch):
    """Run each test with blocks of 3 positions too (block seams)."""
    monkeypatch.setattr(sampler_module, '_BLOCK', request.param)


def _ranks(cls, n, world_size, monkeypatch, **kwargs):
    """``cls`` on each simulated rank, over ``range(n)`` (``n`` an int) or
    the dataset ``n``."""
    dataset = range(n) if isinstance(n, int) else n
    samplers = []
    for rank in range(world_size):
        monkeypatch.setattr(sampler_module, 'get_dist_info',
                            lambda rank=rank: (rank, world_size))
        samplers.append(cls(dataset, **kwargs))
    return samplers


def _epoch(samplers, epoch):
    for sampler in samplers:
        sampler.set_epoch(epoch)
    return [list(sampler) for sampler in samplers]


@pytest.mark.parametrize('world_size', [1, 2, 3, 8])
@pytest.mark.parametrize('n', [1, 2, 7, 8, 9, 97])
@pytest.mark.parametrize('mini_epochs', [1, 3])
def test_every_sample_once_per_epoch_with_padding(block, monkeypatch,
                                                  world_size, n, mini_epochs):
    if n < mini_epochs:
        return
    samplers = _ranks(
        RankShardedSampler,
        n,
        world_size,
        monkeypatch,
        seed=5,
        mini_epochs=mini_epochs)
    for perm_epoch in range(2):
        seen = Counter()
        for part in range(mini_epochs):
            per_rank = _epoch(samplers, perm_epoch * mini_epochs + part)
            # Equal per-rank counts (DDP must not hang), as __len__ says.
            assert {len(ids) for ids in per_rank} == {len(samplers[0])}
            part_ids = Counter(itertools.chain(*per_rank))
            repeats = sum(part_ids.values()) - len(part_ids)
            assert repeats <= (world_size - 1 if mini_epochs == 1 else
                               world_size)
            assert not seen.keys() & part_ids.keys()  # parts are disjoint
            seen.update(part_ids)
        assert set(seen) == set(range(n))  # a pass covers everything


@pytest.mark.compat
def test_round_up_false_drops_instead(monkeypatch):
    samplers = _ranks(
        RankShardedSampler, 10, 3, monkeypatch, seed=0, round_up=False)
    ids = list(itertools.chain(*_epoch(samplers, 0)))
    assert len(ids) == len(set(ids)) == 9


def test_shuffle_false_is_defaultsampler_order(monkeypatch):
    for n, world_size in [(10, 3), (7, 2), (5, 1)]:
        ours = _ranks(
            RankShardedSampler, n, world_size, monkeypatch, shuffle=False)
        for rank in range(world_size):
            monkeypatch.setattr(
                'mmengine.dataset.sampler.get_dist_info',
                lambda rank=rank: (rank, world_size))
            stock = DefaultSampler(range(n), shuffle=False, seed=0)
            assert list(ours[rank]) == list(stock)


@pytest.mark.compat
def test_reproducible_and_reshuffled_each_epoch(monkeypatch):
    first = _ranks(RankShardedSampler, 1000, 2, monkeypatch, seed=3)
    again = _ranks(RankShardedSampler, 1000, 2, monkeypatch, seed=3)
    other = _ranks(RankShardedSampler, 1000, 2, monkeypatch, seed=4)
    assert _epoch(first, 1) == _epoch(again, 1)
    assert _epoch(first, 1) != _epoch(first, 2)
    assert _epoch(first, 1) != _epoch(other, 1)


def test_seed_none_is_synchronised(monkeypatch):
    monkeypatch.setattr(sampler_module, 'sync_random_seed', lambda: 1234)
    assert RankShardedSampler(range(10)).seed == 1234
    assert RankShardedInfiniteSampler(range(10)).seed == 1234


def _global_epoch(n, seed, epoch, monkeypatch, **kwargs):
    """The global stream of an epoch = what a single rank yields."""
    (single, ) = _ranks(RankShardedSampler, n, 1, monkeypatch, seed=seed,
                        **kwargs)
    single.set_epoch(epoch)
    return list(single)


@pytest.mark.parametrize('old_world, new_world', [(2, 2), (2, 3), (3, 1),
                                                  (4, 2)])
def test_fast_forward_continues_the_epoch_across_world_sizes(
        block, monkeypatch, old_world, new_world):
    n, seed, epoch, mini_epochs = 50, 9, 4, 3
    stream = _global_epoch(n, seed, epoch, monkeypatch,
                           mini_epochs=mini_epochs)
    consumed = 12  # e.g. 2 iterations x batch 3 x 2 ranks
    resumed = _ranks(
        RankShardedSampler,
        n,
        new_world,
        monkeypatch,
        seed=seed,
        mini_epochs=mini_epochs)
    check_fast_forward(resumed, stream, epoch, consumed)


def check_fast_forward(resumed, stream, epoch, consumed):
    """``resumed`` (simulated ranks), fast-forwarded to ``consumed`` in
    ``epoch``, continue the global ``stream`` of that (mini-)epoch."""
    for sampler in resumed:
        sampler.set_epoch(epoch)
        sampler.fast_forward(consumed)
    per_rank = [list(sampler) for sampler in resumed]
    assert len({len(ids) for ids in per_rank}) == 1
    for rank, ids in enumerate(per_rank):
        # Rank r continues at stream positions consumed + r + k * W.
        assert ids == [
            stream[(consumed + rank + k * len(resumed)) % len(stream)]
            for k in range(len(ids))
        ]
    # Before + after = the whole mini-epoch.
    part = set(stream)
    assert set(stream[:consumed]) | set(itertools.chain(*per_rank)) == part
    # One-shot: the next iteration is the full epoch again.
    assert len(list(resumed[0])) == len(resumed[0])


def test_fast_forward_to_an_offset_the_new_world_size_does_not_divide(
        block, monkeypatch):
    # One rank trained one iteration of batch 3; the run resumes on 2 ranks:
    # 7 positions left for 2 ranks, so each rank needs 4 (one wraps around).
    n, seed, epoch, consumed = 10, 5, 1, 3
    stream = _global_epoch(n, seed, epoch, monkeypatch)
    resumed = _ranks(RankShardedSampler, n, 2, monkeypatch, seed=seed)
    for sampler in resumed:
        sampler.set_epoch(epoch)
        sampler.fast_forward(consumed)
    per_rank = [list(sampler) for sampler in resumed]
    assert [len(ids) for ids in per_rank] == [4, 4]
    seen = set(stream[:consumed]) | set(itertools.chain(*per_rank))
    assert seen == set(range(n)), f'lost {set(range(n)) - seen}'


@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_infinite_stream_is_consecutive_permutations(block, monkeypatch,
                                                     world_size):
    n = 11
    (single, ) = _ranks(RankShardedInfiniteSampler, n, 1, monkeypatch, seed=2)
    stream = list(itertools.islice(iter(single), 8 * n))
    for p in range(5):
        assert sorted(stream[p * n:(p + 1) * n]) == list(range(n))
    assert stream[:n] != stream[n:2 * n]
    samplers = _ranks(
        RankShardedInfiniteSampler, n, world_size, monkeypatch, seed=2)
    for offset in (0, 7, 23):
        for rank, sampler in enumerate(samplers):
            sampler.fast_forward(offset)
            got = list(itertools.islice(iter(sampler), 12))
            assert got == stream[offset + rank:offset + rank +
                                 12 * world_size:world_size]
    assert len(samplers[0]) == n


def test_infinite_stream_does_not_depend_on_mini_epochs(monkeypatch):
    streams = [
        list(
            itertools.islice(
                iter(
                    _ranks(RankShardedInfiniteSampler, 10, 1, monkeypatch,
                           seed=1, mini_epochs=m)[0]), 35)) for m in (1, 3)
    ]
    assert streams[0] == streams[1]


@pytest.mark.parametrize('kwargs, match', [
    (dict(mini_epochs=20), 'fewer than mini_epochs=20'),
    (dict(mini_epochs=0), 'positive int'),
    (dict(rounds=3), 'rounds must be >= 4'),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RankShardedSampler(range(10), seed=0, **kwargs)
    with pytest.raises(ValueError, match='global_offset'):
        RankShardedSampler(range(10), seed=0).fast_forward(-1)


def test_a_seed_set_after_build_takes_effect(monkeypatch):
    (sampler, ) = _ranks(RankShardedSampler, 100, 1, monkeypatch, seed=1)
    first = list(sampler)
    sampler.seed = 2  # e.g. re-applied from a checkpoint on resume
    (other, ) = _ranks(RankShardedSampler, 100, 1, monkeypatch, seed=2)
    assert list(sampler) == list(other) != first


def test_stock_sampler_pairing_is_warned_with_the_sampler_to_use(tmp_path):
    from mmengine.dataset import InfiniteSampler
    from torch.utils.data import DataLoader

    from mmdata_plugin.datasets import RankShardedDataset, SampleSeededDataset
    ann = tmp_path / 'ann.txt'
    ann.write_text(''.join(f'{i}.jpg {i % 3}\n' for i in range(10)))
    dataset = RankShardedDataset(ann_file=str(ann))

    def advice(sampler, dataset=dataset):
        return sampler_module.stock_sampler_advice(
            DataLoader(dataset, batch_size=2, sampler=sampler))

    message = advice(DefaultSampler(dataset, seed=0))
    assert "mmengine's DefaultSampler" in message
    assert "sampler=dict(type='RankShardedSampler'" in message
    assert "type='RankShardedInfiniteSampler'" in advice(
        InfiniteSampler(dataset, seed=0))
    # The fast-resume loops wrap the dataset; the check looks through it.
    wrapped = SampleSeededDataset(dataset)
    assert 'RankShardedSampler' in advice(
        DefaultSampler(wrapped, seed=0), wrapped)
    assert advice(RankShardedSampler(dataset, seed=0)) is None
    assert advice(RankShardedInfiniteSampler(dataset, seed=0)) is None
    assert advice(DefaultSampler(range(10), seed=0), range(10)) is None
