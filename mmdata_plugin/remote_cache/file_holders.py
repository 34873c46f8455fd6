"""Which booked samples read each cached file, by the file's digest.

Samples may share a file (one per person of a picture, a repeated data
set): a file stays while any sample booking it needs it. Nearly every
file has one reader, so one holder is kept as a bare int and a set only
from the second (a set of one costs ~200 bytes a kept sample).
"""
from typing import Dict, Set, Union


class FileHolders:
    """The samples booking each file digest."""

    def __init__(self) -> None:
        self._holders: Dict[str, Union[int, Set[int]]] = {}

    def __contains__(self, digest: str) -> bool:
        return digest in self._holders

    def __len__(self) -> int:
        return len(self._holders)

    def add(self, digest: str, sample: int) -> int:
        """Book ``sample`` as a reader of ``digest``; its readers now."""
        held = self._holders.get(digest)
        if held is None or held == sample:
            self._holders[digest] = sample
            return 1
        if isinstance(held, int):
            held = self._holders[digest] = {held}
        held.add(sample)
        return len(held)

    def remove(self, digest: str, sample: int) -> bool:
        """Take ``sample`` off ``digest``'s readers; True when none is
        left (the file is off the books)."""
        held = self._holders.get(digest)
        if held is None:
            return True
        if isinstance(held, int):
            if held != sample:
                return False
            del self._holders[digest]
            return True
        held.discard(sample)
        if len(held) == 1:
            self._holders[digest] = next(iter(held))
        return not held

    def of(self, digest: str) -> Set[int]:
        """The samples booking ``digest`` (empty if none)."""
        held = self._holders.get(digest)
        if held is None:
            return set()
        return {held} if isinstance(held, int) else set(held)

    def count(self, digest: str) -> int:
        held = self._holders.get(digest)
        if held is None:
            return 0
        return 1 if isinstance(held, int) else len(held)
