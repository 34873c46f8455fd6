"""CachedPipelineHead: equality, geometry, invalidation, refusal, budget."""
import copy
import json
import multiprocessing
import os

import cv2
import numpy as np
import pytest
from cached_head_fill import HEAD as FILL_HEAD
from cached_head_fill import digest, run_rank
from helpers import age_head_link as age
from mmcv.transforms import Compose
from mmengine.registry import TRANSFORMS

import mmdata_plugin  # noqa: F401
from mmdata_plugin.cache import NodeStore
from mmdata_plugin.cache.head_entry_format import decode_head_entry
from mmdata_plugin.transforms.cached_pipeline_head import NAMESPACE
from mmdata_plugin.utils import (camera_like_image, encode_jpeg,
                                 pixel_difference)

_FORK = multiprocessing.get_context('fork')
HEAD = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_label=True,
         with_keypoints=True),
    dict(type='Resize', scale=(96, 4096), keep_ratio=True),
]


def _write_images(folder, count=3, size=(320, 240)):
    paths = []
    for seed in range(count):
        path = str(folder / f'img{seed}.jpg')
        with open(path, 'wb') as file:
            file.write(encode_jpeg(camera_like_image(*size, seed), 90))
        paths.append(path)
    return paths


def _sample(path, index=0):
    return dict(
        img_path=path,
        sample_idx=index,
        instances=[
            dict(bbox=[10.0, 20.0, 200.0, 180.0], bbox_label=1,
                 keypoints=[[50.0, 60.0, 2.0]]),
            dict(bbox=[0.5, 1.5, 31.0, 17.0], bbox_label=0,
                 keypoints=[[5.0, 6.0, 1.0]]),
        ])


def _head(tmp_path, transforms=HEAD, **kwargs):
    return TRANSFORMS.build(
        dict(type='CachedPipelineHead', transforms=copy.deepcopy(transforms),
             cache_dir=str(tmp_path / 'store'), **kwargs))


def _assert_same(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert a[key].dtype == b[key].dtype and \
                np.array_equal(a[key], b[key]), key
        else:
            assert a[key] == b[key] and type(a[key]) is type(b[key]), key


@pytest.mark.parametrize('storage', ['raw', 'png'])
def test_lossless_storage_is_bitwise_equal_to_uncached(tmp_path, storage):
    paths = _write_images(tmp_path)
    plain = Compose(copy.deepcopy(HEAD))
    head = _head(tmp_path, storage=storage)
    for epoch in range(2):
        for index, path in enumerate(paths):
            _assert_same(head(_sample(path, index)),
                         plain(_sample(path, index)))
    counts = head.store.counters(NAMESPACE)
    assert (counts['misses'], counts['hits'], counts['produced']) == (3, 3, 3)


def test_jpeg_storage_psnr_and_exact_geometry(tmp_path):
    path, = _write_images(tmp_path, count=1)
    plain = Compose(copy.deepcopy(HEAD))(_sample(path))
    head = _head(tmp_path, storage='jpeg', quality=95)
    miss, hit = head(_sample(path)), head(_sample(path))
    assert np.array_equal(miss['img'], plain['img'])  # exact when computed
    assert pixel_difference(hit['img'], plain['img']).psnr >= 35
    for key in ('img_shape', 'ori_shape', 'scale_factor', 'gt_bboxes',
                'gt_keypoints', 'gt_bboxes_labels'):
        assert np.array_equal(hit[key], plain[key]), key


def test_max_side_keeps_geometry_and_annotations_consistent(tmp_path):
    path, = _write_images(tmp_path, count=1, size=(400, 300))
    head = _head(tmp_path, transforms=HEAD[:2], max_side=100)
    out = head(_sample(path))
    assert out['img'].shape[:2] == out['img_shape'] == (75, 100)
    assert out['ori_shape'] == (300, 400)
    assert out['scale_factor'] == (0.25, 0.25)
    np.testing.assert_allclose(out['gt_bboxes'][0], [2.5, 5, 50, 45])
    np.testing.assert_allclose(out['gt_keypoints'][0, 0], [12.5, 15, 2])
    _assert_same(head(_sample(path)), out)


def test_source_change_is_a_miss(tmp_path):
    path, = _write_images(tmp_path, count=1)
    head = _head(tmp_path)
    first = head(_sample(path))
    with open(path, 'wb') as file:
        file.write(encode_jpeg(camera_like_image(320, 240, seed=99), 90))
    os.utime(path, ns=(1, 1))  # even with an older mtime: size differs too
    second = head(_sample(path))
    assert not np.array_equal(first['img'], second['img'])
    _assert_same(second, Compose(copy.deepcopy(HEAD))(_sample(path)))
    changed = _sample(path)
    changed['instances'][0]['bbox'] = [1.0, 2.0, 3.0, 4.0]
    assert head(changed)['gt_bboxes'][0, 0] == pytest.approx(0.4)
    assert head.store.counters(NAMESPACE)['hits'] == 0


def test_same_size_rewrite_with_a_new_mtime_is_a_miss(tmp_path):
    # BMP files of one shape have one size: only the mtime tells the
    # rewritten file from the cached one.
    path = str(tmp_path / 'img.bmp')
    images = [camera_like_image(64, 48, seed) for seed in (1, 2)]
    encoded = [cv2.imencode('.bmp', image)[1].tobytes() for image in images]
    assert len(encoded[0]) == len(encoded[1])
    head = _head(tmp_path, transforms=HEAD[:1])
    outputs = []
    for mtime_ns, data in zip((10**18, 10**18 + 10**9), encoded):
        with open(path, 'wb') as file:
            file.write(data)
        os.utime(path, ns=(mtime_ns, mtime_ns))
        outputs.append(head(dict(img_path=path))['img'])
    for output, image in zip(outputs, images):
        np.testing.assert_array_equal(output, image)
    assert head.counters()['hits'] == 0


def test_inner_config_change_is_a_miss(tmp_path):
    path, = _write_images(tmp_path, count=1)
    _head(tmp_path)(_sample(path))
    other = copy.deepcopy(HEAD)
    other[2]['scale'] = (64, 4096)
    head = _head(tmp_path, transforms=other)
    assert head(_sample(path))['img_shape'] == (64, 85)
    assert head.store.counters(NAMESPACE)['hits'] == 0
    assert head.store.usage().entries == 2


@pytest.mark.parametrize('transform,reason', [
    (dict(type='RandomFlip', prob=0.5), 'is random'),
    (dict(type='RandomResize', scale=(64, 64), ratio_range=(0.5, 2.0)),
     'is random'),
    (dict(type='PackImageLabelInputs'), 'is not known to be deterministic'),
])
def test_random_inner_transform_refused_by_name(tmp_path, transform, reason):
    with pytest.raises(ValueError,
                       match=rf'\[1\] \({transform["type"]}\) {reason}'):
        _head(tmp_path, transforms=[HEAD[0], transform])
    nested = [dict(type='ReducedDecodePipeline', transforms=[
        HEAD[0], dict(type='Resize', scale=(64, 64)), transform])]
    with pytest.raises(ValueError, match=r'transforms\[2\]'):
        _head(tmp_path, transforms=nested)


def test_user_declared_deterministic_type_is_accepted(tmp_path):
    _head(tmp_path, transforms=[HEAD[0], dict(type='PackImageLabelInputs')],
          deterministic_types=['PackImageLabelInputs'])


def test_budget_respected_and_outputs_still_right(tmp_path):
    paths = _write_images(tmp_path, count=6)
    plain = Compose(copy.deepcopy(HEAD))
    entry_bytes = 96 * 128 * 3 + 2000
    head = _head(tmp_path, cache_limit=2 * entry_bytes + 1000)
    for epoch in range(2):
        for index, path in enumerate(paths):
            _assert_same(head(_sample(path, index)),
                         plain(_sample(path, index)))
            usage = head.store.usage()
            assert usage.committed_bytes + usage.inflight_bytes <= \
                usage.limit
    counts = head.store.counters(NAMESPACE)
    assert counts['evicted_entries'] > 0
    assert head.store.usage().entries == 2


def test_damaged_entry_is_produced_again(tmp_path):
    path, = _write_images(tmp_path, count=1)
    head = _head(tmp_path)
    expected = head(_sample(path))
    entry = head.store.entry_path(NAMESPACE, head.sample_key(_sample(path)))
    os.chmod(entry, 0o644)
    with open(entry, 'r+b') as file:
        file.write(b'garbage!')
    for _ in range(2):
        _assert_same(head(_sample(path)), expected)
    # The damaged read was a miss, and its entry was replaced: the last
    # read is a hit on a good entry, nothing decoded again.
    counts = head.counters()
    assert (counts['hits'], counts['misses'], counts['produced']) == (1, 2, 2)
    with open(entry, 'rb') as file:
        assert decode_head_entry(file.read()).fields.keys() >= {'img'}


def _run_ranks(tmp_path, cache_dir, paths, tag, kill_on_write=None):
    outs = [str(tmp_path / f'{tag}{rank}.json') for rank in range(2)]
    ranks = [
        _FORK.Process(target=run_rank,
                      args=(cache_dir, out, paths, kill_on_write))
        for out in outs
    ]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join(120)
    return [rank.exitcode for rank in ranks], outs


def test_concurrent_fill_2_ranks_x_2_workers_with_kill_mid_write(tmp_path):
    """kill -9 mid-write in every worker's 2nd entry, then a clean run."""
    paths = _write_images(tmp_path, count=8)
    cache_dir = str(tmp_path / 'store')
    codes, _ = _run_ranks(tmp_path, cache_dir, paths, 'killed', 2)
    assert all(code != 0 for code in codes)  # their workers died
    assert os.listdir(os.path.join(cache_dir, 'tmp'))  # half-written files
    codes, outs = _run_ranks(tmp_path, cache_dir, paths, 'clean')
    assert codes == [0, 0]
    plain = Compose(copy.deepcopy(FILL_HEAD))
    expected = {
        str(i): digest(plain(dict(img_path=path)))
        for i, path in enumerate(paths)
    }
    for out in outs:
        with open(out) as file:
            assert json.load(file) == expected  # no partial entry was read
    store = NodeStore(cache_dir, '50MB')
    assert os.listdir(os.path.join(cache_dir, 'tmp')) == []
    usage = store.usage()
    assert usage.entries == len(paths) and usage.inflight_bytes == 0
    on_disk = sum(
        os.path.getsize(os.path.join(d, n))
        for d, _, names in os.walk(os.path.join(cache_dir, 'entries'))
        for n in names)
    assert usage.committed_bytes == on_disk
    assert store.counters(NAMESPACE)['produced'] == len(paths)


def test_random_tail_sees_same_inputs_cold_warm_and_uncached(tmp_path):
    """What FastResume's bitwise guarantee needs from a lossless head."""
    paths = _write_images(tmp_path, count=3)
    tail = [dict(type='RandomImageCrop', crop_size=48),
            dict(type='RandomFlip', prob=0.5, direction='horizontal')]
    cached = Compose([dict(type='CachedPipelineHead', transforms=HEAD,
                           cache_dir=str(tmp_path / 'store'),
                           storage='png')] + tail)
    plain = Compose(HEAD + tail)
    runs = []
    for pipeline in (plain, cached, cached):  # uncached, cold, warm
        np.random.seed(7)
        runs.append([pipeline(_sample(p))['img'] for p in paths * 2])
    for run in runs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(runs[0], run))


def test_remote_source_keyed_by_backend_stat_etag(tmp_path):
    from mmengine.fileio import register_backend
    from mmengine.fileio.backends import LocalBackend

    class Stat:
        size, etag = 7, '"v1"'

    @register_backend('h12stat', prefixes='h12stat', force=True)
    class StatBackend(LocalBackend):

        def stat(self, path):
            return Stat()

    head = _head(tmp_path, transforms=[HEAD[0]])
    key = head.sample_key(dict(img_path='h12stat://bucket/a.jpg'))
    assert 'h12stat://bucket/a.jpg|7|etag="v1"' in key
    Stat.etag = None
    with pytest.raises(ValueError, match='gives no ETag'):
        head.sample_key(dict(img_path='h12stat://bucket/a.jpg'))
    del StatBackend


@pytest.mark.parametrize('check', [True, False])
def test_remote_source_check_and_its_opt_out(tmp_path, check):
    from mmdata_plugin.testing import LoopbackHTTPServer
    _write_images(tmp_path, count=3)
    loader = dict(type='LoadImageFromFile',
                  backend_args=dict(backend='remote_http'))
    head = _head(tmp_path, transforms=[loader],
                 check_remote_source=check)
    with LoopbackHTTPServer(str(tmp_path)) as server:
        urls = [server.url(f'img{i}.jpg') for i in range(3)]

        def epoch():
            before = server.stats()
            imgs = [head(dict(img_path=url))['img'] for url in urls]
            after = server.stats()
            return imgs, (after.get_requests - before.get_requests,
                          after.head_requests - before.head_requests)

        first, requests = epoch()
        # One download per image; with the check, a stat per read too.
        assert requests == (3, 3 if check else 0)
        second, requests = epoch()
        assert requests == (0, 3 if check else 0)
        assert all(np.array_equal(a, b) for a, b in zip(first, second))
        # An object changed under its URL: a miss with the check; without
        # it, the old entry (the documented price of the opt-out).
        server.put('img0.jpg', encode_jpeg(camera_like_image(320, 240, 7), 90))
        third, requests = epoch()
        assert requests == ((1, 3) if check else (0, 0))
        assert np.array_equal(third[0], first[0]) is not check


def test_inputs_changed_in_place_come_back_on_a_hit(tmp_path):
    # mmseg's LoadAnnotations appends to the data info's seg_fields list
    # instead of replacing it; its segmentation transforms look there.
    from mmcv.transforms import BaseTransform

    @TRANSFORMS.register_module(name='AppendsSegFields', force=True)
    class AppendsSegFields(BaseTransform):

        def transform(self, results):
            results['gt_seg_map'] = np.ones((4, 4), np.uint8)
            results['seg_fields'].append('gt_seg_map')
            return results

    path, = _write_images(tmp_path, count=1)
    head = _head(tmp_path, transforms=[HEAD[0], dict(type='AppendsSegFields')],
                 deterministic_types=['AppendsSegFields'])

    def info():
        return dict(img_path=path, seg_fields=[], sample_idx=0)

    miss, hit = head(info()), head(info())
    assert miss['seg_fields'] == hit['seg_fields'] == ['gt_seg_map']
    _assert_same(miss, hit)


def test_recorded_sources_tell_which_images_the_head_serves(tmp_path):
    paths = _write_images(tmp_path, count=2)
    head = _head(tmp_path)
    head(_sample(paths[0]))
    # Links only once asked for (by RemoteCachePrefetchHook).
    assert not os.path.exists(tmp_path / 'store' / 'head_sources')
    sources = head.record_sources()
    assert not sources.serves(paths[0]) and not sources.serves(paths[1])
    head(_sample(paths[0]))  # a hit links its source
    head(_sample(paths[1]))  # so does a stored miss
    assert sources.serves(paths[0]) and sources.serves(paths[1])
    key = head.sample_key(_sample(paths[1]))
    os.unlink(head.store.entry_path(NAMESPACE, key))  # evicted
    age(sources, paths[1])  # (a link just made counts while produced)
    assert not sources.serves(paths[1]) and sources.serves(paths[0])
