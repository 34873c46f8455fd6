"""One shared-memory block per batch: pack in the worker, view in the trainer.

A DataLoader worker hands each tensor of a batch to the training process as
its own shared-memory segment, received by a file-descriptor round trip and
pinned one by one: with ``pseudo_collate`` that is two segments per sample
(the image and a one-element label), hundreds per batch. :func:`pack_batch`
copies every tensor and numeric numpy array of a collated batch into ONE
uint8 block and pickles the rest of the structure (data samples, boxes,
metainfo: whatever the wrapped collate made) without them. The training
process receives one segment, pins it with one copy, moves it to the device
with one copy, and :meth:`BatchBlock.unpack` rebuilds the structure with
views into the block: the same types, shapes, dtypes and bytes. An object
referenced twice comes out as one object; two different tensors that view
one storage (slices of one tensor, ``expand``) come out as two contiguous
copies of what they show, with no memory shared between them.

Layout: tensors and arrays below :data:`SMALL_BYTES` (labels, boxes,
metainfo arrays) come first and are cloned out of the block when unpacked,
so a consumer that keeps a label (an evaluator collecting ``gt_label``)
keeps a few bytes alive, not the batch's pixels.
"""
import functools
import io
import pickle
import time
from collections.abc import Mapping
from typing import Any, Iterator, List, Optional, Tuple

import numpy as np
import torch

from ..utils.receipt_stamp import ReceiptStamp
from ..utils.shared_bytes import new_shared_bytes
from .block_slots import lease, worker_slots

#: Tensors/arrays smaller than this are kept apart from the pixels (see the
#: module docstring).
SMALL_BYTES = 4096
#: Offsets are aligned so that every dtype can view its slice.
ALIGN = 64
_perf_counter = time.perf_counter
#: Whether a block received in this process stays packed for a
#: DeviceFeeder (see :func:`receive_packed`).
_RECEIVE_PACKED = [False]


def _aligned(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def _allocate_block(nbytes: int) -> Tuple[torch.Tensor, bool]:
    """A uint8 tensor whose storage already lives in shared memory (inside
    a DataLoader worker), and whether it is a slot the worker writes again
    (see :mod:`.block_slots`)."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(nbytes, dtype=torch.uint8), False
    payload = worker_slots().take(nbytes)
    if payload is not None:
        return payload, True
    return new_shared_bytes(nbytes), False


class Stacked:
    """Equal-shape tensors that :func:`pack_batch` lays out back to back
    and that come out as one stacked tensor (a view, no copy)."""

    __slots__ = ('tensors', )

    def __init__(self, tensors: List[torch.Tensor]) -> None:
        self.tensors = tensors


class _Entry:
    """Where one tensor, array or stack lives in the block."""

    __slots__ = ('kind', 'items', 'dtype', 'shape', 'nbytes', 'offset')

    def __init__(self, kind: str, items: list, dtype, shape: tuple,
                 nbytes: int) -> None:
        self.kind = kind  # 'tensor', 'array' or 'stack'
        self.items = items
        self.dtype = dtype
        self.shape = shape
        self.nbytes = nbytes
        self.offset = 0

    def plain(self) -> tuple:
        return self.kind, self.dtype, self.shape, self.nbytes, self.offset


def is_packable_tensor(obj) -> bool:
    # Subclasses (nn.Parameter, tensor subclasses of other libraries) carry
    # state of their own: they travel as torch sends them.
    return (type(obj) is torch.Tensor and obj.device.type == 'cpu'
            and obj.layout == torch.strided and not obj.requires_grad
            and not obj.is_quantized)


def _is_packable_array(obj) -> bool:
    return type(obj) is np.ndarray and obj.dtype.kind in 'biufc'


#: Types that hold no tensor themselves (containers' items are asked apart).
_PICKLED_AS_THEY_ARE = frozenset(
    (str, int, float, bool, type(None), bytes, tuple, list, dict))


class _PackingPickler(pickle.Pickler):
    """Pickles a batch with its tensors and arrays replaced by entries."""

    def __init__(self, file) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.entries: List[_Entry] = []
        # pickle asks persistent_id before its memo: without this, a tensor
        # referenced twice would be packed twice and come out as two.
        self._ids = {}
        # Whether every tensor went into the block (others are pickled and
        # stay on the host wherever the block goes).
        self.complete = True

    def persistent_id(self, obj) -> Optional[int]:
        # Asked for every object of the batch (thousands of strings and
        # numbers of metainfo): those leave at once.
        if type(obj) in _PICKLED_AS_THEY_ARE:
            return None
        pid = self._ids.get(id(obj))
        if pid is not None:
            return pid
        if is_packable_tensor(obj):
            entry = _Entry('tensor', [obj], obj.dtype, tuple(obj.shape),
                           obj.numel() * obj.element_size())
        elif _is_packable_array(obj):
            entry = _Entry('array', [obj], obj.dtype, obj.shape, obj.nbytes)
        elif type(obj) is Stacked:
            first = obj.tensors[0]
            shape = (len(obj.tensors), *first.shape)
            entry = _Entry('stack', obj.tensors, first.dtype, shape,
                           len(obj.tensors) * first.numel() *
                           first.element_size())
        else:
            if isinstance(obj, (torch.Tensor, torch.UntypedStorage,
                                torch.TypedStorage)):
                self.complete = False
            return None
        self.entries.append(entry)
        # entry.items keeps obj alive, so its id is not reused meanwhile.
        self._ids[id(obj)] = len(self.entries) - 1
        return len(self.entries) - 1


def _place(entries: List[_Entry]) -> Tuple[int, int]:
    """Give each entry its offset, small ones first.

    Returns:
        tuple: (end of the small region, total bytes).
    """
    offset = 0
    for small in (True, False):
        for entry in entries:
            if (entry.nbytes < SMALL_BYTES) == small:
                entry.offset = offset
                offset = _aligned(offset + entry.nbytes)
        if small:
            small_end = offset
    return small_end, max(offset, 1)


def _copy_in(block: torch.Tensor, entry: _Entry) -> None:
    target = block[entry.offset:entry.offset + entry.nbytes]
    if entry.kind == 'array':
        target.numpy().view(entry.dtype).reshape(entry.shape)[...] = (
            entry.items[0])
        return
    view = target.view(entry.dtype)
    if entry.kind == 'tensor':
        view.view(entry.shape).copy_(entry.items[0])
    else:
        torch.stack(entry.items, out=view.view(entry.shape))


def pack_batch(batch: dict) -> 'BatchBlock':
    """Pack every CPU tensor and numeric array of ``batch`` into one block.

    Args:
        batch (dict): A collated batch (its values any picklable
            structure). :class:`Stacked` placeholders in it come out as one
            stacked tensor.

    Returns:
        BatchBlock: The block and the structure that views it again.
    """
    buffer = io.BytesIO()
    pickler = _PackingPickler(buffer)
    pickler.dump(batch)
    entries = pickler.entries
    small_end, total = _place(entries)
    block, leased = _allocate_block(total)
    for entry in entries:
        _copy_in(block, entry)
    return BatchBlock(block, buffer.getvalue(),
                      [entry.plain() for entry in entries], small_end,
                      pickler.complete, leased)


@functools.lru_cache(maxsize=1024)
def _contiguous_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class _ViewingUnpickler(pickle.Unpickler):
    """Rebuilds a packed batch with views into its block(s)."""

    def __init__(self, file, entries: list, small: torch.Tensor,
                 large: torch.Tensor, host: torch.Tensor,
                 small_end: int) -> None:
        super().__init__(file)
        self.entries = entries
        self.small, self.large, self.host = small, large, host
        self.small_end = small_end
        self._host_small: Optional[torch.Tensor] = None
        self._loaded = {}
        self._typed_regions = {}

    def persistent_load(self, pid: int):
        # One object per entry: what was one object before packing (a
        # tensor referenced twice) is one object again.
        loaded = self._loaded.get(pid)
        if loaded is None:
            loaded = self._loaded[pid] = self._view(pid)
        return loaded

    def _view(self, pid: int):
        kind, dtype, shape, nbytes, offset = self.entries[pid]
        if kind == 'array':
            # numpy arrays stay on the host whatever the device.
            data = self._host_region(offset)[offset:offset + nbytes].numpy()
            return data.view(dtype).reshape(shape)
        in_small = offset < self.small_end or nbytes == 0
        # One as_strided per entry on a view of the region per dtype, not
        # a slice and two views: a batch has one entry per data sample.
        typed = self._typed_regions.get((in_small, dtype))
        if typed is None:
            typed = self._typed_regions[in_small, dtype] = (
                self.small if in_small else self.large).view(dtype)
        start = offset if in_small else offset - self.small_end
        return typed.as_strided(
            shape, _contiguous_strides(shape),
            typed.storage_offset() + start // typed.element_size())

    def _host_region(self, offset: int) -> torch.Tensor:
        """What a numpy array at ``offset`` views: for a small one a copy
        of the small region (as for small tensors), so that keeping it does
        not keep the whole, maybe pinned, block alive."""
        if offset >= self.small_end:
            return self.host
        if self._host_small is None:
            self._host_small = (
                self.small if self.small.device == self.host.device else
                self.host[:self.small_end].clone())
        return self._host_small


class BatchBlock(Mapping):
    """A batch dict packed by :func:`pack_batch`: one block plus its
    structure.

    It crosses the worker boundary as one shared-memory segment (plus the
    pickled structure, which holds no tensor). It arrives as a block only
    while :func:`receive_packed` is on (``DeviceFeedHook`` turns it on
    while it feeds); otherwise it is unpacked into the batch dict on
    arrival. ``pin_memory`` (torch's protocol for custom batch types,
    called by the DataLoader's pin-memory thread) pins the block with one
    copy, and ``DeviceFeedHook`` moves it to the device and unpacks it
    there. A block that reaches another consumer reads as the batch
    mapping itself (unpacked into views of the host block at the first
    access).
    ``handover_stages`` holds what the training process spent on it
    (seconds): ``receive`` (unpickling it, the segment's file-descriptor
    round trip included), ``pin``, and what
    :class:`~mmdata_plugin.handover.DeviceFeeder` adds.

    Args:
        block (Tensor): The uint8 block.
        structure (bytes): The batch pickled without its tensors.
        entries (list[tuple]): ``(kind, dtype, shape, nbytes, offset)`` of
            each tensor, array or stack, by persistent id.
        small_end (int): Where the region of small tensors ends.
        complete (bool): Whether every tensor of the batch is in the block
            (not tensor subclasses or tensors that require grad, which are
            pickled in ``structure``). Defaults to True.
        leased (bool): Whether ``block`` is a worker's slot, which the
            receiving process frees for the worker when the last tensor
            viewing it dies (:mod:`.block_slots`). Defaults to False.
    """

    __slots__ = ('block', 'structure', 'entries', 'small_end', 'complete',
                 'leased', 'handover_stages', '_unpacked')

    def __init__(self,
                 block: torch.Tensor,
                 structure: bytes,
                 entries: list,
                 small_end: int,
                 complete: bool = True,
                 leased: bool = False) -> None:
        self.block = block
        self.structure = structure
        self.entries = entries
        self.small_end = small_end
        self.complete = complete
        self.leased = leased
        self.handover_stages = {}
        self._unpacked: Optional[dict] = None

    def _batch(self) -> dict:
        if self._unpacked is None:
            self._unpacked = self.unpack()
        return self._unpacked

    def __getitem__(self, key):
        return self._batch()[key]

    def __iter__(self) -> Iterator:
        return iter(self._batch())

    def __len__(self) -> int:
        return len(self._batch())

    def __reduce__(self):
        return received_batch, (ReceiptStamp(), self.block, self.structure,
                                self.entries, self.small_end, self.complete,
                                self.leased)

    def pin_memory(self, *args, **kwargs) -> 'BatchBlock':
        start = _perf_counter()
        self.block = self.block.pin_memory()
        self._unpacked = None
        self.handover_stages['pin'] = _perf_counter() - start
        return self

    @property
    def nbytes(self) -> int:
        return self.block.numel()

    def to_device(self, device: torch.device,
                  non_blocking: bool = False) -> Tuple[torch.Tensor, ...]:
        """The block on ``device`` as (small region, large region).

        The small region is a copy of its own, so keeping a small tensor
        does not keep the large region alive.
        """
        block = self.block
        if block.device != device:
            block = block.to(device, non_blocking=non_blocking)
        return block[:self.small_end].clone(), block[self.small_end:]

    def unpack(self, small: Optional[torch.Tensor] = None,
               large: Optional[torch.Tensor] = None) -> Any:
        """The batch as the wrapped collate made it, with views.

        Args:
            small, large (Tensor, optional): The block's two regions on the
                target device (:meth:`to_device`); the host block's by
                default. Numpy arrays always stay on the host.
        """
        if small is None:
            small, large = self.to_device(self.block.device)
        unpickler = _ViewingUnpickler(
            io.BytesIO(self.structure), self.entries, small, large,
            self.block, self.small_end)
        return unpickler.load()


def receive_packed(enabled: bool) -> bool:
    """Whether blocks received from now on stay packed; returns the old
    setting.

    Off (the default), a block is unpacked into the batch dict as it
    arrives, so any consumer gets exactly what the wrapped collate made (a
    dict, its tensors views of one shared-memory block; ``pin_memory`` then
    pins them one by one). On, it arrives as a :class:`BatchBlock` for a
    :class:`~mmdata_plugin.handover.DeviceFeeder` to pin, move and unpack
    in one piece: ``DeviceFeedHook`` turns it on while it feeds.
    """
    previous, _RECEIVE_PACKED[0] = _RECEIVE_PACKED[0], enabled
    return previous


def received_batch(started: float,
                   block: torch.Tensor,
                   structure: bytes,
                   entries: list,
                   small_end: int,
                   complete: bool = True,
                   leased: bool = False):
    """A block that reached the training process, as the consumer takes it.

    A :class:`BatchBlock` while :func:`receive_packed` is on (its
    ``receive`` stage counted from ``started``, a ``perf_counter`` time),
    else the batch unpacked into views of ``block``. A ``leased`` block (a
    worker's slot) is freed for its worker when the last of them dies.
    """
    if leased:
        block = lease(block)
    batch = BatchBlock(block, structure, entries, small_end, complete)
    if not _RECEIVE_PACKED[0]:
        return batch.unpack()
    batch.handover_stages['receive'] = _perf_counter() - started
    return batch
