import pickle

import numpy as np
import pytest
import torch
from handover_samples import SAMPLES, assert_same
from mmengine.dataset import default_collate, pseudo_collate

from mmdata_plugin.handover import BatchBlock, Stacked, pack_batch
from mmdata_plugin.handover.batch_block import SMALL_BYTES
from mmdata_plugin.handover.block_collate import _stack_inputs


def _through_pickle(block: BatchBlock) -> BatchBlock:
    return pickle.loads(pickle.dumps(block))


@pytest.mark.parametrize('kind', sorted(SAMPLES))
def test_every_structure_comes_back_with_its_bytes(kind):
    batch = pseudo_collate([SAMPLES[kind](i) for i in range(6)])
    block = _through_pickle(pack_batch(batch))
    assert_same(block.unpack(), batch)


def test_one_block_holds_every_tensor_and_array():
    batch = pseudo_collate([SAMPLES['detection'](i) for i in range(4)])
    block = pack_batch(batch)
    entries = block.entries
    # 4 images, 4 x (boxes, labels, masks array, empty ignored boxes)
    assert len(entries) == 4 * 5
    assert {e[0] for e in entries} == {'tensor', 'array'}
    # No tensor storage is pickled inside the structure.
    assert b'_rebuild_tensor' not in block.structure
    assert b'storage' not in block.structure.lower()


def test_stacked_inputs_are_one_view_of_the_block():
    samples = [SAMPLES['classification'](i) for i in range(5)]
    batch = _stack_inputs(pseudo_collate(samples))
    assert type(batch['inputs']) is Stacked
    out = _through_pickle(pack_batch(batch)).unpack()
    expected = default_collate(samples)['inputs']
    assert_same(out['inputs'], expected)
    assert out['inputs'].is_contiguous()


def test_inputs_of_different_shapes_stay_a_list():
    batch = pseudo_collate([SAMPLES['detection'](i) for i in range(4)])
    assert _stack_inputs(batch) is batch


def test_a_kept_label_does_not_keep_the_pixels_alive():
    batch = pseudo_collate([SAMPLES['classification'](i, size=64)
                            for i in range(8)])
    out = _through_pickle(pack_batch(_stack_inputs(batch))).unpack()
    label = out['data_samples'][3].gt_label.label
    assert label.untyped_storage().nbytes() < SMALL_BYTES
    image_storage = out['inputs'].untyped_storage().nbytes()
    assert image_storage >= 8 * 3 * 64 * 64
    assert label.untyped_storage().data_ptr() != (
        out['inputs'].untyped_storage().data_ptr())


def test_odd_tensors_keep_dtype_shape_and_values():
    batch = dict(
        strided=torch.arange(60, dtype=torch.float32).view(6, 10)[:, ::3],
        empty=torch.zeros(0, 4),
        flags=torch.tensor([True, False, True]),
        wide=torch.arange(5, dtype=torch.float64) / 3,
        half=torch.rand(3, 7).to(torch.bfloat16),
        scalar=torch.tensor(3),
        array=np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],
        text=['a', 'b'],
        nothing=None)
    out = _through_pickle(pack_batch(batch)).unpack()
    assert_same(out, batch)


def test_tensor_subclasses_keep_their_type():
    # A Parameter pickles as its plain data (packed) plus its own state.
    weight = torch.nn.Parameter(torch.ones(3))
    out = _through_pickle(pack_batch(dict(weight=weight))).unpack()
    assert type(out['weight']) is torch.nn.Parameter
    assert torch.equal(out['weight'], weight)


def test_receipt_is_timed():
    block = _through_pickle(pack_batch(dict(inputs=torch.ones(3))))
    assert block.handover_stages['receive'] >= 0


def test_unpacking_onto_another_device_keeps_arrays_on_the_host():
    batch = pseudo_collate([SAMPLES['detection'](i) for i in range(3)])
    block = _through_pickle(pack_batch(batch))
    meta = torch.device('meta')
    out = block.unpack(*block.to_device(meta))
    sample = out['data_samples'][0]
    assert out['inputs'][0].device == meta
    assert sample.gt_instances.labels.device == meta
    assert sample.gt_instances.bboxes.tensor.device == meta
    assert isinstance(sample.gt_instances.masks.masks, np.ndarray)
    assert np.array_equal(sample.gt_instances.masks.masks,
                          batch['data_samples'][0].gt_instances.masks.masks)


def test_an_object_referenced_twice_comes_back_as_one_object():
    # As through torch's own hand-over (pickle's memo): packed once, one
    # object again, an in-place change seen through both references.
    label = torch.tensor([3])
    mask = np.ones((2, 2), dtype=bool)
    batch = dict(inputs=[label], data_samples=[dict(label=label, m=mask)],
                 masks=[mask])
    block = _through_pickle(pack_batch(batch))
    assert len(block.entries) == 2
    out = block.unpack()
    assert out['inputs'][0] is out['data_samples'][0]['label']
    assert out['masks'][0] is out['data_samples'][0]['m']
    assert_same(out, batch)


@pytest.mark.parametrize('device', ['cpu', 'meta'])
def test_a_kept_small_array_does_not_keep_the_pixels_alive(device):
    # mmdet's gt_ignore_flags, mmpose's keypoints: small numpy arrays that
    # an evaluator or a hook may keep after the batch died.
    batch = dict(inputs=torch.zeros(8, 3, 64, 64, dtype=torch.uint8),
                 flags=np.array([True, False, True]),
                 masks=np.ones((2, 64, 64), dtype=bool))
    block = _through_pickle(pack_batch(batch))
    out = block.unpack(*block.to_device(torch.device(device)))
    assert_same(out['flags'], batch['flags'])
    assert_same(out['masks'], batch['masks'])
    kept = out['flags'].base
    while not isinstance(kept, torch.Tensor):
        kept = kept.base
    assert kept.untyped_storage().nbytes() < SMALL_BYTES


class TaggedTensor(torch.Tensor):
    """A tensor subclass (as torchvision's tv_tensors): not packed."""


def test_a_batch_with_tensors_left_unpacked_goes_through_cast_data():
    # The feeder lets a DeviceBatch skip the data preprocessor's cast_data:
    # only right when every tensor in it is on the device already. A tensor
    # subclass or a tensor that requires grad travels pickled, on the host.
    from mmdata_plugin.handover import DeviceBatch, DeviceFeeder
    meta = torch.device('meta')
    image = torch.zeros(3, 8, 8, dtype=torch.uint8)
    for odd in (torch.ones(2).as_subclass(TaggedTensor),
                torch.ones(2, requires_grad=True)):
        block = _through_pickle(pack_batch(dict(inputs=image, odd=odd)))
        fed = next(DeviceFeeder(iter([block]), meta))
        assert type(fed) is dict
        assert fed['inputs'].device == meta
    plain = _through_pickle(pack_batch(dict(inputs=image, label=[1])))
    assert type(next(DeviceFeeder(iter([plain]), meta))) is DeviceBatch


def test_inputs_that_cannot_go_into_the_block_are_not_stacked_into_it():
    # torch.stack(out=...) into the block refuses tensors that require grad
    # and sparse ones: they stay a list, pickled as torch sends them.
    for inputs in ([torch.ones(3, requires_grad=True)] * 2,
                   [torch.ones(3).to_sparse()] * 2):
        batch = dict(inputs=list(inputs))
        assert _stack_inputs(batch) is batch
        out = _through_pickle(pack_batch(batch)).unpack()
        assert len(out['inputs']) == 2
        assert all(torch.equal(t.to_dense(), torch.ones(3))
                   for t in out['inputs'])


def test_views_of_one_storage_come_out_as_separate_copies():
    # The documented limit: values kept, memory no longer shared.
    base = torch.arange(10000.)
    batch = dict(head=base[:6000], tail=base[4000:], wide=base[:3].expand(
        5, 3))
    out = _through_pickle(pack_batch(batch)).unpack()
    assert_same(out, batch)
    out['head'][5000] = -1
    assert out['tail'][1000] == 5000
    assert out['wide'].is_contiguous()
