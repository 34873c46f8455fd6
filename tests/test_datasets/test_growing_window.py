"""The growing-window schedule and its sampler, with simulated ranks (the
real 2-rank resume runs are in test_growing_window_training.py)."""
import itertools
from collections import Counter

import numpy as np
import pytest
from test_rank_sharded_sampler import _epoch
from test_rank_sharded_sampler import _ranks as simulated_ranks
from test_rank_sharded_sampler import check_fast_forward
from torch.utils.data import DataLoader

from mmdata_plugin.datasets import GrowingWindowSampler, window_capacity
from mmdata_plugin.engine.runner.data_stream_resumer import DataStreamResumer
from mmdata_plugin.engine.runner.resumable_iterator import \
    ResumableDataloaderIterator
from mmdata_plugin.sample_order import GrowingWindow, IndexPermutation


def _ranks(n, world_size, monkeypatch, **kwargs):
    return simulated_ranks(GrowingWindowSampler, n, world_size, monkeypatch,
                           **kwargs)


def _global_stream(n, epoch, monkeypatch, **kwargs):
    (single, ) = _ranks(n, 1, monkeypatch, **kwargs)
    single.set_epoch(epoch)
    return list(single)


SCHEDULE = dict(initial=6, growth=4, capacity=15, seed=3)


def test_window_grows_by_growth_then_slides_oldest_out():
    window = GrowingWindow(40, **SCHEDULE)
    assert [window.window_size(e) for e in range(6)] == [6, 10, 14, 15, 15,
                                                         15]
    assert [window.bounds(e) for e in range(5)] == [(0, 6), (0, 10), (0, 14),
                                                    (3, 18), (7, 22)]
    order = window.arrival_ids(np.arange(40))
    assert sorted(order) == list(range(40))  # the arrival order is a perm
    for epoch in range(12):
        start, stop = window.bounds(epoch)
        assert list(window.window_ids(epoch)) == [
            order[a % 40] for a in range(start, stop)
        ]


@pytest.mark.parametrize('world_size', [1, 2, 3, 4])
def test_ranks_cover_the_window_exactly_each_epoch(monkeypatch, world_size):
    samplers = _ranks(23, world_size, monkeypatch, **SCHEDULE)
    window = samplers[0].window
    for epoch in range(9):
        per_rank = _epoch(samplers, epoch)
        size = window.window_size(epoch)
        # Equal per-rank counts (DDP must not hang), as __len__ says.
        assert {len(ids) for ids in per_rank} == {-(-size // world_size)}
        assert len(samplers[0]) == -(-size // world_size)
        seen = Counter(itertools.chain(*per_rank))
        assert set(seen) == set(window.window_ids(epoch).tolist())
        assert sum(seen.values()) - len(seen) <= world_size - 1


def test_round_up_false_drops_the_remainder(monkeypatch):
    samplers = _ranks(23, 4, monkeypatch, round_up=False, **SCHEDULE)
    ids = list(itertools.chain(*_epoch(samplers, 0)))  # window of 6
    assert len(ids) == len(set(ids)) == 4


def test_each_epoch_is_a_seeded_shuffle_of_its_window(monkeypatch):
    n = 50
    first = [_global_stream(n, e, monkeypatch, **SCHEDULE) for e in range(6)]
    again = [_global_stream(n, e, monkeypatch, **SCHEDULE) for e in range(6)]
    assert first == again
    other = dict(SCHEDULE, seed=4)
    assert first != [
        _global_stream(n, e, monkeypatch, **other) for e in range(6)
    ]
    window = GrowingWindow(n, **SCHEDULE)
    for epoch, stream in enumerate(first):
        in_arrival_order = window.window_ids(epoch).tolist()
        assert sorted(stream) == sorted(in_arrival_order)
        # The epoch's shuffle is IndexPermutation's, keyed by the epoch.
        shuffle = IndexPermutation(len(stream), 3, epoch)
        assert stream == [
            in_arrival_order[i] for i in shuffle(np.arange(len(stream)))
        ]
    assert first[3] != first[4]  # reshuffled even with a full window



@pytest.mark.parametrize('shuffle', [True, False])
def test_positions_of_is_the_inverse_of_ids(shuffle):
    # 10 samples, a window of 7 sliding by 3: ids leave and come back.
    window = GrowingWindow(10, 4, 3, 7, seed=2, shuffle=shuffle)
    for epoch in range(8):
        length = window.window_size(epoch)
        ids = window.ids(epoch, np.arange(length))
        assert np.array_equal(window.positions_of(epoch, ids),
                              np.arange(length))
        outside = np.setdiff1d(np.arange(10), ids)
        assert (window.positions_of(epoch, outside) == length).all()

def test_shuffle_false_is_the_plain_arrival_order(monkeypatch):
    schedule = dict(SCHEDULE, shuffle=False)
    assert _global_stream(40, 0, monkeypatch, **schedule) == list(range(6))
    assert _global_stream(40, 4, monkeypatch, **schedule) == list(
        range(7, 22))


@pytest.mark.parametrize('new_world', [1, 2, 3])
def test_fast_forward_continues_the_epoch_in_any_world_size(
        monkeypatch, new_world):
    # The stream is global: whatever world size consumed its first samples,
    # the new ranks continue it.
    n, epoch, consumed = 37, 4, 6
    stream = _global_stream(n, epoch, monkeypatch, **SCHEDULE)
    resumed = _ranks(n, new_world, monkeypatch, **SCHEDULE)
    check_fast_forward(resumed, stream, epoch, consumed)


@pytest.mark.parametrize('n, schedule', [
    (40, SCHEDULE),
    (12, SCHEDULE),  # capacity clamped to N: the window becomes everything
    (20, dict(initial=3, growth=7, capacity=5, seed=1)),  # growth > capacity
    (20, dict(initial=20, growth=0, seed=2)),  # a fixed window
])
def test_changes_are_what_enters_and_leaves_the_window(n, schedule):
    window = GrowingWindow(n, **schedule)
    before = set()
    for epoch in range(10):
        now = set(window.window_ids(epoch).tolist())
        entering, leaving = window.changes(epoch)
        assert len(entering) == len(set(entering.tolist()))
        assert set(entering.tolist()) == now - before
        assert set(leaving.tolist()) == before - now
        before = now


def test_exposures_count_the_epochs_each_sample_is_trained_on(monkeypatch):
    n, epochs = 30, 9
    window = GrowingWindow(n, **SCHEDULE)
    counted = Counter()
    for epoch in range(epochs):
        counted.update(_global_stream(n, epoch, monkeypatch, **SCHEDULE))
    order = window.arrival_ids(np.arange(n))
    exposures = window.exposures(epochs)
    assert {int(order[r]): int(c)
            for r, c in enumerate(exposures) if c} == dict(counted)
    assert exposures.sum() == sum(
        window.window_size(e) for e in range(epochs))
    assert not window.exposures(0).any()
    # Per arrival position (no N-sized array): the first cycle's counts,
    # and the closed form's examples of docs/growing_window.md.
    first = window.exposures(epochs, np.arange(30))
    assert (first <= exposures).all() and first.sum() < exposures.sum()
    big = GrowingWindow(10**9, 50_000, 50_000, 200_000)
    assert big.exposures(12, np.array([0, 49_999, 450_000, 550_000,
                                       600_000])).tolist() == [4, 4, 3, 1, 0]
    no_cap = GrowingWindow(10**9, 50_000, 50_000, 10**9)
    assert no_cap.exposures(12, np.array([0, 60_000,
                                          599_999])).tolist() == [12, 11, 1]


def test_capacity_from_a_byte_budget():
    # The cache also holds the next epoch's `growth` samples.
    assert window_capacity(10**6, 1000, cache_limit='2GB',
                           sample_bytes='100KB') == 19_000
    assert window_capacity(10**6, 24, cache_limit='1GiB',
                           sample_bytes=2**20) == 1000
    assert window_capacity(500, 10) == 500
    sampler = GrowingWindowSampler(
        range(100), 10, 5, cache_limit='3KB', sample_bytes=100, seed=0)
    assert sampler.capacity == 25
    sampler = GrowingWindowSampler(range(100), 500, 5, seed=0)
    assert (sampler.capacity, sampler.initial) == (100, 100)


@pytest.mark.parametrize('kwargs, match', [
    (dict(capacity=5, cache_limit='1GB', sample_bytes=10), 'not both'),
    (dict(cache_limit='1GB'), 'needs sample_bytes'),
    (dict(sample_bytes=10), 'only used with cache_limit'),
    (dict(cache_limit='1 parsec', sample_bytes=10), "cache_limit='1 parsec'"),
    (dict(cache_limit=10, sample_bytes='1MB'), 'holds 0 samples'),
    (dict(cache_limit=20, sample_bytes=10), 'not more than growth=2'),
    (dict(cache_limit=20, sample_bytes=0), 'at least 1 byte'),
    (dict(capacity=0), 'capacity must be'),
    (dict(growth=-1), 'growth must be'),
    (dict(initial=0), 'initial must be'),
    (dict(rounds=3), 'rounds must be >= 4'),
])
def test_bad_arguments_name_what_is_wrong(kwargs, match):
    args = dict(dict(initial=4, growth=2, seed=0), **kwargs)
    with pytest.raises(ValueError, match=match):
        GrowingWindowSampler(range(10), **args)


def test_positions_outside_the_window_are_refused():
    window = GrowingWindow(10, **SCHEDULE)
    with pytest.raises(IndexError, match='epoch 0 trains on 6 samples'):
        window.ids(0, np.array([6]))


def test_a_seed_set_after_build_takes_effect(monkeypatch):
    (sampler, ) = _ranks(60, 1, monkeypatch, **SCHEDULE)
    sampler.set_epoch(3)
    first = list(sampler)
    sampler.seed = 11  # e.g. re-applied from a checkpoint on resume
    other = _global_stream(60, 3, monkeypatch, **dict(SCHEDULE, seed=11))
    assert list(sampler) == other != first
    assert sampler.window_ids(3).tolist() != GrowingWindow(
        60, **SCHEDULE).window_ids(3).tolist()


def _loader(seed, workers):
    sampler = GrowingWindowSampler(list(range(40)),
                                   **dict(SCHEDULE, seed=seed))
    return DataLoader(
        list(range(40)),
        batch_size=4,
        sampler=sampler,
        num_workers=workers,
        collate_fn=list)


def _read(loader, batches, meta=None, iteration=0):
    resumer = DataStreamResumer(loader, seed=0, seed_per_sample=False)
    iterator = ResumableDataloaderIterator(
        loader, resumer.position, epoch_transition_sleep=0)
    if meta is not None:
        resumer.load_checkpoint_meta(meta)
    report = resumer.resume(iteration)
    out = []
    for _ in range(batches):
        batch = [int(i) for i in next(iterator)]
        out.append((resumer.position.epoch, batch))
    return out, resumer.state_dict(), report


def test_the_loops_resume_the_window_stream_with_workers():
    # Windows of 6, 10, 14, 15 ... samples: 2, 3, 4, 4 batches of 4.
    reference, _, _ = _read(_loader(3, 0), 14)
    assert [epoch for epoch, _ in reference] == [0] * 2 + [1] * 3 + [
        2] * 4 + [3] * 4 + [4]
    window = GrowingWindow(40, **SCHEDULE)
    for epoch in range(4):
        assert sorted(i for e, batch in reference if e == epoch
                      for i in batch) == sorted(
                          window.window_ids(epoch).tolist())
    _, state, _ = _read(_loader(3, 2), 7)
    assert (state['epoch'], state['samples_in_epoch']) == (2, 8)
    rest, _, report = _read(
        _loader(99, 2), 7, dict(data_position=state), iteration=7)
    assert report.strategy == 'fast_forward'
    assert rest == reference[7:]
    # A stock checkpoint (meta.iter and meta.seed only): epochs differ in
    # length, so the stream is replayed from its start, indices only.
    rest, _, report = _read(_loader(99, 2), 7, dict(seed=3), iteration=7)
    assert report.strategy == 'stream_replay'
    assert rest == reference[7:]
