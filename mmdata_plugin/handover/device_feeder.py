"""Batches onto the device one step ahead, on a side stream.

:class:`DeviceFeeder` wraps a DataLoader iterator in the training process.
Each ``next()`` hands out the batch placed while the previous step ran and
starts placing the one after it, so the copy runs while the current step
computes (timm's ``PrefetchLoader``, NVIDIA's ImageNet example) and so
does the host work of unpacking it. A :class:`~.batch_block.BatchBlock` is
copied as one block (one non-blocking copy from pinned memory) and
unpacked into views on the device. Any other batch passes unchanged, and
the data preprocessor's ``cast_data`` moves it on the compute stream as
without the feeder. On a CPU device blocks are unpacked into views of the
host block.
"""
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, List, Optional

import torch

from .batch_block import BatchBlock

_perf_counter = time.perf_counter
_END = object()


class DeviceBatch(dict):
    """A batch dict whose tensors the feeder already put on the device.

    ``DeviceFeedHook`` lets it past the data preprocessor's ``cast_data``
    (whose per-sample ``.to()`` would only rebuild every data sample).
    """


def pass_device_batches(cast_data: Callable) -> Callable:
    """A data preprocessor's ``cast_data`` that hands a
    :class:`DeviceBatch` on as it is: its tensors are on the device already,
    and the per-sample ``.to()`` would only rebuild every data sample on the
    host."""

    def cast(data):
        if type(data) is DeviceBatch:
            return dict(data)  # a new dict, as cast_data gives
        return cast_data(data)

    cast.__wrapped__ = cast_data
    return cast


class _Failed:
    """A batch whose loading raised: ``result`` raises it again."""

    __slots__ = ('error', )

    def __init__(self, error: Exception) -> None:
        self.error = error

    def result(self):
        raise self.error


class _Placed:
    """A batch that needs no placing, with a future's ``result``."""

    __slots__ = ('value', )

    def __init__(self, value) -> None:
        self.value = value

    def result(self):
        return self.value


_PLACER: List[ThreadPoolExecutor] = []


def _placer() -> ThreadPoolExecutor:
    """The one thread that places blocks, in the order they are given."""
    if not _PLACER:
        _PLACER.append(
            ThreadPoolExecutor(max_workers=1, thread_name_prefix='mmdata_feed'))
    return _PLACER[0]


class DeviceFeeder:
    """Iterator of device batches, placed one batch ahead.

    When batch *i* is taken, batch *i+1* is taken from the DataLoader and
    placed by a background thread: its block copied to the device (on a side
    CUDA stream) and unpacked into views there. The training step that runs
    meanwhile mostly waits for the GPU with the GIL released, so the
    placing costs the step next to nothing; the step then only makes the
    compute stream wait for the copy (on the GPU).

    Args:
        iterator (Iterator): The DataLoader iterator.
        device (torch.device): Where the model runs.
        on_batch (callable, optional): Called with each handed-out batch's
            ``handover_stages`` (seconds by stage) before it is returned:
            ``unpack`` (issuing the copy and unpacking, in the background)
            and ``to_device`` (what the training thread waited for it).
    """

    def __init__(self,
                 iterator: Iterator,
                 device: torch.device,
                 on_batch: Optional[Callable[[dict], None]] = None) -> None:
        self.iterator = iterator
        device = torch.device(device)
        if device.type == 'cuda' and device.index is None:
            # The placing thread has its own current device.
            device = torch.device('cuda', torch.cuda.current_device())
        self.device = device
        self.on_batch = on_batch
        self.stream = (torch.cuda.Stream(self.device)
                       if self.device.type == 'cuda' else None)
        self._ahead: Any = None

    def __iter__(self) -> 'DeviceFeeder':
        return self

    def __len__(self) -> int:
        return len(self.iterator)

    def __getattr__(self, name: str):
        # The wrapped iterator's own attributes (its sampler iterator, its
        # workers' shutdown...) stay reachable for code that uses them.
        if name.startswith('__') or name == 'iterator':
            raise AttributeError(name)
        return getattr(self.iterator, name)

    def __next__(self) -> Any:
        if self._ahead is None:
            self._ahead = self._take()
        if self._ahead is _END:
            raise StopIteration
        placing = self._ahead
        # After a failed batch the next one is taken at the next call, as
        # the loader alone would load it.
        self._ahead = None if type(placing) is _Failed else self._take()
        start = _perf_counter()
        batch, ready, stages = placing.result()
        if ready is not None:
            # The GPU waits for the copy; the host does not.
            torch.cuda.current_stream(self.device).wait_event(ready)
        stages['to_device'] = _perf_counter() - start
        if self.on_batch is not None:
            self.on_batch(stages)
        return batch

    def _take(self):
        """Take the next batch and start placing it; ``_END`` at the end.

        An error loading it (a worker's exception) is raised when that batch
        is due, after the batch before it was handed out.
        """
        try:
            item = next(self.iterator)
        except StopIteration:
            return _END
        except Exception as error:  # raised when its batch is due
            return _Failed(error)
        if not isinstance(item, BatchBlock):
            return _Placed(
                (item, None, dict(getattr(item, 'handover_stages', {}))))
        consumer = (torch.cuda.current_stream(self.device)
                    if self.stream is not None else None)
        return _placer().submit(self._place, item, consumer)

    def _place(self, item: BatchBlock, consumer) -> tuple:
        """Copy a block to the device and unpack it (placing thread)."""
        start = _perf_counter()
        if self.stream is None:
            small, large = item.to_device(self.device)
            ready = None
        else:
            with torch.cuda.device(self.device), torch.cuda.stream(
                    self.stream):
                small, large = item.to_device(self.device, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(self.stream)
            # Allocated on the side stream, freed after the compute
            # stream used them: the allocator must wait for that use.
            small.record_stream(consumer)
            large.record_stream(consumer)
        batch = item.unpack(small, large)
        stages = dict(item.handover_stages, unpack=_perf_counter() - start)
        if type(batch) is dict and item.complete:
            # Tensors left out of the block are still on the host: such a
            # batch goes through cast_data, which moves them.
            batch = DeviceBatch(batch)
        return batch, ready, stages
