import gc
import glob
import json
import os
import os.path as osp

import numpy as np
import pytest
from mmengine.dataset import Compose
from torch.utils.data import DataLoader

from mmdata_plugin.datasets import (AnnotationFormatError, ImageListDataset,
                                    RankShardedDataset, RankShardedSampler,
                                    StaleIndexError)
from mmdata_plugin.datasets import rank_shard_files
from mmdata_plugin.datasets import rank_sharded_dataset as dataset_module
from mmdata_plugin.sample_order import SampleIndex
from mmdata_plugin.testing import process_memory

TRICKY = (b'a.jpg 1\n\n  \nb c.jpg 22\r\nx.jpg 0   \n'
          b'd\xc3\xa9j\xc3\xa0.jpg\t7\nlast.jpg 3')


def _dataset(tmp_path, data=TRICKY, name='ann.txt', **kwargs):
    ann = tmp_path / name
    if not ann.exists() or ann.read_bytes() != data:
        ann.write_bytes(data)
    return RankShardedDataset(
        ann_file=name, data_root=str(tmp_path), **kwargs)


def test_reads_like_image_list_dataset(tmp_path):
    ours = _dataset(tmp_path, data_prefix=dict(img_path='imgs'))
    stock = ImageListDataset(
        ann_file='ann.txt',
        data_root=str(tmp_path),
        data_prefix=dict(img_path='imgs'))
    assert len(ours) == len(stock) == 5
    for idx in range(5):
        assert ours.get_data_info(idx) == stock.get_data_info(idx)
    assert ours.get_data_info(-1)['img_path'] == str(
        tmp_path / 'imgs' / 'last.jpg')
    assert ours.get_data_info(SampleIndex(1, seed=5))['gt_label'] == 22
    assert ours.get_cat_ids(1) == [22]
    with pytest.raises(IndexError, match='out of range'):
        ours.get_data_info(5)


def test_base_dataset_behaviour(tmp_path):
    ours = _dataset(
        tmp_path,
        metainfo=dict(classes=('a', 'b')),
        pipeline=[],
        lazy_init=True)
    assert not ours._fully_initialized
    assert len(ours) == 5  # full_init on demand
    assert ours.metainfo == dict(classes=('a', 'b'))
    assert isinstance(ours.pipeline, Compose)  # what DataMonitorHook walks
    assert ours[2] == ours.get_data_info(2)
    with pytest.raises(TypeError, match='never loads'):
        ours.load_data_list()
    with pytest.raises(ValueError, match='filter_cfg'):
        _dataset(tmp_path, filter_cfg=dict(filter_empty_gt=True))


@pytest.mark.parametrize('indices, expected', [
    (2, [0, 1]),
    (-2, [3, 4]),
    ([4, 0, 4], [4, 0, 4]),
    (np.array([3, -5]), [3, 0]),
])
def test_indices_and_subsets(tmp_path, indices, expected):
    full = _dataset(tmp_path)
    labels = [full.get_data_info(i)['gt_label'] for i in range(5)]
    subset = _dataset(tmp_path, indices=indices)
    assert [subset.get_data_info(i)['gt_label']
            for i in range(len(subset))] == [labels[i] for i in expected]
    copy = full.get_subset(indices)
    assert len(full) == 5 and len(copy) == len(expected)
    nested = copy.get_subset([len(expected) - 1])
    assert nested.get_data_info(0)['gt_label'] == labels[expected[-1]]
    full.get_subset_(indices)
    assert len(full) == len(expected)
    with pytest.raises(IndexError):
        full.get_subset([10])


def test_jsonl_records_metainfo_and_prefixes(tmp_path):
    lines = [
        json.dumps(dict(metainfo=dict(classes=['x', 'y'], version=2))),
        json.dumps(dict(img_path='a b.jpg', gt_label=1, extra=[1, 2])),
        '',
        json.dumps(dict(img_path='c.jpg', gt_label=[0, 1])),
    ]
    ours = _dataset(
        tmp_path,
        '\n'.join(lines).encode(),
        name='ann.jsonl',
        metainfo=dict(version=3),
        data_prefix=dict(img_path='imgs'))
    assert len(ours) == 2
    # The file fills metainfo keys the config does not set.
    assert ours.metainfo == dict(classes=['x', 'y'], version=3)
    assert ours.get_data_info(0) == dict(
        img_path=osp.join(str(tmp_path), 'imgs', 'a b.jpg'),
        gt_label=1,
        extra=[1, 2],
        sample_idx=0)
    assert ours.get_cat_ids(1) == [0, 1]


@pytest.mark.parametrize('record, match', [
    ('{"img_path": "a.jpg", }', r'ann\.jsonl:3: invalid JSON record'),
    ('{"gt_label": 1}', r"ann\.jsonl:3: the record has no 'img_path'"),
])
def test_bad_jsonl_record_names_file_and_line(tmp_path, record, match):
    data = f'{{"img_path": "ok.jpg"}}\n\n{record}\n'.encode()
    ours = _dataset(tmp_path, data, name='ann.jsonl')
    ours.get_data_info(0)
    with pytest.raises(AnnotationFormatError, match=match):
        ours.get_data_info(1)


def test_leading_spaces_belong_to_the_path_like_image_list_dataset(
        tmp_path):
    ours = _dataset(tmp_path, b' lead.jpg 4\n')
    stock = ImageListDataset(ann_file='ann.txt', data_root=str(tmp_path))
    assert ours.get_data_info(0)['img_path'] == stock.get_data_info(
        0)['img_path'] == osp.join(str(tmp_path), ' lead.jpg')


def test_bad_record_far_into_the_file_names_record_and_byte(
        tmp_path, monkeypatch):
    from mmdata_plugin.datasets import line_index
    monkeypatch.setattr(line_index, '_LINE_COUNT_LIMIT', 8)
    data = b'{"img_path": "ok.jpg"}\n{"gt_label": 1}\n'
    ours = _dataset(tmp_path, data, name='ann.jsonl')
    with pytest.raises(AnnotationFormatError,
                       match=r'ann\.jsonl: record 1 at byte 23: the record'):
        ours.get_data_info(1)


def test_bad_annotation_files(tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.txt'):
        RankShardedDataset(ann_file='nope.txt', data_root=str(tmp_path))
    with pytest.raises(AnnotationFormatError, match='no sample lines'):
        _dataset(tmp_path, b'\n\n')
    with pytest.raises(AnnotationFormatError, match=r'ann\.txt:2: .*UTF-8'):
        _dataset(tmp_path, b'a.jpg 1\nb\xff.jpg 2\n')
    with pytest.raises(AnnotationFormatError,
                       match=r'ann\.txt:3: expected "relative/path label"'):
        _dataset(tmp_path, b'a.jpg 1\n\nb.jpg\n')


def _load_pipeline(**kwargs):
    return [dict(type='LoadImageFromFile', **kwargs)]


def test_missing_image_names_path_and_sample(tmp_path):
    ours = _dataset(tmp_path, pipeline=_load_pipeline())
    with pytest.raises(FileNotFoundError) as error:
        ours[1]
    assert 'b c.jpg' in str(error.value)
    assert any('sample 1' in note and 'b c.jpg' in note
               for note in error.value.__notes__)
    loader = DataLoader(ours, batch_size=1, num_workers=1)
    with pytest.raises(FileNotFoundError, match=r'while loading sample 0 '):
        next(iter(loader))


def test_max_refetch_counts_and_logs_drops(tmp_path, monkeypatch, demo_root):
    logged = []
    monkeypatch.setattr(dataset_module, 'print_log',
                        lambda msg, **kwargs: logged.append(msg))
    image = sorted(glob.glob(osp.join(demo_root, 'val', '*', '*.jpg')))[0]
    (tmp_path / 'ann.txt').write_text(f'gone.jpg 1\n{image} 2\n')
    ours = RankShardedDataset(
        ann_file=str(tmp_path / 'ann.txt'),
        pipeline=_load_pipeline(ignore_empty=True))
    np.random.seed(0)
    assert ours[0]['gt_label'] == 2  # the drop was replaced
    assert ours.num_dropped >= 1
    assert "dropped sample 0 (img_path='gone.jpg')" in logged[0]
    assert len(logged) == ours.num_dropped
    ours.test_mode = True
    with pytest.raises(RuntimeError, match='dropped sample 0 .* test mode'):
        ours[0]


def _lines(n):
    return b''.join(b'dir/img_%07d.jpg %d\n' % (i, i % 13) for i in range(n))


def test_shard_files_give_the_same_samples(tmp_path, monkeypatch):
    shard_dir = tmp_path / 'shards'
    shard_dir.mkdir()
    orphan = shard_dir / f'mmdata-shard-{os.uname().nodename}-999999-0-1.bin'
    orphan.write_bytes(b'')
    monkeypatch.setattr(rank_shard_files, '_WINDOW', 64)  # many windows
    ours = _dataset(
        tmp_path,
        _lines(500),
        indices=np.arange(499, 99, -1),  # subset: file order reversed
        materialize_shards=True,
        shard_dir=str(shard_dir))
    sampler = RankShardedSampler(ours, seed=1, mini_epochs=3)
    files = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        tagged = list(sampler)
        assert {idx.shard for idx in tagged} == {tagged[0].shard}
        files.append(tagged[0].shard)
        for idx in tagged[::7]:
            assert ours.get_data_info(idx) == ours.get_data_info(int(idx))
        assert sorted(os.listdir(shard_dir)) == sorted(
            osp.basename(f) for f in files[-2:])  # older ones removed
    assert not orphan.exists()
    missing = min(set(range(len(ours))) - set(tagged))
    with pytest.raises(KeyError, match='not in shard file'):
        ours.get_data_info(SampleIndex(missing, shard=files[-1]))
    ours._shard_writer.remove_all()
    assert os.listdir(shard_dir) == []


def _expected_paths(dataset, sampler, epoch):
    sampler.set_epoch(epoch)
    return [dataset.get_data_info(i)['img_path'] for i in sampler]


@pytest.mark.parametrize('materialize', [False, True])
def test_persistent_workers_see_each_epochs_reshuffle(tmp_path, materialize):
    ours = _dataset(
        tmp_path,
        _lines(40),
        materialize_shards=materialize,
        shard_dir=str(tmp_path))
    sampler = RankShardedSampler(ours, seed=7, mini_epochs=2)
    loader = DataLoader(
        ours,
        batch_size=3,
        sampler=sampler,
        num_workers=2,
        persistent_workers=True,
        collate_fn=lambda batch: [info['img_path'] for info in batch])
    seen = []
    for epoch in range(4):
        expected = _expected_paths(ours, sampler, epoch)
        sampler.set_epoch(epoch)
        got = [path for batch in loader for path in batch]
        assert got == expected
        seen.append(got)
    assert seen[0] != seen[2]  # new permutation for the next pass
    assert set(seen[0]) | set(seen[1]) == set(seen[2]) | set(seen[3])


def _worker_memory(batch):
    return process_memory()['uss'], len(batch)


class _ListDataset:
    """The copy-on-access control: samples as Python objects."""

    def __init__(self, n):
        self.items = [dict(img_path=f'dir/img_{i:07d}.jpg', gt_label=i % 13)
                      for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        return self.items[idx]


def _uss_growth(dataset, start_method):
    loader = DataLoader(
        dataset,
        batch_size=5000,
        num_workers=1,
        multiprocessing_context=start_method,
        collate_fn=_worker_memory)
    # Keep the forked worker's cyclic GC off the parent's objects: its
    # header writes copy pages whatever the dataset (noise of ~1 MiB).
    gc.freeze()
    try:
        usage = [uss for uss, _ in loader]
    finally:
        gc.unfreeze()
    return usage[-1] - usage[0]


@pytest.mark.parametrize('start_method', ['fork', 'spawn'])
def test_no_copy_on_access_growth_in_workers(tmp_path, start_method):
    n = 200_000
    ours = _dataset(tmp_path, _lines(n))
    growth = _uss_growth(ours, start_method)
    assert growth < 1.5 * 2**20, f'worker USS grew by {growth / 2**20:.1f} MiB'
    if start_method == 'fork':
        # The measurement sees copy-on-access where there is some.
        assert _uss_growth(_ListDataset(n), 'fork') > 8 * 2**20


def test_removed_shard_file_falls_back_to_the_annotation_file(tmp_path):
    ours = _dataset(tmp_path, _lines(50), materialize_shards=True,
                    shard_dir=str(tmp_path))
    tagged = list(RankShardedSampler(ours, seed=0))
    os.remove(tagged[0].shard)
    assert ours.get_data_info(tagged[0]) == ours.get_data_info(int(tagged[0]))


# ------------------------------------------- annotation files edited in place
def _edit_in_place(path, old, new):
    """Replace bytes, keeping size and mtime (touch -d, rsync, a restore):
    the index's fingerprint misses it beyond the first/last 64 KiB."""
    assert len(old) == len(new)
    stat = os.stat(path)
    data = path.read_bytes()
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, new))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _reopen(tmp_path, **kwargs):
    """The dataset of the annotation file as it is now (a new run)."""
    return RankShardedDataset(
        ann_file='ann.txt', data_root=str(tmp_path), **kwargs)


# 6000 lines (~140 KiB): line 3021 is 'dir/img_0003020.jpg 20' (3020 % 25),
# in the middle, out of reach of the fingerprint's edge hashes.
_MIDDLE = b''.join(b'dir/img_%07d.jpg %d\n' % (i, i % 25) for i in range(6000))


@pytest.mark.parametrize('materialize', [False, True])
def test_edit_that_moves_a_line_boundary_names_file_and_line(
        tmp_path, materialize):
    # Label 20 -> 2 on one line, 21 -> 211 on the next: same size, but the
    # boundary between them moved one byte. Without the span check sample
    # 3020 raised a bare ValueError and 3021 was served as ('g_...', 211).
    ours = _dataset(tmp_path, _MIDDLE)
    _edit_in_place(tmp_path / 'ann.txt',
                   b'img_0003020.jpg 20\ndir/img_0003021.jpg 21\n',
                   b'img_0003020.jpg 2\ndir/img_0003021.jpg 211\n')
    reopened = _reopen(tmp_path, materialize_shards=materialize,
                       shard_dir=str(tmp_path))
    assert reopened._index.path == ours._index.path  # not rebuilt: unseen
    for sample, line in ((3020, 3021), (3021, 3022)):
        if materialize:
            read = lambda: reopened.write_shard(np.array([sample]))  # noqa
        else:
            read = lambda: reopened.get_data_info(sample)  # noqa
        with pytest.raises(StaleIndexError,
                           match=rf'ann\.txt:{line}: the annotation file '
                           'changed after its index'):
            read()
    assert reopened.get_data_info(3022)['gt_label'] == 3022 % 25


@pytest.mark.parametrize('old, new, error, match', [
    (b'img_0003020.jpg 20\n', b'img_0003020.jpg x0\n', AnnotationFormatError,
     r'ann\.txt:3021: expected "relative/path label"'),
    (b'img_0003020.jpg 20\n', b'img_0003020.jpg 2\xff\n',
     AnnotationFormatError, r'ann\.txt:3021: line is not valid UTF-8'),
    (b'img_0003020.jpg 20\n', b'img_0003020.j\npg 0\n', StaleIndexError,
     r'ann\.txt:3021: the annotation file changed'),
])
def test_edit_inside_a_line_names_file_and_line(tmp_path, old, new, error,
                                                match):
    _dataset(tmp_path, _MIDDLE)
    _edit_in_place(tmp_path / 'ann.txt', old, new)
    with pytest.raises(error, match=match):
        _reopen(tmp_path).get_data_info(3020)


def test_utf8_byte_order_mark_is_stripped_in_both_formats(tmp_path):
    bom = b'\xef\xbb\xbf'
    ours = _dataset(tmp_path, bom + b'a.jpg 1\nb.jpg 2\n')
    stock = ImageListDataset(ann_file='ann.txt', data_root=str(tmp_path))
    assert ours.get_data_info(0) == stock.get_data_info(0)
    assert ours.get_data_info(0)['img_path'] == str(tmp_path / 'a.jpg')
    jsonl = _dataset(tmp_path, bom + b'{"metainfo": {"classes": ["x"]}}\n'
                     b'{"img_path": "a.jpg"}\n', name='ann.jsonl')
    assert jsonl.metainfo == dict(classes=['x'])
    assert jsonl.get_data_info(0)['img_path'] == str(tmp_path / 'a.jpg')


def test_label_outside_the_classes_names_file_and_line(tmp_path):
    data = b'a.jpg 0\nb.jpg 1\n\nc.jpg 2\n'
    two = dict(metainfo=dict(classes=('a', 'b')))
    ours = _dataset(tmp_path, data, **two)
    assert ours.get_data_info(1)['gt_label'] == 1
    match = (r'ann\.txt:4: label 2 is outside the dataset\'s 2 classes')
    with pytest.raises(AnnotationFormatError, match=match):
        ours.get_data_info(2)
    with pytest.raises(AnnotationFormatError, match=match):
        ImageListDataset(ann_file='ann.txt', data_root=str(tmp_path), **two)
    jsonl = _dataset(
        tmp_path, b'{"metainfo": {"classes": ["x", "y"]}}\n'
        b'{"img_path": "a", "gt_label": [1, 5]}\n', name='ann.jsonl')
    with pytest.raises(AnnotationFormatError,
                       match=r'ann\.jsonl:2: label 5 is outside'):
        jsonl.get_data_info(0)
    # JSON values that are not class indices: named at their line, not
    # cast (1.7 -> 1, true -> 1) or refused later by the pipeline.
    records = [b'"cat"', b'1.7', b'true', b'"1"', b'[0, 1.0]']
    jsonl = _dataset(
        tmp_path, b'{"metainfo": {"classes": ["x", "y"]}}\n' + b''.join(
            b'{"img_path": "a", "gt_label": %s}\n' % label
            for label in records) + b'{"img_path": "b", "gt_label": null}\n',
        name='ann.jsonl')
    for index, label in enumerate(records):
        with pytest.raises(AnnotationFormatError,
                           match=rf'ann\.jsonl:{index + 2}: label .* is not '
                           'a class index'):
            jsonl.get_data_info(index)
    assert jsonl.get_data_info(len(records))['gt_label'] is None
    # Without classes there is nothing to check against.
    assert _dataset(tmp_path, data).get_data_info(2)['gt_label'] == 2
