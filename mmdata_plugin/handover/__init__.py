"""The batch hand-over into the training process: one shared-memory block
per batch (``block_collate``), pinned once, copied to the device one step
ahead on a side stream (:class:`DeviceFeeder`)."""
from .batch_block import (BatchBlock, Stacked, pack_batch, receive_packed,
                          received_batch)
from .block_collate import block_collate
from .device_feeder import DeviceBatch, DeviceFeeder, pass_device_batches

__all__ = [
    'BatchBlock', 'DeviceBatch', 'DeviceFeeder', 'Stacked', 'block_collate',
    'pack_batch', 'pass_device_batches', 'receive_packed',
    'received_batch'
]
