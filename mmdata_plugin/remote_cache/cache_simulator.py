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
from typing import Dict, List, NamedTuple, Sequence, Union

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


def belady_bypass(trace: np.ndarray, size_of, capacity: int) -> np.ndarray:
    sizes = np.fromiter((size_of(sample) for sample in trace.tolist()),
                        np.int64, len(trace))
    return BeladyCache(capacity).hits(
        np.arange(len(trace)), trace, sizes, next_uses(trace))


def lru(trace: np.ndarray, size_of, capacity: int) -> np.ndarray:
    kept: OrderedDict = OrderedDict()
    used = 0
    hits = np.zeros(len(trace), bool)
    for tick, sample in enumerate(trace.tolist()):
        if sample in kept:
            kept.move_to_end(sample)
            hits[tick] = True
            continue
        size = size_of(sample)
        if size > capacity:
            continue
        while used + size > capacity:
            used -= kept.popitem(last=False)[1]
        kept[sample] = size
        used += size
    return hits


def fixed_set(trace: np.ndarray, size_of, capacity: int) -> np.ndarray:
    kept = set()
    used = 0
    hits = np.zeros(len(trace), bool)
    for tick, sample in enumerate(trace.tolist()):
        if sample in kept:
            hits[tick] = True
            continue
        size = size_of(sample)
        if used + size <= capacity:
            kept.add(sample)
            used += size
    return hits


def simulate_segments(trace: Sequence[int], sizes, capacity: int,
                      bounds: Sequence[int]) -> Dict[str, List[PolicyResult]]:
    """Every policy of :data:`POLICIES` on ``trace`` at ``capacity`` bytes,
    counted per segment ``bounds[i] <= tick < bounds[i + 1]`` (e.g. per
    epoch; the policies see the whole trace).

    Args:
        trace (Sequence[int]): Sample ids in read order (one node).
        sizes (int | array): Bytes of every sample (indexed by id), or one
            size for all.
        capacity (int): Byte budget of the kept samples.
        bounds (Sequence[int]): Segment boundaries, ascending ticks.
    """
    trace = np.asarray(trace, np.int64)
    size_of = _size_lookup(sizes)
    read_bytes = np.fromiter((size_of(s) for s in trace.tolist()), np.int64,
                             len(trace))
    results = {}
    for name, policy in zip(POLICIES, (belady_bypass, lru, fixed_set)):
        hits = policy(trace, size_of, int(capacity))
        results[name] = [
            PolicyResult(stop - start, int(hits[start:stop].sum()),
                         int(read_bytes[start:stop][~hits[start:stop]].sum()))
            for start, stop in zip(bounds[:-1], bounds[1:])
        ]
    return results


def simulate(trace: Sequence[int], sizes,
             capacity: int) -> Dict[str, PolicyResult]:
    """Every policy of :data:`POLICIES` on ``trace`` at ``capacity`` bytes.

    Args:
        trace (Sequence[int]): Sample ids in read order (one node).
        sizes (int | array): Bytes of every sample (indexed by id), or one
            size for all.
        capacity (int): Byte budget of the kept samples.
    """
    segments = simulate_segments(trace, sizes, capacity, [0, len(trace)])
    return {name: whole for name, (whole, ) in segments.items()}
