import pickle

from torch.utils.data import DataLoader, Dataset

from mmdata_plugin.sample_order import SampleIndex, with_fields


class _EchoFields(Dataset):

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return int(index), getattr(index, 'seed', None), getattr(
            index, 'shard', None)


def test_is_an_int_and_pickles_with_fields():
    index = SampleIndex(5, seed=123, shard='e0')
    assert index == 5 and isinstance(index, int)
    assert list(range(9))[index] == 5
    copy = pickle.loads(pickle.dumps(index))
    assert (int(copy), copy.seed, copy.shard) == (5, 123, 'e0')


def test_with_fields_keeps_existing_ones():
    index = with_fields(SampleIndex(3, shard='e1'), seed=7)
    assert (int(index), index.seed, index.shard) == (3, 7, 'e1')
    assert with_fields(4, seed=1).shard is None


def test_fields_reach_dataloader_workers():
    batches = [[SampleIndex(i, seed=100 + i, shard='s') for i in (0, 1)],
               [SampleIndex(i, seed=100 + i) for i in (2, 3)]]
    loader = DataLoader(
        _EchoFields(), batch_sampler=batches, num_workers=2,
        collate_fn=list)
    got = [item for batch in loader for item in batch]
    assert got == [(0, 100, 's'), (1, 101, 's'), (2, 102, None),
                   (3, 103, None)]
