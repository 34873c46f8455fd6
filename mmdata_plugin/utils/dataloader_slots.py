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
from typing import Callable, Dict, Tuple

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


_ITER_CLASSES: Dict[Tuple[type, str], type] = {}


def dataloader_class_with_iter(base: type, prefix: str,
                               make_iter: Callable) -> type:
    """``base`` (a DataLoader class) whose ``__iter__`` returns
    ``make_iter(loader, base)``.

    The data monitor, the device feeder and the Ray data nodes each switch
    a loader's class (:func:`rebind_dataloader_attribute`) to one of these
    and back; one class per ``(base, prefix)``, so a switch can be
    recognised and stacked on another one's class.

    Args:
        base (type): The loader's class now.
        prefix (str): Names the new class (``f'{prefix}{base.__name__}'``);
            one prefix, one ``make_iter`` (a module-level function).
        make_iter (callable): ``(loader, base) -> iterator``.
    """
    cls = _ITER_CLASSES.get((base, prefix))
    if cls is None:

        def __iter__(self):
            return make_iter(self, base)

        cls = type(f'{prefix}{base.__name__}', (base, ),
                   dict(__iter__=__iter__, __module__=make_iter.__module__))
        _ITER_CLASSES[base, prefix] = cls
    return cls
