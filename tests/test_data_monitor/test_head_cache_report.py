"""DataMonitor: head cache hits/misses, and the advice to add one."""
import numpy as np
from mmengine.dataset import Compose
from test_verdict import _report, fake_rank

from mmdata_plugin.data_monitor import format_report
from mmdata_plugin.data_monitor.head_cache import (add_head_cache,
                                                   read_head_cache,
                                                   suggested_head)
from mmdata_plugin.utils import camera_like_image, encode_jpeg

DECODE_BOUND = dict(io=2.0, decode=30.0, **{'00_LoadImageFromFile': 1.0,
                                            '01_Resize': 5.0,
                                            '02_RandomFlip': 1.0})


class _Dataset:

    def __init__(self, pipeline):
        self.pipeline = Compose(pipeline)


def test_decode_bound_run_without_head_cache_gets_config_lines():
    report = _report(fake_rank(wait=9.0, compute=10.0, stages=DECODE_BOUND))
    plain = [dict(type='LoadImageFromFile'),
             dict(type='Resize', scale=(256, 256)),
             dict(type='RandomFlip', prob=0.5)]
    add_head_cache(report, read_head_cache(_Dataset(plain)), plain)
    advice, = [a['text'] for a in report['advice']
               if a['topic'] == 'head_cache']
    assert advice.startswith('Loading, decoding and resizing take 97% of '
                             'worker time (38.0 ms per batch)')
    assert ("dict(type='CachedPipelineHead', cache_limit='50GB', "
            "storage='raw',") in advice
    assert "dict(type='Resize', scale=(256, 256))])" in advice
    assert advice.endswith('unchanged: RandomFlip')
    assert report['head_cache'] is None
    assert 'CachedPipelineHead' in format_report(report)


def test_random_resize_gets_a_deterministic_resize_to_its_largest_output():
    reduced = [dict(type='ReducedDecodePipeline', transforms=[
        dict(type='LoadImageFromFile'),
        dict(type='RandomResize', scale=(72, 4096), ratio_range=(0.9, 1.2),
             keep_ratio=True),
        dict(type='RandomFlip', prob=0.5)])]
    assert suggested_head(reduced) == (
        "dict(type='CachedPipelineHead', cache_limit='50GB', storage='raw',\n"
        '     transforms=[\n'
        "        dict(type='ReducedDecodePipeline', transforms=[\n"
        "            dict(type='LoadImageFromFile'),\n"
        "            dict(type='Resize', scale=(87, 4916), keep_ratio=True)"
        '])]),\n'
        '... then, unchanged: RandomResize, RandomFlip')


def test_transforms_after_a_reduced_decode_head_stay_after_the_cache():
    pipeline = [
        dict(type='ReducedDecodePipeline', transforms=[
            dict(type='LoadImageFromFile'),
            dict(type='Resize', scale=(320, 320), keep_ratio=True)]),
        dict(type='RandomResize', scale=(224, 224), ratio_range=(0.8, 1.2)),
        dict(type='RandomImageCrop', crop_size=224),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackImageLabelInputs')]
    assert suggested_head(pipeline) == (
        "dict(type='CachedPipelineHead', cache_limit='50GB', storage='raw',\n"
        '     transforms=[\n'
        "        dict(type='ReducedDecodePipeline', transforms=[\n"
        "            dict(type='LoadImageFromFile'),\n"
        "            dict(type='Resize', scale=(320, 320), keep_ratio=True)"
        '])]),\n'
        '... then, unchanged: RandomResize, RandomImageCrop, RandomFlip, '
        'PackImageLabelInputs')


def test_compute_bound_or_cheap_decode_gets_no_head_cache_advice():
    plain = [dict(type='LoadImageFromFile'),
             dict(type='RandomFlip', prob=0.5)]
    compute_bound = _report(fake_rank(wait=0.5, compute=50.0,
                                      stages=DECODE_BOUND))
    add_head_cache(compute_bound, read_head_cache(_Dataset(plain)),
                   plain)
    cheap = _report(fake_rank(wait=9.0, compute=10.0, stages={
        'decode': 1.0, '00_LoadImageFromFile': 0.5, '01_RandomFlip': 20.0}))
    add_head_cache(cheap, read_head_cache(_Dataset(plain)), plain)
    for report in (compute_bound, cheap):
        assert 'head_cache' not in [a['topic'] for a in report['advice']]


def test_pipeline_with_head_cache_reports_hits_and_misses(tmp_path):
    path = str(tmp_path / 'a.jpg')
    with open(path, 'wb') as file:
        file.write(encode_jpeg(camera_like_image(64, 48, 0)))
    pipeline = [dict(type='CachedPipelineHead', cache_dir=str(tmp_path / 's'),
                     cache_limit='1MB',
                     transforms=[dict(type='LoadImageFromFile')])]
    dataset = _Dataset(pipeline)
    for _ in range(3):
        dataset.pipeline(dict(img_path=path))
    report = _report(fake_rank(wait=9.0, compute=10.0, stages=DECODE_BOUND))
    add_head_cache(report, read_head_cache(dataset), pipeline)
    summary = report['head_cache']
    assert (summary['hits'], summary['misses'], summary['produced']) == \
        (2, 1, 1)
    assert summary['committed_bytes'] > 64 * 48 * 3
    assert '2 hits, 1 misses (66.7% hits), 1 written' in \
        report['verdict']['summary']
    assert 'head_cache' not in [a['topic'] for a in report['advice']]
    assert np.isclose(summary['hit_ratio'], 2 / 3)
