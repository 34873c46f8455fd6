import pytest
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from mmdata_plugin.utils.dataloader_slots import rebind_dataloader_attribute


def test_rebinds_what_dataloader_guards():
    loader = DataLoader(range(6), batch_size=2)
    with pytest.raises(ValueError, match='should not be set'):
        loader.dataset = range(10, 16)
    rebind_dataloader_attribute(loader, 'dataset', range(10, 16))
    rebind_dataloader_attribute(
        loader, 'batch_sampler',
        BatchSampler(SequentialSampler(range(6)), 3, drop_last=False))
    # A fresh iterator reads the new pieces; batch_size is the original's.
    assert [b.tolist() for b in loader] == [[10, 11, 12], [13, 14, 15]]
    assert loader.batch_size == 2


class Refusing(DataLoader):

    def __setattr__(self, name, value):
        if name == '__class__':
            raise AttributeError('forwarding wrapper')
        super().__setattr__(name, value)


def test_switches_the_class_past_a_subclass_setattr():
    loader = Refusing(range(4), batch_size=2)

    class Timed(Refusing):
        pass

    rebind_dataloader_attribute(loader, '__class__', Timed)
    assert type(loader) is Timed
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
