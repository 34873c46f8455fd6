"""Belady's furthest-next-use caching, with bypass, over a known stream.

Reading a sample at tick ``t`` either finds the copy kept since its
previous read (a hit) or needs a download. After the read, the sample is
kept until its next read ``n`` only if that fits the byte budget: items
kept for *later* reads than ``n`` are dropped to make room (their next read
becomes a download), and if that is not enough, the sample is not kept
(bypass). For equal sizes this is Belady's MIN, the most hits any policy
can get; the online planner and the offline simulator share this class.
"""
import heapq
from typing import Dict, List, NamedTuple, Optional

import numpy as np

#: Next use of a sample read no more within the known future.
NEVER = -1
#: Next use of a sample read again beyond the look-ahead (tick unknown):
#: later than every known next use, so such samples are kept only in room
#: nothing sooner needs, and dropped first (for one shuffled stream that
#: is keep-a-fixed-set, its optimum). Read while kept, it is a hit.
BEYOND = 1 << 62


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


class BeladyCache:
    """The set of kept samples under a byte budget.

    Args:
        capacity (int): Bytes the kept samples may use.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.used = 0
        self.until: Dict[int, int] = {}
        self.sizes: Dict[int, int] = {}
        # Max-heap by next use (negated); entries whose sample is gone or
        # was re-kept for another read are skipped when they surface.
        self._heap: list = []

    def _discard(self, sample: int) -> None:
        del self.until[sample]
        self.used -= self.sizes.pop(sample)

    def _furthest(self):
        while self._heap:
            negative, sample = self._heap[0]
            if self.until.get(sample) == -negative:
                return -negative, sample
            heapq.heappop(self._heap)
        return None

    def keep(self, sample: int, until: int, size: int) -> None:
        """Count ``sample`` as kept until tick ``until`` (already on disk)."""
        if sample in self.until:
            self._discard(sample)
        self.until[sample] = until
        self.sizes[sample] = size
        self.used += size
        heapq.heappush(self._heap, (-until, sample))

    def resize(self, capacity: int) -> List[int]:
        """Set the capacity to ``capacity``; the samples dropped to fit,
        those needed furthest ahead first."""
        self.capacity = int(capacity)
        dropped = []
        while self.used > self.capacity:
            _, sample = self._furthest()
            heapq.heappop(self._heap)
            self._discard(sample)
            dropped.append(sample)
        return dropped

    def kept_by_next_use(self):
        """Kept samples, the one needed furthest ahead first."""
        return sorted(self.until, key=self.until.get, reverse=True)

    def access(self, tick: int, sample: int, size: int,
               next_use: int) -> Decision:
        """Read ``sample`` at ``tick``; ``next_use`` is its next tick or
        :data:`NEVER`."""
        hit = self.until.get(sample) in (tick, BEYOND)
        if sample in self.until:
            self._discard(sample)
        if next_use == NEVER:
            return Decision(tick, sample, hit, None, [])
        dropped = self.admit(sample, next_use, size)
        if dropped is None:
            return Decision(tick, sample, hit, None, [])
        return Decision(tick, sample, hit, next_use, dropped)

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
            heapq.heappop(self._heap)
            victims.append(top)
            freed += self.sizes[top[1]]
        if self.used - freed + size > self.capacity:
            # Not enough is needed later than this sample: keep them all.
            for later, victim in victims:
                heapq.heappush(self._heap, (-later, victim))
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
