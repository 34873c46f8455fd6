import pytest

from mmdata_plugin.transforms import decode_target, decode_target_from_pipeline
from mmdata_plugin.transforms.decode_target import locate_loader_and_resize

LOAD = dict(type='LoadImageFromFile')


@pytest.mark.parametrize('resize, target', [
    (dict(type='Resize', scale=(1333, 800), keep_ratio=True),
     ((1333, 800), True)),
    (dict(type='mmdet.Resize', scale=640), ((640, 640), False)),
    (dict(type='RandomResize', scale=(72, 4096), ratio_range=(0.9, 1.2),
          keep_ratio=True), ((87, 4916), True)),
    (dict(type='RandomResize', scale=[(1333, 640), (1333, 800)],
          keep_ratio=True), ((1333, 800), True)),
    (dict(type='RandomChoiceResize', scales=[(640, 480), (800, 600), 700]),
     ((800, 700), False)),
    (dict(type='ResizeEdge', scale=256), ((256, 1 << 20), True)),
    (dict(type='ResizeEdge', scale=256, edge='long'), ((256, 256), True)),
    (dict(type='ResizeEdge', scale=256, edge='height'), ((1, 256), False)),
    (dict(type='FixShapeResize', width=512, height=384, keep_ratio=True),
     ((512, 384), True)),
])
def test_target_is_the_largest_output_of_the_resize(resize, target):
    scale, keep_ratio = target
    assert decode_target(resize) == dict(scale=scale, keep_ratio=keep_ratio)


def test_annotation_loaders_may_sit_between_loader_and_resize():
    pipeline = [
        dict(type='RandomApplyNothing'), LOAD,
        dict(type='LoadAnnotations', with_bbox=True),
        dict(type='mmdet.LoadPanopticAnnotations'),
        dict(type='FilterAnnotations'),
        dict(type='Resize', scale=(64, 64)),
        dict(type='RandomCrop', crop_size=(8, 8))
    ]
    assert locate_loader_and_resize(pipeline) == (1, 5)


@pytest.mark.parametrize('pipeline, message', [
    ([dict(type='LoadImageFromNDArray'),
      dict(type='Resize', scale=8)], 'no LoadImageFromFile'),
    ([LOAD, dict(type='RandomCrop', crop_size=8),
      dict(type='Resize', scale=8)], r'transform #1 \(RandomCrop\)'),
    ([LOAD, dict(type='LoadAnnotations')], 'no resize follows'),
    ([LOAD, dict(type='Resize', scale_factor=0.5)], 'scale_factor'),
    ([LOAD, dict(type='RandomResize', scale=(8, 8), ratio_range=(1, 2),
                 resize_type='FixShapeResize')], 'resize_type'),
    ([LOAD, dict(type='ResizeEdge', scale=8, edge='diagonal')], 'edge'),
    ([LOAD, dict(type='RandomResize', scale=(8, 8))], 'ratio_range'),
    ([LOAD, dict(type='Resize', scale=(8, 8, 8))], 'Resize.scale'),
])
def test_pipelines_it_cannot_speed_up_are_refused(pipeline, message):
    with pytest.raises(ValueError, match=message):
        decode_target_from_pipeline(pipeline)


# ---------------------------------- a loader scale smaller than the resize's
def _reduced(scale, keep_ratio=True):
    return dict(type='LoadImageFromFileReduced', scale=scale,
                keep_ratio=keep_ratio)


_JITTER = dict(type='RandomResize', scale=(72, 4096), ratio_range=(0.9, 1.2),
               keep_ratio=True)


@pytest.mark.parametrize('loader, resize', [
    (_reduced((112, 112)), dict(type='Resize', scale=(224, 224),
                                keep_ratio=True)),
    # The base scale copied, the top of the ratio range forgotten.
    (_reduced((72, 4096)), _JITTER),
    (_reduced((224, 224), keep_ratio=False),
     dict(type='Resize', scale=(224, 300))),
])
def test_decode_smaller_than_the_resize_warns_naming_both(
        tmp_path, loader, resize):
    from mmdata_plugin.datasets import ImageListDataset, RankShardedDataset
    from mmdata_plugin.transforms import ReducedDecodePipeline
    (tmp_path / 'ann.txt').write_text('a.jpg 0\n')
    pipeline = [loader, dict(type='LoadAnnotations'), resize]
    match = (r'#0 LoadImageFromFileReduced\(.*\) decodes smaller than '
             rf'transform #2 {resize["type"]} outputs .* Give the loader '
             rf'scale=\({decode_target(resize)["scale"][0]},')
    for dataset in (RankShardedDataset, ImageListDataset):
        with pytest.warns(UserWarning, match=match):
            dataset(ann_file=str(tmp_path / 'ann.txt'), pipeline=pipeline,
                    lazy_init=True)
    with pytest.warns(UserWarning, match=match):
        ReducedDecodePipeline(pipeline)


@pytest.mark.parametrize('loader, resize', [
    (_reduced((87, 4916)), _JITTER),
    (_reduced((300, 300)), dict(type='Resize', scale=(224, 224),
                                keep_ratio=True)),
    # Not an absolute resize after the loader: nothing to compare.
    (_reduced((72, 72)), dict(type='RandomResizedCrop', scale=224)),
])
def test_no_warning_for_a_large_enough_decode(recwarn, loader, resize):
    from mmdata_plugin.transforms.decode_target import \
        warn_if_decode_too_small
    warn_if_decode_too_small([loader, resize])
    assert not [w for w in recwarn if 'decodes smaller' in str(w.message)]
