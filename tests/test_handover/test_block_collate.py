import os
from functools import partial

import pytest
import torch
from handover_samples import StructureDataset, assert_same
from mmengine.dataset import default_collate, pseudo_collate
from mmengine.registry import FUNCTIONS
from torch.utils.data import DataLoader

from mmdata_plugin.handover import (BatchBlock, DeviceBatch, DeviceFeeder,
                                    block_collate, pass_device_batches)


def _loader(kind, collate_fn, num_workers=2, **kwargs):
    return DataLoader(StructureDataset(kind), batch_size=4,
                      num_workers=num_workers, collate_fn=collate_fn,
                      **kwargs)


def _expected(kind, stack):
    batches = list(_loader(kind, pseudo_collate, num_workers=0))
    if stack and kind != 'detection':
        for batch in batches:
            batch['inputs'] = torch.stack(batch['inputs'])
    return batches


@pytest.mark.parametrize('kind', ['classification', 'detection',
                                  'segmentation'])
@pytest.mark.parametrize('context,persistent', [('fork', False),
                                                ('fork', True),
                                                ('spawn', True)])
def test_workers_hand_over_blocks_that_unpack_to_the_collated_batch(
        kind, context, persistent):
    loader = _loader(kind, block_collate, multiprocessing_context=context,
                     persistent_workers=persistent)
    expected = _expected(kind, stack=True)
    for _ in range(2):  # a second epoch reuses persistent workers
        raw = list(loader)
        assert all(type(b) is BatchBlock for b in raw)
        assert all('receive' in b.handover_stages for b in raw)
        assert_same([b.unpack() for b in raw], expected)


@pytest.mark.parametrize('collate,stack', [('pseudo_collate', False),
                                           ('default_collate', True)])
def test_the_wrapped_collate_and_its_exact_structure(collate, stack):
    loader = _loader('classification',
                     partial(block_collate, collate=collate,
                             stack_inputs=False))
    expected = list(_loader('classification', FUNCTIONS.get(collate), 0))
    assert_same([b.unpack() for b in loader], expected)
    assert isinstance(expected[0]['inputs'], torch.Tensor) == stack


def test_without_workers_the_collated_batch_is_returned():
    loader = _loader('classification', block_collate, num_workers=0)
    assert_same(list(loader), _expected('classification', stack=True))
    assert_same(
        list(_loader('classification', default_collate, 0)),
        list(_loader('classification', partial(block_collate,
                                               collate=default_collate), 0)))


def test_an_unknown_collate_is_named():
    with pytest.raises(KeyError, match="collate='no_such_collate'"):
        block_collate([{}], collate='no_such_collate')


@pytest.mark.compat
def test_the_feeder_unpacks_into_a_device_batch_that_cast_data_passes():
    loader = _loader('segmentation', block_collate)
    fed = list(DeviceFeeder(iter(loader), torch.device('cpu')))
    assert all(type(b) is DeviceBatch for b in fed)
    assert_same(fed, _expected('segmentation', stack=True))
    calls = []
    cast = pass_device_batches(lambda data: calls.append(data) or data)
    assert type(cast(fed[0])) is dict and not calls
    plain = dict(inputs=torch.ones(1))
    assert cast(plain) is plain and calls == [plain]


def test_the_feeder_passes_other_batches_unchanged():
    loader = _loader('classification', pseudo_collate)
    expected = list(loader)
    assert_same(list(DeviceFeeder(iter(loader), torch.device('cpu'))),
                expected)


def test_the_feeder_places_blocks_on_its_device():
    loader = _loader('detection', block_collate)
    meta = torch.device('meta')
    feeder = DeviceFeeder(iter(loader), meta)
    stages = []
    feeder.on_batch = stages.append
    batches = list(feeder)
    assert len(batches) == len(loader) == len(stages)
    assert all(b['inputs'][0].device == meta for b in batches)
    assert {'receive', 'to_device', 'unpack'} <= stages[0].keys()


def _open_fds():
    return len(os.listdir('/proc/self/fd'))


@pytest.mark.skipif(not os.path.isdir('/proc/self/fd'), reason='Linux only')
def test_file_descriptors_stay_flat_over_a_long_run():
    loader = DataLoader(StructureDataset('detection', length=64 * 8),
                        batch_size=8, num_workers=4, persistent_workers=True,
                        collate_fn=block_collate)
    feeder_batches = 0
    for _ in range(2):  # start the workers, then measure
        for batch in DeviceFeeder(iter(loader), torch.device('cpu')):
            feeder_batches += 1
        if feeder_batches == 64:
            before = _open_fds()
    assert _open_fds() <= before + 2


def test_a_block_reads_as_its_batch_dict_without_the_feeder():
    from mmengine.model import ImgDataPreprocessor
    loader = _loader('classification', block_collate)
    expected = _expected('classification', stack=True)
    blocks = list(loader)
    assert dict(blocks[0]).keys() == expected[0].keys()
    assert_same(ImgDataPreprocessor().cast_data(blocks[1]), expected[1])


def test_batches_that_are_not_dicts_are_left_to_torch():
    for collate in ('pseudo_collate', 'default_collate'):
        loader = DataLoader(list(range(8)), batch_size=4, num_workers=1,
                            collate_fn=partial(block_collate,
                                               collate=collate))
        expected = list(DataLoader(list(range(8)), batch_size=4,
                                   collate_fn=FUNCTIONS.get(collate)))
        assert_same(list(loader), expected)


def test_without_a_feeder_blocks_arrive_as_the_batch_dict():
    from mmdata_plugin.handover import receive_packed
    receive_packed(False)
    batches = list(_loader('detection', block_collate))
    assert all(type(b) is dict for b in batches)
    assert_same(batches, _expected('detection', stack=True))


class _FailsAt:
    """Yields 0, 1, ... and raises at ``fail`` (once), as a DataLoader
    iterator re-raises a worker's exception and then goes on."""

    def __init__(self, fail: int, length: int) -> None:
        self.fail, self.length, self.next = fail, length, 0

    def __iter__(self):
        return self

    def __next__(self):
        index = self.next
        self.next += 1
        if index == self.length:
            raise StopIteration
        if index == self.fail:
            raise ValueError(f'sample {index} is broken')
        return dict(index=index)


def test_a_loading_error_surfaces_when_its_batch_is_due():
    # The feeder takes batch i+1 when it hands out batch i; an error loading
    # i+1 must not lose batch i, and later batches still come.
    feeder = DeviceFeeder(_FailsAt(2, 5), torch.device('cpu'))
    got = [next(feeder)['index'], next(feeder)['index']]
    with pytest.raises(ValueError, match='sample 2 is broken'):
        next(feeder)
    got += [batch['index'] for batch in feeder]
    assert got == [0, 1, 3, 4]


@pytest.mark.parametrize('shape', [(8, 8), (1, 4, 8, 8)])
def test_inputs_that_are_not_images_stay_a_list(shape):
    # ImgDataPreprocessor takes a stacked batch as NCHW only; it pads and
    # stacks a list of (H, W) or (C, D, H, W) tensors itself.
    from mmengine.model import ImgDataPreprocessor
    samples = [dict(inputs=torch.full(shape, i, dtype=torch.uint8))
               for i in range(2)]
    collated = block_collate(samples)
    assert type(collated['inputs']) is list
    preprocessor = ImgDataPreprocessor(pad_size_divisor=16)
    assert_same(preprocessor(collated), preprocessor(pseudo_collate(samples)))


class _MixedDtypes(torch.utils.data.Dataset):
    """Equal-shape (C, H, W) images, uint8 and float32 in turn (a pipeline
    that normalises some samples only)."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        dtype = torch.float32 if index % 2 else torch.uint8
        return dict(inputs=torch.full((3, 4, 4), index, dtype=dtype))


@pytest.mark.parametrize('num_workers', [0, 2])
def test_inputs_of_mixed_dtypes_stay_a_list_of_their_own_dtypes(num_workers):
    # torch.stack would cast them all to one dtype.
    loader = DataLoader(_MixedDtypes(), batch_size=4,
                        num_workers=num_workers, collate_fn=block_collate)
    batches = [b.unpack() if type(b) is BatchBlock else b for b in loader]
    assert len(batches) == 2
    for batch in batches:
        assert type(batch['inputs']) is list
        assert [t.dtype for t in batch['inputs']] == [torch.uint8,
                                                      torch.float32] * 2
    assert_same(
        batches,
        list(DataLoader(_MixedDtypes(), batch_size=4,
                        collate_fn=pseudo_collate)))
