"""What downstream users combine with the fast-resume loops, resumed exactly.

A detection-style dump (``tools/dump_data_list.py`` of a mmengine-only
``ToyDetDataset``) read by ``RankShardedDataset`` through a random pipeline,
batched by a copy of mmdet's ``AspectRatioBatchSampler`` (buckets held on the
instance), wrapped in ``RepeatDataset`` / ``ConcatDataset`` /
``ClassBalancedDataset``, or drawn by a copy of mmdet's ``MultiSourceSampler``
(per-source generators that live across passes). Each case reads the stream
uninterrupted and interrupted + resumed in a fresh DataLoader (other worker
count), and compares indices and augmented values.
"""
import itertools
from typing import Iterator, List, Sized

import numpy as np
import pytest
import torch
from downstream_toys import (TOY_FILTER, ToyAspectRatioBatchSampler,
                             ToyDetDataset, make_toy_coco, toy_pipeline)
from mmengine.dataset import (ClassBalancedDataset, ConcatDataset,
                              DefaultSampler, RepeatDataset)
from torch.utils.data import BatchSampler, DataLoader, Sampler

from mmdata_plugin.datasets import (RankShardedDataset,
                                    RankShardedInfiniteSampler,
                                    RankShardedSampler)
from mmdata_plugin.datasets.data_list_dump import dump_data_list
from mmdata_plugin.engine.runner import (DataStreamResumer,
                                         ResumableDataloaderIterator)

BATCH = 2


@pytest.fixture(scope='module')
def dump(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('toy_coco'))
    make_toy_coco(root, num_images=16)
    source = ToyDetDataset(
        data_root=root,
        ann_file='annotations/train.json',
        data_prefix=dict(img='images/'),
        filter_cfg=TOY_FILTER)
    dump_data_list(source, f'{root}/annotations/train.jsonl', progress=False)
    return root


def sharded(root, **options):
    return RankShardedDataset(
        data_root=root,
        ann_file='annotations/train.jsonl',
        data_prefix=dict(img_path='images/'),
        pipeline=toy_pipeline(),
        index_progress=False,
        **options)


def describe_batch(batch):
    """What must replay: the sample, its random scale, flip and boxes."""
    return [(d['sample_idx'], d['img'].shape, d['flip'],
             d['gt_bboxes'].round(3).tolist()) for d in batch]


class ToyMultiSourceSampler(Sampler):
    """mmdet 3.3's ``MultiSourceSampler``: fixed shares of each source per
    batch, from per-source infinite generators made once (seeded lazily)."""

    def __init__(self, dataset: Sized, batch_size: int, source_ratio,
                 seed: int = 0) -> None:
        self.dataset = dataset
        self.cumulative_sizes = [0] + dataset.cumulative_sizes
        self.batch_size = batch_size
        self.seed = seed
        self.num_per_source = [
            int(batch_size * ratio / sum(source_ratio))
            for ratio in source_ratio
        ]
        self.num_per_source[0] = batch_size - sum(self.num_per_source[1:])
        self.source2inds = {
            source: self._infinite_indices(len(ds))
            for source, ds in enumerate(dataset.datasets)
        }

    def _infinite_indices(self, sample_size: int) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        while True:
            yield from torch.randperm(
                sample_size, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        while True:
            for source, num in enumerate(self.num_per_source):
                for idx in itertools.islice(self.source2inds[source], num):
                    yield idx + self.cumulative_sizes[source]

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        pass


def make_loader(root,
                wrapper=None,
                sampler='epoch',
                workers=0,
                aspect_ratio_batch_sampler=ToyAspectRatioBatchSampler,
                multi_source_sampler=ToyMultiSourceSampler):
    dataset = sharded(root)
    if wrapper == 'repeat':
        dataset = RepeatDataset(dataset, times=2)
    elif wrapper in ('concat', 'multi_source'):
        dataset = ConcatDataset([dataset, sharded(root, indices=5)])
    elif wrapper == 'class_balanced':
        dataset = ClassBalancedDataset(dataset, oversample_thr=0.5)
    if sampler == 'epoch':
        sampler = RankShardedSampler(dataset, seed=7)
    elif sampler == 'infinite':
        sampler = RankShardedInfiniteSampler(dataset, seed=7)
    else:
        sampler = DefaultSampler(dataset, seed=7)
    if wrapper == 'multi_source':
        batch_sampler = BatchSampler(
            multi_source_sampler(dataset, BATCH * 2, [1, 1], seed=7),
            BATCH * 2, drop_last=False)
    else:
        batch_sampler = aspect_ratio_batch_sampler(sampler, BATCH)
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=workers,
        collate_fn=describe_batch)


def read(loader, batches, state=None, iteration=0):
    resumer = DataStreamResumer(loader, seed=0)
    iterator = ResumableDataloaderIterator(
        loader, resumer.position, epoch_transition_sleep=0)
    if state is not None:
        resumer.load_checkpoint_meta(dict(data_position=state))
    resumer.resume(iteration)
    out: List = [next(iterator) for _ in range(batches)]
    return out, resumer.state_dict(), resumer


@pytest.mark.parametrize('wrapper,sampler,skip,workers', [
    (None, 'epoch', 3, 2),
    (None, 'infinite', 9, 0),
    (None, 'default', 4, 0),
    ('repeat', 'epoch', 11, 0),
    ('concat', 'infinite', 6, 0),
    ('class_balanced', 'epoch', 5, 0),
    ('multi_source', 'epoch', 7, 2),
])
def test_resume_is_exact(dump, wrapper, sampler, skip, workers):
    more = 6
    reference, _, _ = read(make_loader(dump, wrapper, sampler), skip + more)
    part, state, first = read(make_loader(dump, wrapper, sampler), skip)
    assert part == reference[:skip]
    rest, _, resumed = read(
        make_loader(dump, wrapper, sampler, workers), more, state, skip)
    assert rest == reference[skip:]
    expected = ('sampler_replay'
                if wrapper == 'multi_source' else 'batch_replay')
    assert resumed.strategy == expected
    # Buckets group by orientation; the last batch of a pass mixes them.
    if wrapper != 'multi_source':
        shapes = [[shape for _, shape, _, _ in batch]
                  for batch in reference if len(batch) == BATCH]
        assert all((a[0] < a[1]) == (b[0] < b[1]) for a, b in shapes[:4])


def mmdet_samplers():
    """mmdet's own classes, where mmdet imports (it needs mmcv's compiled
    ops even for its datasets); skipped otherwise."""
    try:
        from mmdet.datasets.samplers import (AspectRatioBatchSampler,
                                             MultiSourceSampler)
    except Exception as error:  # ImportError, or mmdet's mmcv version check
        pytest.skip(f'mmdet does not import here: {error!r:.120}')
    return AspectRatioBatchSampler, MultiSourceSampler


@pytest.mark.parametrize('wrapper,sampler,skip', [(None, 'epoch', 5),
                                                  ('concat', 'infinite', 4),
                                                  ('multi_source', None, 6)])
def test_mmdet_samplers_resume_exactly(dump, wrapper, sampler, skip):
    aspect_ratio, multi_source = mmdet_samplers()

    def loader(workers=0):
        return make_loader(dump, wrapper, sampler, workers, aspect_ratio,
                           multi_source)

    reference, _, _ = read(loader(), skip + 5)
    _, state, _ = read(loader(), skip)
    rest, _, _ = read(loader(2), 5, state, skip)
    assert rest == reference[skip:]


def test_class_balanced_dataset_reads_detection_labels(dump):
    dataset = sharded(dump)
    labels = [dataset.get_cat_ids(i) for i in range(len(dataset))]
    assert all(labels) and {c for cats in labels for c in cats} <= {0, 1, 2}
    balanced = ClassBalancedDataset(dataset, oversample_thr=0.5)
    assert len(balanced) > len(dataset)


@pytest.mark.parametrize('wrapper', ['repeat', 'concat'])
def test_shard_files_under_a_wrapper_are_refused_at_build(dump, wrapper):
    dataset = sharded(dump, materialize_shards=True)
    dataset = (RepeatDataset(dataset, times=2) if wrapper == 'repeat' else
               ConcatDataset([dataset, sharded(dump)]))
    with pytest.raises(ValueError) as error:
        RankShardedSampler(dataset)
    message = str(error.value)
    assert 'materialize_shards' in message and type(dataset).__name__ in \
        message
    assert ('max_epochs' in message if wrapper == 'repeat' else 'cat '
            in message)


def test_bucketed_batches_follow_the_orientation(dump):
    loader = make_loader(dump)
    dataset = loader.dataset
    for batch in itertools.islice(iter(loader.batch_sampler), 3):
        sides = [
            dataset.get_data_info(i)['width'] <
            dataset.get_data_info(i)['height'] for i in batch
        ]
        assert len(set(sides)) == 1
    assert np.all(np.diff([len(b) for b in loader.batch_sampler][:-1]) == 0)
