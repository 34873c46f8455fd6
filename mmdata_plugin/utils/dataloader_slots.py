"""Rebinding attributes of a DataLoader that it guards after ``__init__``.

``torch.utils.data.DataLoader.__setattr__`` refuses to rebind ``dataset``,
``batch_sampler``, ``sampler``, ``batch_size``, ``drop_last`` and
``persistent_workers`` once built, because a live iterator reads them once
per ``iter()`` and would silently keep the old ones. mmdata_plugin must
still swap pieces of a DataLoader that mmengine built from the config:

* the fast-resume loops put a per-sample seeding dataset and a positionable
  batch sampler in place, before any iterator exists;
* the data monitor switches the loader's class to a timed subclass (and
  back), then restarts the iterators already running; going through here,
  a DataLoader subclass's own ``__setattr__`` cannot intercept the switch.

Rebuilding the DataLoader instead would lose its ``batch_size`` (read by
mmengine's ``auto_scale_lr``), every other argument, and the object other
components (hooks, the runner) already hold. This module is the one place
that bypasses the guard; callers own the "no stale iterator" condition.
"""
from torch.utils.data import DataLoader


def rebind_dataloader_attribute(dataloader: DataLoader, name: str,
                                value) -> None:
    """Set ``dataloader.<name> = value`` past DataLoader's rebinding guard.

    Args:
        dataloader (DataLoader): The loader to change.
        name (str): The attribute, e.g. ``'dataset'``, ``'batch_sampler'``
            or ``'__class__'``.
        value: Its new value.
    """
    object.__setattr__(dataloader, name, value)
