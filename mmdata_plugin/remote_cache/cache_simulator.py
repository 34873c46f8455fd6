"""Offline hit rates of caching policies on a recorded node trace.

The yardsticks of the remote cache benchmark: on the same sequence of
sample reads and the same byte budget, how many reads a policy serves from
disk and how many bytes it downloads.

* ``belady_bypass``: furthest next use, a sample needed later than
  everything kept is not kept (:class:`~.belady.BeladyCache`, the planner's
  own rule, here with the whole trace known). For equal sizes no policy
  downloads less: its remote bytes are the optimum.
* ``lru``: keep every download, drop the least recently read.
* ``fixed_set``: keep what is downloaded while there is room, never drop
  (CoorDL's MinIO).
"""
from collections import OrderedDict
from typing import Dict, NamedTuple, Sequence, Union

import numpy as np

from .belady import BeladyCache, next_uses

POLICIES = ('belady_bypass', 'lru', 'fixed_set')


class PolicyResult(NamedTuple):
    reads: int
    hits: int
    remote_bytes: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.reads if self.reads else 0.0


def _size_lookup(sizes: Union[int, Sequence[int], np.ndarray]):
    if np.isscalar(sizes):
        return lambda sample: int(sizes)
    sizes = np.asarray(sizes)
    return lambda sample: int(sizes[sample])


def belady_bypass(trace: np.ndarray, sizes, capacity: int) -> PolicyResult:
    size_of = _size_lookup(sizes)
    cache = BeladyCache(capacity)
    following = next_uses(trace)
    hits = missed = 0
    for tick, (sample, next_use) in enumerate(
            zip(trace.tolist(), following.tolist())):
        size = size_of(sample)
        if cache.access(tick, sample, size, next_use).hit:
            hits += 1
        else:
            missed += size
    return PolicyResult(len(trace), hits, missed)


def lru(trace: np.ndarray, sizes, capacity: int) -> PolicyResult:
    size_of = _size_lookup(sizes)
    kept: OrderedDict = OrderedDict()
    used = hits = missed = 0
    for sample in trace.tolist():
        if sample in kept:
            kept.move_to_end(sample)
            hits += 1
            continue
        size = size_of(sample)
        missed += size
        if size > capacity:
            continue
        while used + size > capacity:
            used -= kept.popitem(last=False)[1]
        kept[sample] = size
        used += size
    return PolicyResult(len(trace), hits, missed)


def fixed_set(trace: np.ndarray, sizes, capacity: int) -> PolicyResult:
    size_of = _size_lookup(sizes)
    kept = set()
    used = hits = missed = 0
    for sample in trace.tolist():
        if sample in kept:
            hits += 1
            continue
        size = size_of(sample)
        missed += size
        if used + size <= capacity:
            kept.add(sample)
            used += size
    return PolicyResult(len(trace), hits, missed)


def simulate(trace: Sequence[int], sizes,
             capacity: int) -> Dict[str, PolicyResult]:
    """Every policy of :data:`POLICIES` on ``trace`` at ``capacity`` bytes.

    Args:
        trace (Sequence[int]): Sample ids in read order (one node).
        sizes (int | array): Bytes of every sample (indexed by id), or one
            size for all.
        capacity (int): Byte budget of the kept samples.
    """
    trace = np.asarray(trace, np.int64)
    return {
        name: policy(trace, sizes, int(capacity))
        for name, policy in zip(POLICIES, (belady_bypass, lru, fixed_set))
    }
