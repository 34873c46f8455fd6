"""MDSShardDataset: Streaming's MDS shards through the usual pipeline."""
import hashlib
import json
import os
import os.path as osp
import shutil

import numpy as np
import pytest
from helpers import REPO_ROOT, train_packed_demo
from mmengine.fileio import get

from mmdata_plugin.datasets import (MDSShardDataset, MDSShardError,
                                    ShardWindowSampler, TarShardDataset,
                                    TarShardError,
                                    pack_image_list_mds)
from mmdata_plugin.datasets.annotation_lines import iter_path_labels
from mmdata_plugin.testing import LoopbackHTTPServer

#: Shards written by mosaicml-streaming 0.13.0's MDSWriter (size_limit 3000:
#: 4 shards of 7 samples; columns image: jpeg, label: int, meta: json,
#: png: bytes, small: uint8) and what its MDSReader read back from them.
STREAMING = osp.join(REPO_ROOT, 'tests', 'data', 'mds_streaming_0.13')
MDS_CONFIG = osp.join(REPO_ROOT, 'configs', 'demo',
                      'tinycnn_demo-jpeg-mds.py')
PIPELINE = [
    dict(type='LoadImageFromFile'),
    dict(type='PackImageLabelInputs'),
]


@pytest.fixture
def streaming_copy(tmp_path):
    """The Streaming-written shards, in a folder the test may change."""
    folder = tmp_path / 'mds'
    shutil.copytree(STREAMING, folder)
    with open(folder / 'expected.json') as file:
        return folder, json.load(file)['samples']


def make(folder, tmp_path, **kwargs):
    kwargs.setdefault('pipeline', PIPELINE)
    return MDSShardDataset(
        index=str(folder / 'index.json'),
        index_dir=str(tmp_path / 'index'),
        index_progress=False,
        **kwargs)


def sha1(data):
    return hashlib.sha1(data).hexdigest()


def test_streaming_shards_give_what_streaming_reads(streaming_copy, tmp_path):
    folder, expected = streaming_copy
    dataset = make(folder, tmp_path, label_column='label')
    assert len(dataset) == len(expected) == 7
    assert dataset.shard_sizes().tolist() == [2, 2, 2, 1]
    for idx, want in enumerate(expected):
        info = dataset.get_data_info(idx)
        assert sha1(get(info['img_path'])) == want['image_sha1']
        assert info['gt_label'] == want['label']  # negative labels too
        assert osp.basename(info['shard']) == want['shard']
        width, height = want['image_size']
        assert dataset[idx]['inputs'].shape == (3, height, width)
    # A bytes column is an image file too; a json column is annotations.
    pngs = make(folder, tmp_path, image_column='png', ann_column='meta')
    for idx, want in enumerate(expected):
        info = pngs.get_data_info(idx)
        assert sha1(get(info['img_path'])) == want['png_sha1']
        assert (info['i'], info['name']) == (want['meta']['i'],
                                             want['meta']['name'])
    uint8 = make(folder, tmp_path, label_column='small')
    assert [uint8.get_data_info(i)['gt_label'] for i in range(7)] == [
        want['small'] for want in expected
    ]


def test_columns_that_cannot_serve_are_refused_naming_them(
        streaming_copy, tmp_path):
    folder, _ = streaming_copy
    shard = str(folder / 'shard.00000.mds')
    with pytest.raises(MDSShardError,
                       match=f"{shard}: no column 'img'; its columns: .*"
                       "'image': 'jpeg'"):
        len(make(folder, tmp_path, image_column='img'))
    with pytest.raises(MDSShardError, match="column 'label' is encoded as "
                       "'int'; as the image it must be one of"):
        len(make(folder, tmp_path, image_column='label'))
    with pytest.raises(MDSShardError, match="column 'meta' is encoded as "
                       "'json'; as the label"):
        len(make(folder, tmp_path, label_column='meta'))
    with pytest.raises(ValueError, match='label_column or ann_column'):
        make(folder, tmp_path, label_column='label', ann_column='meta')


def test_compressed_or_foreign_index_entries_are_refused(
        streaming_copy, tmp_path):
    folder, _ = streaming_copy
    index = folder / 'index.json'
    listed = json.loads(index.read_text())
    listed['shards'][2]['compression'] = 'zstd'
    index.write_text(json.dumps(listed))
    with pytest.raises(MDSShardError,
                       match=rf'{index}: shard 2 is compressed \(zstd\).*'
                       'compression=None'):
        len(make(folder, tmp_path))
    listed['shards'][2] = dict(listed['shards'][2], compression=None,
                               format='json')
    index.write_text(json.dumps(listed))
    with pytest.raises(MDSShardError,
                       match=r"shard 2 is no MDS shard \(format 'json'\)"):
        len(make(folder, tmp_path))
    index.write_text('[1, 2')
    with pytest.raises(MDSShardError, match=f'{index}: no MDS index.json'):
        len(make(folder, tmp_path))


def test_damaged_shards_are_refused_naming_shard_and_sample(
        streaming_copy, tmp_path):
    folder, _ = streaming_copy
    path = folder / 'shard.00001.mds'
    good = path.read_bytes()
    path.write_bytes(good[:-10])
    with pytest.raises(MDSShardError,
                       match=f'{path}: its samples end at byte '
                       f'{len(good)}, the file has {len(good) - 10} bytes'):
        len(make(folder, tmp_path))
    # A sample whose column sizes say more than its length.
    damaged = bytearray(good)
    first = int(np.frombuffer(good[4:8], '<u4')[0])
    damaged[first:first + 4] = np.uint32(5).tobytes()
    path.write_bytes(bytes(damaged))
    with pytest.raises(MDSShardError,
                       match=f'{path}: the columns of sample 0 .* do not add '
                       'up'):
        len(make(folder, tmp_path))
    path.write_bytes(b'no shard')
    with pytest.raises(MDSShardError, match=f'{path}: .* need .* bytes of '
                       'offsets'):
        len(make(folder, tmp_path))


def test_recorded_hashes_are_checked_when_indexing(streaming_copy,
                                                  tmp_path):
    folder, expected = streaming_copy
    index = folder / 'index.json'
    listed = json.loads(index.read_text())
    for entry in listed['shards']:
        data = (folder / entry['raw_data']['basename']).read_bytes()
        entry['raw_data']['hashes'] = dict(
            sha1=hashlib.sha1(data).hexdigest(),
            md5=hashlib.md5(data).hexdigest(),
            xxh64='not checked: xxhash is no dependency')
    index.write_text(json.dumps(listed))
    assert len(make(folder, tmp_path)) == len(expected)
    # A byte of an image changed: the shard's structure still holds, its
    # digests do not.
    path = folder / 'shard.00002.mds'
    damaged = bytearray(path.read_bytes())
    damaged[-20] ^= 0xff
    path.write_bytes(bytes(damaged))
    with pytest.raises(MDSShardError,
                       match=f'{path}: its md5 is [0-9a-f]+, index.json '
                       'says'):
        len(make(folder, tmp_path / 'again'))


def test_a_changed_shard_rebuilds_and_formats_never_share_an_index(
        streaming_copy, tmp_path):
    folder, expected = streaming_copy
    dataset = make(folder, tmp_path, label_column='label')
    index_path = dataset._index.path
    # Another choice of columns is another index, never this one.
    other = make(folder, tmp_path, image_column='png', label_column='label')
    assert other._index.path != index_path
    forced = make(folder, tmp_path, image_column='png',
                  label_column='label', index_file=index_path)
    info = forced.get_data_info(0)
    assert sha1(get(info['img_path'])) == expected[0]['png_sha1']
    # A shard replaced in place (samples swapped): rebuilt, right bytes.
    first, second = (folder / 'shard.00000.mds', folder / 'shard.00001.mds')
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    os.utime(first, ns=(1, 1))
    again = make(folder, tmp_path, label_column='label')
    assert again.get_data_info(0)['gt_label'] == expected[2]['label']


def test_written_shards_read_back_exactly_and_by_shard_windows(
        demo_root, tmp_path):
    ann_file = osp.join(demo_root, 'train.txt')
    shards = pack_image_list_mds(ann_file, demo_root, str(tmp_path / 'mds'),
                                 samples_per_shard=10)
    listed = list(iter_path_labels(ann_file))
    dataset = make(tmp_path / 'mds', tmp_path, label_column='label')
    assert len(dataset) == len(listed)
    assert dataset.shard_sizes().sum() == len(listed)
    assert len(shards) == len(dataset.shard_sizes())
    for idx, (_, path, label) in enumerate(listed):
        info = dataset.get_data_info(idx)
        with open(osp.join(demo_root, path), 'rb') as file:
            assert get(info['img_path']) == file.read()
        assert info['gt_label'] == label
    sampler = ShardWindowSampler(dataset, seed=0, window_shards=2)
    assert sorted(sampler) == list(range(len(listed)))


def test_remote_shards_over_http(tmp_path, streaming_copy):
    folder, expected = streaming_copy
    objects = {
        f'data/{name}': (folder / name).read_bytes()
        for name in os.listdir(folder)
    }
    with LoopbackHTTPServer(objects) as server:
        dataset = MDSShardDataset(
            data_root=server.url('data'),
            index='index.json',
            label_column='label',
            index_dir=str(tmp_path / 'index'),
            index_progress=False,
            pipeline=PIPELINE)
        assert len(dataset) == 7
        # The index: index.json and one GET per shard, none per sample.
        assert sum(server.stats().requests_per_path.values()) == 5
        for idx, want in enumerate(expected):
            info = dataset.get_data_info(idx)
            assert info['shard'] == server.url(f'data/{want["shard"]}')
            assert sha1(get(info['img_path'])) == want['image_sha1']
            assert info['gt_label'] == want['label']


def test_an_mds_shard_given_as_a_tar_shard_is_named(streaming_copy,
                                                    tmp_path):
    folder, _ = streaming_copy
    shard = str(folder / 'shard.00000.mds')
    with pytest.raises(ValueError,
                       match=f'{shard}: .* is read as a text file listing '
                       'shards, and this is none'):
        len(TarShardDataset(shards=shard, index_dir=str(tmp_path / 'i'),
                            index_progress=False))
    os.rename(shard, shard + '.tar')
    with pytest.raises(TarShardError,
                       match=f'{shard}.tar: not a tar file'):
        len(TarShardDataset(shards=shard + '.tar',
                            index_dir=str(tmp_path / 'i'),
                            index_progress=False))


def test_demo_config_trains_on_mds_shards(demo_root, train_env, tmp_path):
    for split in ('train', 'val'):
        pack_image_list_mds(
            osp.join(demo_root, f'{split}.txt'), demo_root,
            str(tmp_path / 'mds' / split), samples_per_shard=16)
    out = train_packed_demo(MDS_CONFIG, tmp_path, train_env,
                            tmp_path / 'work')
    assert 'Indexed 4 mds shards: 64 samples' in out
