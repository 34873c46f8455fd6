"""``block_collate``: a collate whose batches cross into the trainer as one
shared-memory block (:mod:`.batch_block`)."""
from typing import Any, Callable, Sequence, Union

import torch
from mmengine.registry import FUNCTIONS
from torch.utils.data import get_worker_info

from .batch_block import Stacked, is_packable_tensor, pack_batch


def _wrapped_collate(collate: Union[str, Callable]) -> Callable:
    if callable(collate):
        return collate
    function = FUNCTIONS.get(collate)
    if function is None:
        raise KeyError(f'block_collate: collate={collate!r} is not a '
                       'registered function (FUNCTIONS); use e.g. '
                       "'pseudo_collate' or 'default_collate'")
    return function


def _stack_inputs(batch: Any) -> Any:
    """Mark an equal-shape list of (C, H, W) tensors under ``inputs`` for
    stacking (what ``default_collate`` does, without its copy in the
    trainer)."""
    if not isinstance(batch, dict):
        return batch
    inputs = batch.get('inputs')
    # Only tensors that go into the block can be stacked into it.
    if not isinstance(inputs, list) or not inputs or not all(
            is_packable_tensor(t) for t in inputs):
        return batch
    first = inputs[0]
    # (C, H, W) images only: the data preprocessors that take a stacked
    # batch take it as NCHW (ImgDataPreprocessor asserts it), while a list
    # of (H, W) or (C, D, H, W) tensors is padded and stacked by them.
    if first.dim() != 3 or any(t.shape != first.shape
                               or t.dtype != first.dtype for t in inputs):
        return batch
    return dict(batch, inputs=Stacked(inputs))


@FUNCTIONS.register_module()
def block_collate(data_batch: Sequence,
                  collate: Union[str, Callable] = 'pseudo_collate',
                  stack_inputs: bool = True) -> Any:
    """Collate with ``collate``, then pack the batch into one block.

    In a DataLoader worker the batch dict becomes a
    :class:`~mmdata_plugin.handover.BatchBlock`: all its tensors and numeric
    arrays in one shared-memory block, pinned once, moved to the device in
    one copy and viewed again by ``DeviceFeedHook`` in ``custom_hooks``
    (without the hook it reads as the batch dict, unpacked on the host). In
    the training process itself (``num_workers=0``) nothing crosses a
    process boundary and the collated batch is returned as it is; so are
    batches that are not dicts (mmengine's are).

    Config: ``collate_fn=dict(type='block_collate')`` in a dataloader.

    Args:
        data_batch (Sequence): The samples of the batch.
        collate (str | callable): The collate to wrap, a name registered in
            mmengine's ``FUNCTIONS`` or a function. Defaults to
            ``'pseudo_collate'``.
        stack_inputs (bool): Give a list of equal-shape (C, H, W) image
            tensors under ``inputs`` as one stacked tensor (mmengine's,
            mmpretrain's, mmdet's and mmseg's data preprocessors accept
            either, and normalise a stacked batch in one go); lists of
            different shapes or of other ranks stay lists. False keeps the
            wrapped collate's exact structure.
            Defaults to True.
    """
    batch = _wrapped_collate(collate)(data_batch)
    if not isinstance(batch, dict):
        return batch  # not an mmengine batch: left to torch's hand-over
    if stack_inputs:
        batch = _stack_inputs(batch)
    if get_worker_info() is None:
        if isinstance(batch, dict) and isinstance(batch.get('inputs'),
                                                  Stacked):
            batch = dict(batch, inputs=torch.stack(batch['inputs'].tensors))
        return batch
    return pack_batch(batch)
