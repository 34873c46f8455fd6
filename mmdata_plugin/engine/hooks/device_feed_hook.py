"""DeviceFeedHook: batches reach the model's device one step ahead."""
import sys
from typing import Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from torch.utils.data import DataLoader

from mmdata_plugin.data_monitor.loader_monitor import collate_name
from mmdata_plugin.handover import (DeviceFeeder, pass_device_batches,
                                    receive_packed)
from mmdata_plugin.utils.dataloader_slots import (dataloader_class_with_iter,
                                                 rebind_dataloader_attribute)
from mmdata_plugin.utils.torch_internals import (held_iterator,
                                                 set_held_iterator)


def _fed_iterator(loader: DataLoader, base: type):
    if not _feeds_ahead(loader):
        return base.__iter__(loader)
    feed = loader._device_feed
    return DeviceFeeder(base.__iter__(loader), feed.device, feed.on_batch)


def _fed_loader_class(base: type) -> type:
    """``base`` whose ``__iter__`` returns a :class:`DeviceFeeder`."""
    return dataloader_class_with_iter(base, 'Fed', _fed_iterator)


def _feeds_ahead(loader: DataLoader) -> bool:
    """Whether batches are taken one step ahead: not from a loader without
    workers, whose batches hold no block to place and whose pipeline runs in
    the training process, where loading batch i+1 before step i would move
    its random draws (seeded per iteration by the fast-resume loops) to
    another point of the main process's random streams."""
    return loader.num_workers > 0


class _Feed:
    """What the fed loader class needs: the device and the stage sink."""

    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self.loader = loader
        self.device = device

    def on_batch(self, stages: dict) -> None:
        # DataMonitorHook's monitor, when one measures this loader.
        monitor = getattr(self.loader, '_data_monitor', None)
        if monitor is not None:
            monitor.add_trainer_stages(
                {k: stages[k]
                 for k in ('to_device', 'unpack') if k in stages})


@HOOKS.register_module()
class DeviceFeedHook(Hook):
    """Feed the training batches to the model's device one step ahead.

    With ``collate_fn=dict(type='block_collate')`` in ``train_dataloader``,
    each batch arrives in the training process as one shared-memory block
    (pinned once with ``pin_memory=True``); this hook copies the next
    block to the device on a side CUDA stream while the current step runs
    (one non-blocking copy), unpacks it into views on the device, and lets
    the data preprocessor skip its per-sample moves. The data preprocessor
    and the model see what they see without it: the same structure, values
    and order. On a CPU device the block is unpacked into views of the host
    block. Batches of other collates pass unchanged (the data preprocessor
    moves them, as without the hook). A loader without workers is read as
    without the hook: nothing crosses a process boundary, and its pipeline
    runs in the step.

    Config::

        train_dataloader = dict(..., pin_memory=True,
                                collate_fn=dict(type='block_collate'))
        custom_hooks = [dict(type='DeviceFeedHook')]

    Args:
        device (str, optional): Where the batches go. Defaults to the
            device of the model's data preprocessor.
        switch_interval (float, optional): The interpreter's thread switch
            interval in seconds (``sys.setswitchinterval``) while batches
            are fed ahead, put back after training; None leaves it. The
            training thread needs the GIL between the kernels it launches,
            and the threads that receive, pin and place batches hold it in
            turns: with Python's 5 ms the GPU can wait. Measured on an
            H200 (ResNet-50, 14 workers, a pipeline decoding JPEGs every
            epoch): fed 101.6 % of what its workers produce with 0.5 ms,
            93.0 % with 5 ms (one run each; with a warm decode-once
            pipeline the feed was >= 100 % of the model's speed either
            way). Defaults to 0.0005.
    """

    # After DataMonitorHook (NORMAL): it restarts the iterators a loop has
    # started, and the feeder wraps what it leaves.
    priority = 'BELOW_NORMAL'

    def __init__(self,
                 device: Optional[str] = None,
                 switch_interval: Optional[float] = 0.0005) -> None:
        if switch_interval is not None and not (
                isinstance(switch_interval, (int, float))
                and switch_interval > 0):
            raise ValueError(
                'DeviceFeedHook: switch_interval must be a positive number '
                f'of seconds or None, got {switch_interval!r}')
        self.device = None if device is None else torch.device(device)
        self.switch_interval = switch_interval
        self._switch_interval_before: Optional[float] = None
        self._loader: Optional[DataLoader] = None
        self._base_class: Optional[type] = None
        self._preprocessor = None
        self._received_packed = False

    def before_train(self, runner) -> None:
        loop = runner.train_loop
        loader = getattr(loop, 'dataloader', None)
        if not isinstance(loader, DataLoader):
            runner.logger.warning(
                'DeviceFeedHook needs a torch DataLoader as '
                f'train_loop.dataloader, got {type(loader).__name__}; '
                'batches are not fed ahead.')
            return
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        preprocessor = getattr(model, 'data_preprocessor', None)
        device = self.device or getattr(preprocessor, 'device', None)
        if device is None:
            device = next(model.parameters()).device
        self._install(loader, torch.device(device), loop)
        self._received_packed = receive_packed(True)
        if self.switch_interval is not None and _feeds_ahead(loader):
            self._switch_interval_before = sys.getswitchinterval()
            sys.setswitchinterval(self.switch_interval)
        if preprocessor is not None and hasattr(preprocessor, 'cast_data'):
            # An instance attribute shadows the class's method for this
            # model only; after_train removes it.
            preprocessor.cast_data = pass_device_batches(
                preprocessor.cast_data)
            self._preprocessor = preprocessor
        runner.logger.info(
            f'DeviceFeedHook: batches go to {device} one step ahead'
            f"{' on a side stream' if torch.device(device).type == 'cuda' else ''}"
            '; collate_fn packs them into one block: '
            f"{collate_name(loader.collate_fn) == 'block_collate'}.")

    def _install(self, loader: DataLoader, device: torch.device,
                 loop) -> None:
        self._loader = loader
        self._base_class = type(loader)
        loader._device_feed = _Feed(loader, device)
        rebind_dataloader_attribute(loader, '__class__',
                                    _fed_loader_class(self._base_class))
        # An iterator the loop started before this hook (stock
        # IterBasedTrainLoop starts one in __init__, held by mmengine's
        # _InfiniteDataloaderIterator) is wrapped where it is held; the
        # workers need no change.
        holder = getattr(loop, 'dataloader_iterator', None)
        started = held_iterator(holder)
        if (started is not None and not isinstance(started, DeviceFeeder)
                and _feeds_ahead(loader)):
            set_held_iterator(
                holder,
                DeviceFeeder(started, device, loader._device_feed.on_batch))

    def before_val(self, runner) -> None:
        # Blocks stay packed for the feeder only: validation's batches (its
        # loader may use block_collate too) arrive as without the hook, as
        # the plain dicts its hooks and evaluator may change.
        if self._loader is not None:
            receive_packed(False)

    def after_val(self, runner) -> None:
        if self._loader is not None:
            receive_packed(True)

    def after_train(self, runner) -> None:
        receive_packed(self._received_packed)
        if self._switch_interval_before is not None:
            sys.setswitchinterval(self._switch_interval_before)
            self._switch_interval_before = None
        # The loop keeps its iterator after training: without the feeder,
        # the batch it placed ahead (device memory) is let go.
        holder = getattr(runner.train_loop, 'dataloader_iterator', None)
        feeder = held_iterator(holder)
        if isinstance(feeder, DeviceFeeder):
            set_held_iterator(holder, feeder.iterator)
        if self._preprocessor is not None:
            del self._preprocessor.cast_data
            self._preprocessor = None
        if self._loader is not None:
            # DataMonitorHook ends before this hook and puts back the class
            # it found, which drops this hook's subclass too.
            if type(self._loader) is _fed_loader_class(self._base_class):
                rebind_dataloader_attribute(self._loader, '__class__',
                                            self._base_class)
            del self._loader._device_feed
            self._loader = None

