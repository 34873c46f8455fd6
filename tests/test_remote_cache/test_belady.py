"""BeladyCache's compact kept set: the decisions of a plain reference, in a
few bytes per sample."""
import tracemalloc

import numpy as np
import pytest

from mmdata_plugin.remote_cache import belady
from mmdata_plugin.remote_cache.belady import (BEYOND, NEVER, BeladyCache,
                                               next_uses)


class ScanBelady:
    """Reference: the kept samples in a dict, the one to drop found by a
    scan (furthest next use, ties: lowest id)."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.kept = {}

    @property
    def used(self):
        return sum(size for _, size in self.kept.values())

    def _room_after(self, victims, size):
        freed = sum(self.kept[victim][1] for victim in victims)
        return self.used - freed + size <= self.capacity

    def _furthest(self, taken=()):
        rest = [sample for sample in self.kept if sample not in taken]
        return max(rest,
                   key=lambda sample: (self.kept[sample][0], -sample),
                   default=None)

    def keep(self, sample, until, size):
        self.kept[sample] = (until, size)

    def resize(self, capacity):
        self.capacity = capacity
        dropped = []
        while self.used > capacity:
            dropped.append(self._furthest())
            del self.kept[dropped[-1]]
        return dropped

    def admit(self, sample, until, size):
        if size > self.capacity:
            return None
        victims = []
        while not self._room_after(victims, size):
            victim = self._furthest(victims)
            if victim is None or self.kept[victim][0] <= until:
                return None
            victims.append(victim)
        for victim in victims:
            del self.kept[victim]
        self.keep(sample, until, size)
        return victims

    def access(self, tick, sample, size, next_use):
        until = self.kept.pop(sample, (None, ))[0]
        hit = until in (tick, BEYOND)
        if next_use == NEVER:
            return hit, None
        return hit, self.admit(sample, next_use, size)


def random_run(seed):
    """Reads, keeps, admits and resizes of a random stream on both; every
    decision and the kept set compared."""
    rng = np.random.default_rng(seed)
    samples = int(rng.integers(5, 60))
    trace = rng.integers(0, samples, 500)
    following = next_uses(trace)
    # Some reads again beyond the look-ahead: ties in the eviction order.
    following[(following >= 0) & (rng.random(len(trace)) < 0.2)] = BEYOND
    sizes = (rng.integers(1, 6, samples)
             if seed % 2 else np.ones(samples, np.int64))
    capacity = int(rng.integers(2, 25))
    cache, reference = BeladyCache(capacity), ScanBelady(capacity)
    for tick, sample in enumerate(trace.tolist()):
        size = int(sizes[sample])
        if rng.random() < 0.02:
            capacity = int(rng.integers(1, 30))
            assert cache.resize(capacity) == reference.resize(capacity)
        other = int(rng.integers(0, samples))
        if rng.random() < 0.03 and other not in reference.kept:
            until = tick + int(rng.integers(1, 100))
            assert cache.admit(other, until, int(sizes[other])) == \
                reference.admit(other, until, int(sizes[other]))
        decision = cache.access(tick, sample, size, int(following[tick]))
        dropped = None if decision.keep_until is None else decision.dropped
        assert (decision.hit, dropped) == reference.access(
            tick, sample, size, int(following[tick])), (seed, tick)
        assert cache.used == reference.used
        assert cache.count == len(reference.kept)
    assert sorted(cache.kept().tolist()) == sorted(reference.kept)
    assert {
        sample: cache.next_use(sample)
        for sample in cache.kept().tolist()
    } == {sample: until
          for sample, (until, _) in reference.kept.items()}


@pytest.mark.parametrize('front', [1, 3, 1 << 16])
def test_decisions_equal_a_scan_of_the_kept_set(monkeypatch, front):
    # A front of 1 or 3 samples is used up and refilled every few
    # evictions; 65,536 is never used up here.
    monkeypatch.setattr(belady, '_FRONT_MIN', front)
    for seed in range(60):
        random_run(seed)


def test_hits_are_those_of_access():
    rng = np.random.default_rng(5)
    trace = np.concatenate([rng.permutation(300) for _ in range(3)])
    sizes = rng.integers(1, 4, len(trace))
    following = next_uses(trace)
    one = BeladyCache(150)
    each = [
        one.access(tick, sample, size, next_use).hit
        for tick, (sample, size, next_use) in enumerate(
            zip(trace.tolist(), sizes.tolist(), following.tolist()))
    ]
    hits = BeladyCache(150).hits(np.arange(len(trace)), trace, sizes,
                                 following)
    assert hits.tolist() == each and 0 < sum(each) < len(trace)


def test_kept_set_costs_bytes_per_kept_sample_not_per_id(monkeypatch):
    # 100,000 samples of ids up to 1e8 kept, then 80,000 (the front used
    # up and refilled): rows of 16 bytes (grown by an eighth), an index of
    # 5-11 bytes a kept sample and a front of 1/64 of the kept set; no
    # array by sample id (12 bytes an id, 1.2 GB here) and no Python
    # object per kept sample (a dict and heap entry each cost ~250 bytes).
    monkeypatch.setattr(belady, '_FRONT_MIN', 256)
    ids, count = 10**8, 100_000
    rng = np.random.default_rng(0)
    kept = rng.choice(ids, count, replace=False).tolist()
    untils = rng.permutation(10 * count)[:count].tolist()
    tracemalloc.start()
    cache = BeladyCache(count)
    for sample, until in zip(kept, untils):
        cache.keep(sample, until, 1)
    dropped = cache.resize(count * 4 // 5)
    furthest = sorted(zip(untils, kept), reverse=True)[:count // 5]
    assert dropped == [sample for _, sample in furthest]
    del dropped, furthest
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert cache.count == count * 4 // 5
    assert held / count <= 32, held / count
    assert cache.nbytes / count <= 32, cache.nbytes / count


def test_sizes_past_4_gib_and_bad_ids():
    cache = BeladyCache(1 << 40)
    cache.keep(3, 10, 5 << 32)
    cache.keep(4, 8, 7)
    assert cache.used == (5 << 32) + 7
    assert cache.resize(1 << 32) == [3] and cache.used == 7
    with pytest.raises(ValueError, match='sample ids must be >= 0, got -2'):
        cache.keep(-2, 10, 1)
    assert -2 not in cache and 10**9 not in cache
    assert cache.next_use(4) == 8 and cache.next_use(10**9) is None


def test_keep_all_is_keep_one_by_one():
    rng = np.random.default_rng(7)
    samples = rng.permutation(40)[:20]
    untils = rng.permutation(500)[:20]
    sizes = rng.integers(1, 6, 20)
    together, one_by_one = BeladyCache(100), BeladyCache(100)
    for cache in (together, one_by_one):
        cache.keep(int(samples[3]), 7, 9)  # kept before: kept again
        cache.keep(45, 600, 2)
    together.keep_all(samples, untils, sizes)
    for sample, until, size in zip(samples.tolist(), untils.tolist(),
                                   sizes.tolist()):
        one_by_one.keep(sample, until, size)
    assert (together.used, together.count) == (one_by_one.used,
                                               one_by_one.count)
    assert together.resize(20) == one_by_one.resize(20)
    assert together.admit(41, 250, 4) == one_by_one.admit(41, 250, 4)
    with pytest.raises(ValueError, match='distinct sample ids'):
        together.keep_all([1, 1], [5, 6], [1, 1])
