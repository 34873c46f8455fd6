"""LitDataChunkDataset: LitData's chunks through the usual pipeline."""
import hashlib
import json
import os
import os.path as osp
import shutil

import numpy as np
import pytest
from helpers import REPO_ROOT, train_packed_demo
from mmengine.fileio import get

from mmdata_plugin.datasets import (LitDataChunkDataset, LitDataChunkError,
                                    MDSShardError, ShardWindowSampler,
                                    pack_image_list_litdata)
from mmdata_plugin.datasets.annotation_lines import iter_path_labels
from mmdata_plugin.testing import LoopbackHTTPServer

#: Chunks written by litdata 0.2.76's BinaryWriter (chunk_bytes 3000: 4
#: chunks of 2, 2, 2 and 1 samples; leaves image: jpeg (from a
#: JpegImageFile), label: int, name: str, png: bytes) and what its
#: StreamingDataset read back from them.
LITDATA = osp.join(REPO_ROOT, 'tests', 'data', 'litdata_0.2.76')
LITDATA_CONFIG = osp.join(REPO_ROOT, 'configs', 'demo',
                          'tinycnn_demo-jpeg-litdata.py')
PIPELINE = [
    dict(type='LoadImageFromFile'),
    dict(type='PackImageLabelInputs'),
]


@pytest.fixture
def litdata_copy(tmp_path):
    """The LitData-written chunks, in a folder the test may change."""
    folder = tmp_path / 'litdata'
    shutil.copytree(LITDATA, folder)
    with open(folder / 'expected.json') as file:
        return folder, json.load(file)['samples']


def make(folder, tmp_path, **kwargs):
    kwargs.setdefault('pipeline', PIPELINE)
    return LitDataChunkDataset(
        index=str(folder / 'index.json'),
        index_dir=str(tmp_path / 'index'),
        index_progress=False,
        **kwargs)


def sha1(data):
    return hashlib.sha1(data).hexdigest()


def test_litdata_chunks_give_what_litdata_reads(litdata_copy, tmp_path):
    folder, expected = litdata_copy
    dataset = make(folder, tmp_path, label_column='label')
    assert len(dataset) == len(expected) == 7
    assert dataset.shard_sizes().tolist() == [2, 2, 2, 1]
    for idx, want in enumerate(expected):
        info = dataset.get_data_info(idx)
        assert sha1(get(info['img_path'])) == want['image_sha1']
        assert info['gt_label'] == want['label']  # negative labels too
        assert dataset[idx]['inputs'].shape[0] == 3
    # A bytes leaf is an image file too.
    pngs = make(folder, tmp_path, image_column='png')
    for idx, want in enumerate(expected):
        assert sha1(get(pngs.get_data_info(idx)['img_path'])) == \
            want['png_sha1']


def test_leaves_and_configs_that_cannot_serve_are_refused_naming_them(
        litdata_copy, tmp_path):
    folder, _ = litdata_copy
    chunk = str(folder / 'chunk-0-0.bin')
    with pytest.raises(LitDataChunkError,
                       match=f"{chunk}: no leaf 'img'; its leaves: .*"
                       "'image': 'jpeg'"):
        len(make(folder, tmp_path, image_column='img'))
    with pytest.raises(LitDataChunkError, match="leaf 'label' is serialized "
                       "as 'int'; as the image it must be"):
        len(make(folder, tmp_path, image_column='label'))
    with pytest.raises(LitDataChunkError, match="leaf 'png' is serialized "
                       "as 'bytes'; as the label"):
        len(make(folder, tmp_path, label_column='png'))
    # The str leaf holds no integer.
    with pytest.raises(MDSShardError, match='sample 0: .* no integer'):
        len(make(folder, tmp_path, label_column='name'))
    index = folder / 'index.json'
    listed = json.loads(index.read_text())
    for key, value, why in (('compression', 'zstd', 'compressed'),
                            ('encryption', 'fernet', 'encrypted'),
                            ('item_loader', 'TokensLoader', 'item_loader')):
        index.write_text(json.dumps(dict(
            listed, config=dict(listed['config'], **{key: value}))))
        with pytest.raises(LitDataChunkError, match=f'{index}: .*{why}'):
            len(make(folder, tmp_path))
    index.write_text(json.dumps(dict(listed, config={})))
    with pytest.raises(LitDataChunkError,
                       match=f'{index}: no LitData index.json'):
        len(make(folder, tmp_path))


def test_damaged_chunks_are_refused_naming_chunk_and_sample(
        litdata_copy, tmp_path):
    folder, _ = litdata_copy
    path = folder / 'chunk-0-1.bin'
    good = path.read_bytes()
    path.write_bytes(good[:-10])
    with pytest.raises(LitDataChunkError,
                       match=f'{path}: {len(good) - 10} bytes, index.json '
                       f'says {len(good)}'):
        len(make(folder, tmp_path))
    # Not checkable against index.json: the offsets say it.
    index = folder / 'index.json'
    listed = json.loads(index.read_text())
    for chunk in listed['chunks']:
        del chunk['chunk_bytes']
    index.write_text(json.dumps(listed))
    with pytest.raises(LitDataChunkError,
                       match=f'{path}: its items end at byte {len(good)}, '
                       f'the file has {len(good) - 10} bytes'):
        len(make(folder, tmp_path))
    # An item whose leaf sizes say more than its length.
    damaged = bytearray(good)
    first = int(np.frombuffer(good[4:8], '<u4')[0])
    damaged[first:first + 4] = np.uint32(5).tobytes()
    path.write_bytes(bytes(damaged))
    with pytest.raises(MDSShardError,
                       match=f'{path}: the columns of sample 0 .* do not add '
                       'up'):
        len(make(folder, tmp_path))


def test_written_chunks_read_back_exactly_and_by_shard_windows(
        demo_root, tmp_path):
    ann_file = osp.join(demo_root, 'train.txt')
    chunks = pack_image_list_litdata(ann_file, demo_root,
                                     str(tmp_path / 'litdata'),
                                     samples_per_chunk=10)
    listed = list(iter_path_labels(ann_file))
    dataset = make(tmp_path / 'litdata', tmp_path, label_column='label')
    assert len(dataset) == len(listed)
    assert len(chunks) == len(dataset.shard_sizes())
    for idx, (_, path, label) in enumerate(listed):
        info = dataset.get_data_info(idx)
        with open(osp.join(demo_root, path), 'rb') as file:
            assert get(info['img_path']) == file.read()
        assert info['gt_label'] == label
    sampler = ShardWindowSampler(dataset, seed=0, window_shards=2)
    assert sorted(sampler) == list(range(len(listed)))


def test_remote_chunks_over_http(tmp_path, litdata_copy):
    folder, expected = litdata_copy
    objects = {
        f'data/{name}': (folder / name).read_bytes()
        for name in os.listdir(folder)
    }
    with LoopbackHTTPServer(objects) as server:
        dataset = LitDataChunkDataset(
            data_root=server.url('data'),
            index='index.json',
            label_column='label',
            index_dir=str(tmp_path / 'index'),
            index_progress=False,
            pipeline=PIPELINE)
        assert len(dataset) == 7
        # The index: index.json and one GET per chunk, none per sample.
        assert sum(server.stats().requests_per_path.values()) == 5
        for idx, want in enumerate(expected):
            info = dataset.get_data_info(idx)
            assert info['shard'].startswith(server.url('data/chunk-0-'))
            assert sha1(get(info['img_path'])) == want['image_sha1']
            assert info['gt_label'] == want['label']


def test_demo_config_trains_on_litdata_chunks(demo_root, train_env,
                                              tmp_path):
    for split in ('train', 'val'):
        pack_image_list_litdata(
            osp.join(demo_root, f'{split}.txt'), demo_root,
            str(tmp_path / 'litdata' / split), samples_per_chunk=16)
    out = train_packed_demo(LITDATA_CONFIG, tmp_path, train_env,
                            tmp_path / 'work')
    assert 'Indexed 4 litdata shards: 64 samples' in out
