"""Shared-memory blocks that a DataLoader worker writes again and again.

A fresh shared-memory segment per batch costs the worker a page fault per
4 KiB page at its first write (a 38.5 MB batch of 256 images: ~9,400
faults, about four times the copy itself). Each worker keeps a few slots
instead: segments it has written before, reused once the training process
is done with the batch in them. The first 64 bytes of a slot are its
header; the worker marks a slot busy there before sending it, and the
training process marks it free when the last tensor viewing the batch dies
(:func:`lease`), so a slot is never written while anything reads it. When
every slot is busy (a consumer keeps batches), the worker takes a one-off
segment, as without slots.
"""
import os
import weakref
from typing import List, Optional

import numpy as np
import torch

from ..utils.shared_bytes import new_shared_bytes, storage_bytes

#: Bytes before a slot's payload; byte 0 is the busy flag.
HEADER_BYTES = 64
#: Slots a worker keeps at most: the batches it has in flight (the
#: DataLoader's prefetch_factor, 2 by default) plus the one being consumed.
MAX_SLOTS = 4
#: Once batches vary in size (detection), a new slot is this much larger
#: than the largest batch so far, so that the next ones fit.
HEADROOM = 1.25
_FREE, _BUSY = 0, 1


class _Slot:
    __slots__ = ('block', 'flag')

    def __init__(self, nbytes: int) -> None:
        self.block = new_shared_bytes(nbytes)
        self.flag = self.block[:1].numpy()
        self.flag[0] = _FREE

    @property
    def payload_bytes(self) -> int:
        return self.block.numel() - HEADER_BYTES

    def take(self, nbytes: int) -> torch.Tensor:
        self.flag[0] = _BUSY
        return self.block[HEADER_BYTES:HEADER_BYTES + nbytes]


class BlockSlots:
    """One worker process's slots.

    Args:
        max_slots (int): How many it keeps at most. Defaults to
            :data:`MAX_SLOTS`.
    """

    def __init__(self, max_slots: int = MAX_SLOTS) -> None:
        self.max_slots = max_slots
        self.pid = os.getpid()
        self.slots: List[_Slot] = []
        self.capacity = 0  # of the slots made from now on

    def take(self, nbytes: int) -> Optional[torch.Tensor]:
        """A payload of ``nbytes`` in a free slot (marked busy), or None
        when every slot is busy."""
        free = [slot for slot in self.slots if slot.flag[0] == _FREE]
        for slot in free:
            if slot.payload_bytes >= nbytes:
                return slot.take(nbytes)
        if len(self.slots) >= self.max_slots:
            if not free:
                return None
            # A free slot too small for this batch makes room for one
            # that fits (its segment goes when its last mapping does).
            self.slots.remove(free[0])
        if nbytes > self.capacity:
            self.capacity = (
                int(nbytes * HEADROOM) if self.capacity else nbytes)
        slot = _Slot(HEADER_BYTES + self.capacity)
        self.slots.append(slot)
        return slot.take(nbytes)


_SLOTS: List[BlockSlots] = []


def worker_slots() -> BlockSlots:
    """This process's slots (a forked worker gets its own, not its
    parent's)."""
    if not _SLOTS or _SLOTS[0].pid != os.getpid():
        _SLOTS[:] = [BlockSlots()]
    return _SLOTS[0]


def _release(flag: np.ndarray) -> None:
    flag[0] = _FREE


def lease(payload: torch.Tensor) -> torch.Tensor:
    """The payload of a received slot, as a tensor whose death frees the
    slot.

    Args:
        payload (Tensor): The uint8 payload, a view of the slot's segment
            at :data:`HEADER_BYTES`.

    Returns:
        Tensor: The same bytes; when it and every view of it are gone, the
        worker may write the slot again.
    """
    flag = storage_bytes(payload.untyped_storage())[:1].numpy()
    array = payload.numpy()
    # torch.from_numpy keeps `array` alive exactly as long as any tensor
    # viewing these bytes: its finalizer runs when the last one dies.
    weakref.finalize(array, _release, flag)
    return torch.from_numpy(array)
