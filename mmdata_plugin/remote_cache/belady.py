"""Belady's furthest-next-use caching, with bypass, over a known stream.

Reading a sample at tick ``t`` either finds the copy kept since its
previous read (a hit) or needs a download. After the read, the sample is
kept until its next read ``n`` only if that fits the byte budget: items
kept for *later* reads than ``n`` are dropped to make room (their next read
becomes a download), and if that is not enough, the sample is not kept
(bypass). For equal sizes this is Belady's MIN, the most hits any policy
can get; the online planner and the offline simulator share this class.

The kept set lives in numpy rows keyed by sample id (:class:`~.id_table.
IdTable`: next use and size, 21-29 bytes a kept sample, plus ~4 for the
eviction order, see :class:`BeladyCache`), whatever the number of ids: a
node keeping 1e7 samples of 1e9 plans in ~0.25 GB, where arrays indexed
by sample id took 12 GB and Python dicts and heap tuples ~250 bytes a
kept sample.
"""
import heapq
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from .id_table import IdTable
#: Next use of a sample read no more within the known future.
NEVER = -1
#: Next use of a sample read again beyond the look-ahead (tick unknown):
#: later than every known next use, so such samples are kept only in room
#: nothing sooner needs, and dropped first (for one shuffled stream that
#: is keep-a-fixed-set, its optimum). Read while kept, it is a hit.
BEYOND = 1 << 62

#: Next use of a sample not kept (it has no row).
_NOT_KEPT = np.iinfo(np.int64).min
#: Next use of a sample taken as a victim by ``admit`` that may still be
#: put back (its other heap entries must not surface).
_TAKEN = _NOT_KEPT + 1
#: Fewest entries of the front (the kept samples needed furthest ahead,
#: in eviction order); it holds a 64th of the kept set beyond this, so
#: refills (a scan of the kept set) come every ``kept / 64`` evictions.
_FRONT_MIN = 1 << 16
#: Kept samples scanned at once when the front is refilled (bounds the
#: scan's work arrays).
_SCAN = 1 << 22


class Decision(NamedTuple):
    """What happens at one tick.

    ``hit``: the sample was kept since its previous read. ``keep_until``:
    the tick of its next read when it is kept for it, else None.
    ``dropped``: samples no longer kept from this tick on (their next read
    becomes a download).
    """
    tick: int
    sample: int
    hit: bool
    keep_until: Optional[int]
    dropped: List[int]


def _furthest_first(untils: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """Order of ``(untils, samples)`` pairs, the one to drop first last:
    by next use, ties by the higher sample id first."""
    return np.lexsort((-samples, untils))


class BeladyCache:
    """The set of kept samples under a byte budget.

    Per kept sample, a row of an :class:`~.id_table.IdTable`: its id
    (uint32, int64 from the first id of 2**32), its next use (int64) and
    its size (uint32, int64 once a sample of 4 GiB or more is kept), 16
    bytes, rows grown by an eighth, plus 5-11 bytes of the table's index:
    21-29 bytes a kept sample, nothing for the ids not kept. What the eviction order needs beyond that is O(kept / 64): the
    *front*, the kept samples needed furthest ahead in eviction order
    (numpy arrays, 16 bytes an entry, refilled by a scan of the rows when
    used up), and a heap of the samples kept since the front was filled
    with a next use past its least one (at most twice the front, ~128
    bytes an entry; a refill folds it in).

    Args:
        capacity (int): Bytes the kept samples may use.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.used = 0
        self._kept = IdTable(dict(until=np.int64, size=np.uint32),
                             keys=np.uint32)
        # The front: kept samples in eviction order (furthest needed
        # last), read from index _top down; every kept sample whose
        # (next use, -id) is at least _floor's is in it or in _late.
        # Entries of samples since dropped or kept for another read are
        # skipped when they surface.
        self._front_until = np.empty(0, np.int64)
        self._front_sample = np.empty(0, np.int64)
        self._top = -1
        self._floor: Optional[Tuple[int, int]] = None
        # Max-heap (negated next use, id) of samples kept past _floor.
        self._late: list = []
        self._late_limit = 2 * _FRONT_MIN

    # -- kept rows ------------------------------------------------------------

    @property
    def count(self) -> int:
        """Samples kept."""
        return len(self._kept)

    @property
    def nbytes(self) -> int:
        """Bytes of the kept set: its rows, its front and the heap past it
        (a tuple, two ints and a list slot an entry)."""
        return (self._kept.nbytes + self._front_until.nbytes +
                self._front_sample.nbytes + 128 * len(self._late))

    def _until_of(self, sample: int) -> int:
        row = self._kept.row(sample)
        return _NOT_KEPT if row < 0 else \
            self._kept.columns['until'].item(row)

    def _set_until(self, sample: int, until: int) -> None:
        self._kept.columns['until'][self._kept.row(sample)] = until

    def __contains__(self, sample: int) -> bool:
        return self._until_of(sample) > _TAKEN

    def next_use(self, sample: int) -> Optional[int]:
        """The tick ``sample`` is kept until, or None when not kept."""
        until = self._until_of(sample)
        return until if until > _TAKEN else None

    def kept(self) -> np.ndarray:
        """Ids of the kept samples, ascending."""
        kept = self._kept.column('until') > _TAKEN
        return np.sort(self._kept.row_keys()[kept])

    def kept_by_next_use(
            self,
            most: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """``(samples, next uses)`` of the kept samples, the one needed
        furthest ahead first; with ``most``, the first ``most`` of them,
        found by a partition, not a sort of them all (the prefetcher's
        victims are asked of up to 1e7 kept samples every half second)."""
        untils = self._kept.column('until')
        kept = untils > _TAKEN
        samples, untils = self._kept.row_keys()[kept], untils[kept]
        if most is not None and most < len(untils):
            # Every sample at or past the most-th furthest next use (ties
            # at it included): the sort of those orders ties as a full one.
            cut = np.partition(untils, len(untils) - most)[-most]
            chosen = untils >= cut
            samples, untils = samples[chosen], untils[chosen]
        order = _furthest_first(untils, samples)[::-1][:most]
        return samples[order], untils[order]

    def _discard(self, sample: int) -> None:
        self.used -= self._kept.columns['size'].item(self._kept.row(sample))
        self._kept.remove(sample)

    def keep(self, sample: int, until: int, size: int) -> None:
        """Count ``sample`` as kept until tick ``until`` (already on disk)."""
        if sample < 0:
            raise ValueError(f'sample ids must be >= 0, got {sample}')
        self._kept.fit('size', size)
        row = self._kept.row(sample)
        if row < 0:
            row = self._kept.insert(sample)
        else:
            self.used -= self._kept.columns['size'].item(row)
        self._kept.columns['until'][row] = until
        self._kept.columns['size'][row] = size
        self.used += size
        if self._floor is None or (until, -sample) >= self._floor:
            heapq.heappush(self._late, (-until, sample))
            if len(self._late) > self._late_limit:
                self._refill()

    def keep_all(self, samples: np.ndarray, untils: np.ndarray,
                 sizes: np.ndarray) -> None:
        """:meth:`keep` for many samples at once (distinct ids)."""
        samples = np.asarray(samples, np.int64)
        if len(np.unique(samples)) != len(samples):
            raise ValueError('keep_all needs distinct sample ids')
        if not len(samples):
            return
        if samples.min() < 0:
            raise ValueError(
                f'sample ids must be >= 0, got {int(samples.min())}')
        sizes = np.asarray(sizes, np.int64)
        self._kept.fit('size', int(sizes.max()))
        rows = self._kept.rows(samples)
        was = rows >= 0
        self.used -= int(self._kept.columns['size'][rows[was]].sum())
        rows[~was] = self._kept.insert_many(samples[~was])
        self._kept.columns['until'][rows] = untils
        self._kept.columns['size'][rows] = sizes
        self.used += int(sizes.sum())
        self._refill()

    # -- eviction order ------------------------------------------------------

    def _refill(self) -> None:
        """Fill the front with the kept samples needed furthest ahead (a
        scan of the kept rows, in slices)."""
        size = max(_FRONT_MIN, self.count >> 6)
        self._late_limit = 2 * size
        untils = np.empty(0, np.int64)
        samples = np.empty(0, np.int64)
        kept_untils, kept_samples = self._kept.column('until'), \
            self._kept.keys
        for start in range(0, len(kept_untils), _SCAN):
            part = kept_untils[start:start + _SCAN]
            least = untils[0] if len(untils) == size else _TAKEN + 1
            chosen = np.flatnonzero(part >= least)
            untils = np.concatenate([untils, part[chosen]])
            samples = np.concatenate([
                samples,
                kept_samples[start:start + _SCAN][chosen].astype(np.int64)
            ])
            order = _furthest_first(untils, samples)[-size:]
            untils, samples = untils[order], samples[order]
        self._front_until, self._front_sample = untils, samples
        self._top = len(untils) - 1
        self._floor = ((untils.item(0), -samples.item(0))
                       if len(untils) == size else None)
        self._late = []

    def _furthest(self) -> Optional[Tuple[int, int, bool]]:
        """``(next use, sample, from the front)`` of the kept sample needed
        furthest ahead (ties: the lowest id), or None when none is kept."""
        until, sample = self._front_until, self._front_sample
        while True:
            while self._top >= 0 and until.item(self._top) != \
                    self._until_of(sample.item(self._top)):
                self._top -= 1
            while self._late and -self._late[0][0] != \
                    self._until_of(self._late[0][1]):
                heapq.heappop(self._late)
            if self._top >= 0:
                front = (until.item(self._top), sample.item(self._top))
                if not self._late or (front[0], -front[1]) > (
                        -self._late[0][0], -self._late[0][1]):
                    return front + (True, )
            if self._late:
                return -self._late[0][0], self._late[0][1], False
            if self._floor is None or not self.count:
                return None
            # Used up, yet samples needed sooner are kept.
            self._refill()
            until, sample = self._front_until, self._front_sample

    def _pop(self, from_front: bool) -> None:
        if from_front:
            self._top -= 1
        else:
            heapq.heappop(self._late)

    def resize(self, capacity: int) -> List[int]:
        """Set the capacity to ``capacity``; the samples dropped to fit,
        those needed furthest ahead first."""
        self.capacity = int(capacity)
        dropped = []
        while self.used > self.capacity:
            _, sample, from_front = self._furthest()
            self._pop(from_front)
            self._discard(sample)
            dropped.append(sample)
        return dropped

    # -- reads ---------------------------------------------------------------

    def access(self, tick: int, sample: int, size: int,
               next_use: int) -> Decision:
        """Read ``sample`` at ``tick``; ``next_use`` is its next tick or
        :data:`NEVER`."""
        hit, dropped = self._read(tick, sample, size, next_use)
        if dropped is None:
            return Decision(tick, sample, hit, None, [])
        return Decision(tick, sample, hit, next_use, dropped)

    def hits(self, ticks: np.ndarray, samples: np.ndarray,
             sizes: np.ndarray, next_uses: np.ndarray) -> np.ndarray:
        """:meth:`access` for reads in tick order; only whether each hit
        (the simulator's and the benchmark's path: no Decision per read).
        """
        found = np.empty(len(ticks), bool)
        read = self._read
        for index, (tick, sample, size, next_use) in enumerate(
                zip(ticks.tolist(), samples.tolist(), sizes.tolist(),
                    next_uses.tolist())):
            found[index] = read(tick, sample, size, next_use)[0]
        return found

    def _read(self, tick: int, sample: int, size: int,
              next_use: int) -> Tuple[bool, Optional[List[int]]]:
        """Whether the read hits, and the samples dropped to keep it (None:
        not kept)."""
        until = self._until_of(sample)
        hit = until == tick or until == BEYOND
        if until > _TAKEN:
            self._discard(sample)
        if next_use == NEVER:
            return hit, None
        return hit, self.admit(sample, next_use, size)

    def admit(self, sample: int, until: int,
              size: int) -> Optional[List[int]]:
        """Keep ``sample`` (not kept now) until tick ``until`` if that fits
        once samples kept for *later* reads are dropped; the dropped
        samples, or None when it does not fit (bypass: nothing dropped).
        """
        if size > self.capacity:
            return None
        victims = []
        freed = 0
        while self.used - freed + size > self.capacity:
            top = self._furthest()
            if top is None or top[0] <= until:
                break
            later, victim, from_front = top
            self._pop(from_front)
            # (its other entries, if any, no longer match)
            self._set_until(victim, _TAKEN)
            victims.append((later, victim))
            freed += self._kept.columns['size'].item(self._kept.row(victim))
        if self.used - freed + size > self.capacity:
            # Not enough is needed later than this sample: keep them all.
            for later, victim in victims:
                self._set_until(victim, later)
                heapq.heappush(self._late, (-later, victim))
            return None
        dropped = []
        for _, victim in victims:
            self._discard(victim)
            dropped.append(victim)
        self.keep(sample, until, size)
        return dropped


def next_uses(ids: np.ndarray, known: Optional[int] = None) -> np.ndarray:
    """For each index ``i``, the next index with the same id, else NEVER.

    Args:
        ids (np.ndarray): Sample ids by tick.
        known (int, optional): Only ticks ``< known`` get an answer (the
            rest of ``ids`` is look-ahead); defaults to all.
    """
    ids = np.asarray(ids, np.int64)
    order = np.argsort(ids, kind='stable')
    following = np.full(len(ids), NEVER, np.int64)
    same = ids[order[1:]] == ids[order[:-1]]
    following[order[:-1][same]] = order[1:][same]
    return following if known is None else following[:known]
