import pickle
import random

import numpy as np
import torch
from mmengine.registry import DATASETS
from torch.utils.data import DataLoader

import mmdata_plugin  # noqa: F401
from mmdata_plugin.datasets import SampleSeededDataset
from mmdata_plugin.sample_order import SampleIndex


class Draws:
    """Returns what it was asked for and one draw of each global RNG."""
    metainfo = dict(classes=('a', 'b'))
    pipeline = 'original'

    def __len__(self):
        return 10

    def __getitem__(self, index):
        return (index, random.random(), float(np.random.rand()),
                torch.rand(1).item())


def test_same_seed_same_draws_whatever_the_rng_state():
    dataset = SampleSeededDataset(Draws())
    first = dataset[SampleIndex(3, seed=2**63 + 5)]
    random.random(), np.random.rand(), torch.rand(3)
    assert dataset[SampleIndex(3, seed=2**63 + 5)][1:] == first[1:]
    assert dataset[SampleIndex(3, seed=6)][1:] != first[1:]


def test_main_process_randomness_is_not_shifted():
    dataset = SampleSeededDataset(Draws())
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    dataset[SampleIndex(0, seed=9)]
    assert (random.random(), np.random.rand(),
            torch.rand(1).item()) == expected


def test_workers_replay_the_same_values():
    dataset = SampleSeededDataset(Draws())
    batches = [[SampleIndex(i, seed=100 + i) for i in range(4)]]
    in_main = list(DataLoader(dataset, batch_sampler=batches,
                              collate_fn=list))
    in_worker = list(
        DataLoader(
            dataset, batch_sampler=batches, collate_fn=list, num_workers=1))
    assert in_main == in_worker


def test_the_dataset_gets_a_plain_int_unless_the_index_names_a_shard():
    dataset = SampleSeededDataset(Draws())
    index = dataset[SampleIndex(4, seed=1, shard='e0-r1')][0]
    assert (type(index), index.seed, index.shard) == (SampleIndex, 1,
                                                      'e0-r1')
    for index in (SampleIndex(4, seed=1), SampleIndex(4), 4):
        assert type(dataset[index][0]) is int and dataset[index][0] == 4


def test_attributes_are_the_wrapped_datasets():
    inner = Draws()
    dataset = SampleSeededDataset(inner)
    assert dataset.dataset is inner and len(dataset) == 10
    assert dataset.metainfo == dict(classes=('a', 'b'))
    dataset.pipeline = 'switched'  # e.g. mmdet's PipelineSwitchHook
    assert inner.pipeline == 'switched' and dataset.pipeline == 'switched'
    assert not hasattr(dataset, 'no_such_attribute')
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.dataset.pipeline == 'switched'


def test_builds_from_config(demo_root):
    dataset = DATASETS.build(
        dict(
            type='SampleSeededDataset',
            dataset=dict(
                type='ImageListDataset',
                data_root=demo_root,
                ann_file='val.txt')))
    assert len(dataset) == 32
    # Plain data: checkpoints and weights_only loading accept it.
    sample_idx = dataset[SampleIndex(0, seed=1)]['sample_idx']
    assert type(sample_idx) is int and sample_idx == 0
