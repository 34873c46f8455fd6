"""TarShardDataset: the usual pipeline, samplers, workers and train.py."""
import io
import itertools
import json
import os.path as osp
import tarfile

import cv2
import numpy as np
import pytest
import torch
from helpers import REPO_ROOT, train_packed_demo
from mmengine.dataset import DefaultSampler
from torch.utils.data import DataLoader

from mmdata_plugin.datasets import (RankShardedSampler, ShardWindowSampler,
                                    TarShardDataset, expand_shards)
from mmdata_plugin.datasets.annotation_lines import AnnotationFormatError
from mmdata_plugin.datasets.tar_shard_writer import pack_image_list
from mmdata_plugin.remote_cache.pipeline_routing import SampleFiles
from mmdata_plugin.testing import LoopbackHTTPServer

TAR_CONFIG = osp.join(REPO_ROOT, 'configs', 'demo',
                      'tinycnn_demo-jpeg-tar.py')
PIPELINE = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(24, 16), keep_ratio=False),
    dict(type='PackImageLabelInputs'),
]


def jpeg(value, height, width):
    image = np.full((height, width, 3), value, np.uint8)
    return cv2.imencode('.jpg', image)[1].tobytes()


def write_shard(path, samples):
    with tarfile.open(path, 'w', format=tarfile.PAX_FORMAT) as tar:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f'{key}.{ext}')
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def image_samples(shard, count=5):
    return [(f'{"long/" * 25}s{shard}_{i}', {
        'jpg': jpeg(10 * i + shard, 20 + i, 30 + shard),
        'cls': str((i + shard) % 3).encode(),
    }) for i in range(count)]


@pytest.fixture
def shard_folder(tmp_path):
    expected = []
    for shard in range(3):
        samples = image_samples(shard)
        write_shard(str(tmp_path / f'train-{shard:06d}.tar'), samples)
        expected += samples
    return tmp_path, expected


def make_dataset(root, **kwargs):
    kwargs.setdefault('pipeline', PIPELINE)
    return TarShardDataset(
        data_root=str(root),
        shards='train-{000000..000002}.tar',
        ann_ext='cls',
        index_progress=False,
        **kwargs)


def test_pipeline_reads_each_sample_from_its_member(shard_folder):
    root, expected = shard_folder
    dataset = make_dataset(root)
    assert len(dataset) == len(expected)
    for idx, (key, members) in enumerate(expected):
        info = dataset.get_data_info(idx)
        assert info['img_path'].startswith('tarmember://')
        assert (info['sample_key'], info['gt_label']) == (key,
                                                          int(members['cls']))
        assert dataset.get_cat_ids(idx) == [int(members['cls'])]
        packed = dataset[idx]
        assert packed['inputs'].shape == (3, 16, 24)
        decoded = cv2.imdecode(np.frombuffer(members['jpg'], np.uint8), 1)
        resized = cv2.resize(decoded, (24, 16))
        assert torch.equal(packed['inputs'],
                           torch.from_numpy(resized).permute(2, 0, 1))
        assert int(packed['data_samples'].gt_label) == int(members['cls'])


def collate(batch):
    return dict(
        inputs=torch.stack([item['inputs'] for item in batch]),
        data_samples=dict(
            sample_idx=[item['data_samples'].sample_idx for item in batch],
            gt_label=[item['data_samples'].gt_label for item in batch]))


def _keys_and_labels(loader):
    return [(int(i), int(label)) for batch in loader
            for i, label in zip(batch['data_samples']['sample_idx'],
                                batch['data_samples']['gt_label'])]


# A spawned worker starts bare: unpickling the dataset must register the
# tarmember backend again (one worker: each costs seconds of imports).
@pytest.mark.parametrize('sampler_type, context, num_workers', [
    (DefaultSampler, 'fork', 2),
    (RankShardedSampler, 'fork', 2),
    (DefaultSampler, 'spawn', 1),
])
def test_workers_give_the_samplers_samples(shard_folder, sampler_type,
                                           context, num_workers):
    root, expected = shard_folder
    dataset = make_dataset(
        root,
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='Resize', scale=(8, 8), keep_ratio=False),
            dict(type='PackImageLabelInputs')
        ])
    sampler = sampler_type(dataset, shuffle=True, seed=3)
    order = list(iter(sampler))
    assert sorted(order) == list(range(len(expected)))

    in_process = DataLoader(dataset, batch_size=4, sampler=sampler,
                            collate_fn=collate)
    workers = DataLoader(dataset, batch_size=4, sampler=sampler,
                         collate_fn=collate, num_workers=num_workers,
                         multiprocessing_context=context)
    got = _keys_and_labels(workers)
    assert got == _keys_and_labels(in_process)
    assert got == [(i, int(expected[i][1]['cls'])) for i in order]
    assert torch.equal(
        torch.cat([batch['inputs'] for batch in workers]),
        torch.cat([batch['inputs'] for batch in in_process]))


def test_sizes_come_from_the_index(shard_folder):
    # The node cache's plan sizes a sample it never downloaded by them.
    root, expected = shard_folder
    dataset = make_dataset(root)
    files = SampleFiles(dataset, ('img_path', 'seg_map_path'))
    for idx, (_, members) in enumerate(expected):
        assert dataset.sample_nbytes(idx, 'img_path') == len(members['jpg'])
        assert dataset.sample_nbytes(idx, 'seg_map_path') == 0
        assert files.nbytes(idx) == len(members['jpg'])


def test_remote_shards_and_json_annotations(tmp_path):
    objects = {}
    for shard in range(2):
        samples = [(key, {
            'jpg': members['jpg'],
            'json': json.dumps(dict(gt_label=shard, note=key)).encode()
        }) for key, members in image_samples(shard, count=3)]
        path = tmp_path / f'{shard}.tar'
        write_shard(str(path), samples)
        objects[f'tar/train-{shard}.tar'] = path.read_bytes()
    with LoopbackHTTPServer(objects) as srv:
        dataset = TarShardDataset(
            data_root=srv.base_url,
            shards='tar/train-{0..1}.tar',
            ann_ext='json',
            index_dir=str(tmp_path / 'index'),
            index_progress=False,
            pipeline=PIPELINE)
        assert len(dataset) == 6
        info = dataset.get_data_info(4)
        assert (info['gt_label'], info['note']) == (1, info['sample_key'])
        assert info['shard'] == srv.url('tar/train-1.tar')
        assert dataset[4]['inputs'].shape == (3, 16, 24)
        # A .json member may name a file of its own: its size is unknown.
        assert dataset.sample_nbytes(4, 'seg_map_path') is None
        assert dataset.sample_nbytes(4, 'sample_key') == 0


def test_a_json_member_may_not_name_another_file(tmp_path):
    samples = [(key, {
        'jpg': members['jpg'],
        'json': json.dumps(dict(img_path='/etc/passwd')).encode()
    }) for key, members in image_samples(0, count=2)]
    write_shard(str(tmp_path / 'a.tar'), samples)
    dataset = TarShardDataset(
        data_root=str(tmp_path), shards='a.tar', ann_ext='json',
        index_progress=False, pipeline=PIPELINE)
    key = dataset._index.key(1)
    with pytest.raises(AnnotationFormatError,
                       match=rf"a\.tar: {key}\.json sets \['img_path'\]"):
        dataset.get_data_info(1)


def test_expand_shards(tmp_path):
    for name in ('b-1.tar', 'b-0.tar', 'other.tar'):
        (tmp_path / name).write_bytes(b'')
    (tmp_path / 'list.txt').write_text('b-1.tar\n\nb-0.tar\n')
    local = [str(tmp_path / 'b-0.tar'), str(tmp_path / 'b-1.tar')]
    assert expand_shards('b-*.tar', str(tmp_path)) == local
    assert expand_shards('list.txt', str(tmp_path)) == local[::-1]
    assert expand_shards('s3://x/p-{08..10}.tar', str(tmp_path)) == [
        's3://x/p-08.tar', 's3://x/p-09.tar', 's3://x/p-10.tar'
    ]


def test_demo_config_trains_on_tar_shards(demo_root, train_env, tmp_path):
    for split in ('train', 'val'):
        pack_image_list(
            osp.join(demo_root, f'{split}.txt'), demo_root,
            str(tmp_path / 'tar'), split, samples_per_shard=16)
    out = train_packed_demo(TAR_CONFIG, tmp_path, train_env,
                            tmp_path / 'work')
    assert 'Indexed 4 tar shards: 64 samples' in out


def test_shard_sizes_give_the_shard_of_every_index(tmp_path):
    counts = [2, 5, 3]
    for shard, count in enumerate(counts):
        write_shard(str(tmp_path / f'train-{shard:06d}.tar'),
                    image_samples(shard, count))
    dataset = make_dataset(tmp_path)
    assert dataset.shard_sizes().tolist() == counts
    # One shard per window: each shard is read in one run.
    sampler = ShardWindowSampler(dataset, seed=0, window_shards=1)
    shards = [dataset.get_data_info(i)['shard'] for i in sampler]
    runs = [shard for shard, _ in itertools.groupby(shards)]
    assert sorted(runs) == sorted(set(runs)) and len(runs) == 3
