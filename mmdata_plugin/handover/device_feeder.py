"""Batches onto the device one step ahead, on a side stream.

:class:`DeviceFeeder` wraps a DataLoader iterator in the training process.
Each ``next()`` hands out the batch whose copy to the device was issued one
step earlier and issues the copy of the one after it, so the copy runs
while the current step computes (timm's ``PrefetchLoader``, NVIDIA's
ImageNet example). A :class:`~.batch_block.BatchBlock` is copied as one
block (one non-blocking copy from pinned memory) and unpacked into views on
the device; any other batch has each tensor copied, as mmengine's
``cast_data`` would. On a CPU device nothing is copied: blocks are unpacked
into views of the host block, other batches pass unchanged.
"""
import time
from typing import Any, Callable, Iterator, Optional

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


class DeviceFeeder:
    """Iterator of device batches, one copy ahead.

    Args:
        iterator (Iterator): The DataLoader iterator.
        device (torch.device): Where the model runs.
        on_batch (callable, optional): Called with each handed-out batch's
            ``handover_stages`` (seconds by stage) before it is returned.
    """

    def __init__(self,
                 iterator: Iterator,
                 device: torch.device,
                 on_batch: Optional[Callable[[dict], None]] = None) -> None:
        self.iterator = iterator
        self.device = torch.device(device)
        self.on_batch = on_batch
        self.stream = (torch.cuda.Stream(self.device)
                       if self.device.type == 'cuda' else None)
        self._ahead: Any = None

    def __iter__(self) -> 'DeviceFeeder':
        return self

    def __len__(self) -> int:
        return len(self.iterator)

    def __getattr__(self, name: str):
        # The wrapped iterator's own attributes (``_sampler_iter``,
        # ``_shutdown_workers``...) stay reachable for code that uses them.
        if name.startswith('__') or name == 'iterator':
            raise AttributeError(name)
        return getattr(self.iterator, name)

    def __next__(self) -> Any:
        if self._ahead is None:
            self._ahead = self._issue()
        if self._ahead is _END:
            raise StopIteration
        batch, ready, stages = self._ahead
        self._ahead = self._issue()
        start = _perf_counter()
        if ready is not None:
            # The GPU waits for the copy; the host does not.
            torch.cuda.current_stream(self.device).wait_event(ready)
        stages['to_device'] = stages.get('to_device',
                                         0.0) + _perf_counter() - start
        if self.on_batch is not None:
            self.on_batch(stages)
        return batch

    def _issue(self):
        """Take the next batch and start its copy; ``_END`` at the end."""
        try:
            item = next(self.iterator)
        except StopIteration:
            return _END
        if not isinstance(item, BatchBlock):
            return item, None, dict(getattr(item, 'handover_stages', {}))
        stages = item.handover_stages
        start = _perf_counter()
        if self.stream is None:
            small, large = item.to_device(self.device)
            ready = None
        else:
            consumer = torch.cuda.current_stream(self.device)
            with torch.cuda.stream(self.stream):
                small, large = item.to_device(self.device, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(self.stream)
            # Allocated on the side stream, freed after the compute
            # stream used them: the allocator must wait for that use.
            small.record_stream(consumer)
            large.record_stream(consumer)
        copied = _perf_counter()
        batch = item.unpack(small, large)
        stages['to_device'] = copied - start
        stages['unpack'] = _perf_counter() - copied
        if type(batch) is dict:
            batch = DeviceBatch(batch)
        return batch, ready, dict(stages)
