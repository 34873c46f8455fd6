import gc
from functools import partial

import pytest
import torch
from handover_samples import StructureDataset, assert_same, busy_slots_collate
from mmengine.dataset import pseudo_collate
from torch.utils.data import DataLoader

from mmdata_plugin.handover import block_collate, block_slots
from mmdata_plugin.handover.block_slots import (HEADER_BYTES, BlockSlots,
                                                lease)


def test_a_slot_is_written_again_once_its_lease_is_gone():
    slots = BlockSlots(max_slots=2)
    first = slots.take(1000)
    kept = lease(first)
    kept[:3] = torch.tensor([1, 2, 3], dtype=torch.uint8)
    view = kept[1:3]
    del kept
    gc.collect()
    # A view of the leased bytes still reads them: the slot stays busy.
    second = slots.take(1000)
    assert second.data_ptr() != first.data_ptr()
    assert view.tolist() == [2, 3]
    del view
    again = slots.take(900)
    assert again.data_ptr() == first.data_ptr()


def test_with_every_slot_busy_there_is_none():
    slots = BlockSlots(max_slots=2)
    leases = [lease(slots.take(100)) for _ in range(2)]
    assert slots.take(100) is None
    leases.pop()
    assert slots.take(100) is not None


def test_a_free_slot_too_small_makes_room_for_one_that_fits():
    slots = BlockSlots(max_slots=1)
    small = slots.take(100)
    lease(small)  # dropped at once: the slot is free again
    big = slots.take(10_000)
    assert len(slots.slots) == 1
    assert slots.slots[0].payload_bytes >= 10_000
    assert big.untyped_storage().nbytes() >= HEADER_BYTES + 10_000


def test_a_forked_process_gets_slots_of_its_own(monkeypatch):
    parent = block_slots.worker_slots()
    monkeypatch.setattr(block_slots.os, 'getpid', lambda: parent.pid + 1)
    assert block_slots.worker_slots() is not parent


@pytest.mark.parametrize('context', ['fork', 'spawn'])
def test_kept_batches_keep_their_bytes_while_workers_reuse_slots(context):
    dataset = StructureDataset('detection', length=8 * 30)
    loader = DataLoader(
        dataset, batch_size=8, num_workers=2, persistent_workers=True,
        multiprocessing_context=context,
        collate_fn=partial(block_collate, collate=busy_slots_collate))
    expected = list(DataLoader(dataset, batch_size=8,
                               collate_fn=pseudo_collate))
    kept, busy = {}, []
    for epoch in range(2):
        for index, block in enumerate(loader):
            batch = block.unpack()
            busy.append(batch.pop('busy_slots'))
            assert_same(batch, expected[index], f'epoch {epoch} batch {index}')
            if index % 7 == 3:
                kept[index] = batch  # its slot must not be written
            del batch, block
        for index, batch in kept.items():
            assert_same(batch, expected[index], f'kept {epoch} {index}')
        kept.clear()
    # Batches dropped at once free their slots: a worker's slots are not
    # all busy when it packs (the kept ones hold a few).
    assert sorted(busy)[len(busy) // 2] < block_slots.MAX_SLOTS
