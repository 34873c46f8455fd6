"""RankShardedDataset with a remote ann_file and remote images."""
import multiprocessing

import pytest

from mmdata_plugin.datasets import RankShardedDataset
from mmdata_plugin.remote import (HTTPRemoteBackend, RemoteChangedError,
                                  RemoteNotFoundError)
from mmdata_plugin.testing import LoopbackHTTPServer, MotoS3Server

LINES = ''.join(f'img/{i}.bin {i % 3}\n' for i in range(12)).encode()
IMAGES = {f'img/{i}.bin': bytes([i]) * (100 + i) for i in range(12)}
PIPELINE = [dict(type='ReadBytes')]


class ReadBytes:
    """A transform reading the sample through mmengine's fileio."""

    def __init__(self, backend_args=None):
        self.backend_args = backend_args

    def __call__(self, results):
        from mmengine import fileio
        results['bytes'] = fileio.get(
            results['img_path'], backend_args=self.backend_args)
        return results


@pytest.fixture(autouse=True)
def register_transform():
    from mmcv.transforms import TRANSFORMS
    TRANSFORMS.register_module(name='ReadBytes', module=ReadBytes,
                               force=True)


def make_dataset(base_url, tmp_path, **kwargs):
    return RankShardedDataset(
        ann_file='train.txt',
        data_root=base_url,
        remote_cache_dir=str(tmp_path / 'store'),
        index_dir=str(tmp_path / 'index'),
        index_progress=False,
        pipeline=PIPELINE,
        **kwargs)


def _build_in_child(base_url, tmp_path, queue):
    queue.put(len(make_dataset(base_url, tmp_path)))


def test_http_ann_file_fetched_once_per_node_and_samples_exact(tmp_path):
    with LoopbackHTTPServer(dict(IMAGES, **{'train.txt': LINES}),
                            latency=0.05) as srv:
        # Three processes of one node start at once: one download.
        context = multiprocessing.get_context('fork')
        queue = context.Queue()
        children = [
            context.Process(
                target=_build_in_child, args=(srv.base_url, tmp_path, queue))
            for _ in range(3)
        ]
        for child in children:
            child.start()
        for child in children:
            child.join(60)
        assert [queue.get(timeout=5) for _ in children] == [12, 12, 12]
        assert srv.stats().downloads['train.txt'] == 1
        dataset = make_dataset(srv.base_url, tmp_path)
        assert srv.stats().downloads['train.txt'] == 1
        for i in range(len(dataset)):
            sample = dataset[i]
            assert sample['bytes'] == IMAGES[f'img/{i}.bin']
            assert sample['gt_label'] == i % 3

        # A changed remote list is fetched and indexed anew, never mixed.
        srv.put('train.txt', LINES + b'img/0.bin 2\n')
        assert len(make_dataset(srv.base_url, tmp_path)) == 13
        assert srv.stats().downloads['train.txt'] == 2


def test_missing_sample_names_url_and_sample_index(tmp_path):
    with LoopbackHTTPServer(dict(IMAGES, **{'train.txt': LINES})) as srv:
        dataset = make_dataset(srv.base_url, tmp_path)
        srv.delete('img/7.bin')
        with pytest.raises(RemoteNotFoundError) as info:
            dataset[7]
        url = srv.url('img/7.bin')
        assert url in str(info.value)
        assert any('while loading sample 7' in note and url in note
                   for note in info.value.__notes__)


def test_list_changed_during_its_download_is_refused(tmp_path, monkeypatch):
    with LoopbackHTTPServer({'train.txt': LINES}) as srv:
        real_stat = HTTPRemoteBackend.stat

        def stat_then_change(self, url):
            before = real_stat(self, url)
            srv.put('train.txt', LINES[:-12])
            return before

        monkeypatch.setattr(HTTPRemoteBackend, 'stat', stat_then_change)
        with pytest.raises(RemoteChangedError, match=srv.url('train.txt')):
            make_dataset(srv.base_url, tmp_path)


def test_s3_ann_file_and_samples(tmp_path):
    with MotoS3Server() as s3:
        s3.put_objects('bucket', {
            f'set/{key}': value
            for key, value in dict(IMAGES, **{
                'train.txt': LINES
            }).items()
        })
        args = s3.backend_args(backoff=0.01)
        dataset = RankShardedDataset(
            ann_file='train.txt',
            data_root='s3://bucket/set',
            backend_args=args,
            remote_cache_dir=str(tmp_path / 'store'),
            index_dir=str(tmp_path / 'index'),
            index_progress=False,
            pipeline=[dict(type='ReadBytes', backend_args=args)])
        assert len(dataset) == 12
        for i in range(12):
            assert dataset[i]['bytes'] == IMAGES[f'img/{i}.bin']

