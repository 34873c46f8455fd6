"""LoadImageFromFileReduced against mmcv's LoadImageFromFile (+ Resize)."""
import io
import os.path as osp
from fractions import Fraction

import cv2
import mmcv
import numpy as np
import pytest
from mmcv.transforms import Compose
from mmengine.fileio import BaseStorageBackend, register_backend
from PIL import Image

from mmdata_plugin.transforms import (LoadImageFromFileReduced,
                                      ReducedDecodePipeline)
from mmdata_plugin.transforms import image_decoding
from mmdata_plugin.transforms.decode_target import decode_target
from mmdata_plugin.transforms.image_decoding import available_backends
from mmdata_plugin.utils import (camera_like_image, encode_jpeg,
                                 pixel_difference)

SHORT_SIDE = (72, 4096)  # mmcv's short-side idiom, as in the demo config
COLOR_TYPES = ('color', 'grayscale', 'unchanged', 'color_ignore_orientation',
               'grayscale_ignore_orientation')


def _backends_for(color_type):
    # mmcv's turbojpeg backend reads 'color' and 'grayscale' only.
    return [
        b for b in available_backends()
        if b != 'turbojpeg' or color_type in ('color', 'grayscale')
    ]


def _save_pil(img, path, orientation=None, **kwargs):
    if orientation:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs['exif'] = exif.tobytes()
    Image.fromarray(img[..., ::-1]).save(path, **kwargs)


@pytest.fixture(scope='module')
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp('reduced_decode')
    paths = {}

    def put(name, data):
        paths[name] = str(root / name)
        with open(paths[name], 'wb') as f:
            f.write(data)

    put('720p.jpg', encode_jpeg(camera_like_image(1280, 720, seed=1)))
    put('odd.jpg', encode_jpeg(camera_like_image(1001, 751, seed=2)))
    frame = camera_like_image(640, 480, seed=3)
    paths['exif6.jpg'] = str(root / 'exif6.jpg')
    _save_pil(frame, paths['exif6.jpg'], orientation=6, quality=90)
    paths['progressive.jpg'] = str(root / 'progressive.jpg')
    _save_pil(frame, paths['progressive.jpg'], quality=90, progressive=True)
    gray = cv2.cvtColor(camera_like_image(400, 304, seed=4),
                        cv2.COLOR_BGR2GRAY)
    put('gray.jpg', cv2.imencode('.jpg', gray)[1].tobytes())
    other = camera_like_image(320, 200, seed=5)
    put('frame.png', cv2.imencode('.png', other)[1].tobytes())
    put('frame.bmp', cv2.imencode('.bmp', other)[1].tobytes())
    complete = encode_jpeg(camera_like_image(320, 240, seed=6))
    put('truncated.jpg', complete[:len(complete) * 2 // 3])
    put('corrupt.jpg', complete[:400] + bytes(range(256)) * 20)
    png = cv2.imencode('.png', other)[1].tobytes()
    put('truncated.png', png[:len(png) // 2])
    put('not_an_image.png', b'just some text\n' * 10)
    put('empty.jpg', b'')
    return paths


def _pipelines(backend, color_type='color', scale=SHORT_SIDE, **resize_args):
    """mmcv's load + resize; the same with the reduced loader (its default
    exact_shapes=True), and wrapped in ReducedDecodePipeline with
    exact_shapes=False (every JPEG reduced, the resize pinned)."""
    resize = dict(type='Resize', scale=scale, keep_ratio=True, **resize_args)
    load = dict(color_type=color_type, imdecode_backend=backend)
    full = [dict(type='LoadImageFromFile', **load), resize]
    return dict(
        full=Compose(full),
        loader=Compose([
            dict(
                type='LoadImageFromFileReduced',
                scale=scale,
                keep_ratio=True,
                **load), resize
        ]),
        wrapper=ReducedDecodePipeline(full, exact_shapes=False))


# mmcv's default bilinear resize aliases when it shrinks a full decode 10x
# (720p to 72 px): the reduced decode (a block average) then differs from it
# mostly by that aliasing. Area interpolation is alias-free at any ratio.
# Where a side does not divide (odd.jpg, 1001x751, in the wrapper), the
# content may also sit up to one output pixel off at the far edges.
@pytest.mark.parametrize('interpolation, short_side, min_psnr, odd_psnr',
                         [('bilinear', 224, 30, 30), ('area', 72, 35, 29)])
@pytest.mark.parametrize('backend', available_backends())
def test_output_matches_full_decode_plus_resize(images, backend,
                                                interpolation, short_side,
                                                min_psnr, odd_psnr):
    if backend == 'turbojpeg':
        mmcv.use_backend('turbojpeg')  # mmcv's turbojpeg needs its global
        mmcv.use_backend('cv2')
    pipelines = _pipelines(
        backend, scale=(short_side, 4096), interpolation=interpolation)
    full = pipelines.pop('full')
    for name in ('720p.jpg', 'odd.jpg', 'progressive.jpg'):
        expected = full(dict(img_path=images[name]))
        for kind, pipeline in pipelines.items():
            got = pipeline(dict(img_path=images[name]))
            where = (name, kind)
            assert set(got) == set(expected), where
            assert got['img'].dtype == expected['img'].dtype == np.uint8
            assert got['ori_shape'] == expected['ori_shape'], where
            assert got['img'].shape == expected['img'].shape, where
            assert got['img_shape'] == expected['img_shape'], where
            if kind == 'wrapper':
                assert got['scale_factor'] == expected['scale_factor'], where
            psnr = pixel_difference(got['img'], expected['img']).psnr
            assert psnr >= (odd_psnr if where == ('odd.jpg', 'wrapper') else
                            min_psnr), (where, psnr)
    # Both paths reduce the 720p frame; only the wrapper reduces odd.jpg.
    for name, kind, reduced in (('720p.jpg', 'loader', True),
                                ('720p.jpg', 'wrapper', True),
                                ('odd.jpg', 'loader', False),
                                ('odd.jpg', 'wrapper', True)):
        loaded = pipelines[kind].transforms[0](dict(img_path=images[name]))
        assert (loaded['scale_factor'][0] < 1) == reduced, (name, kind)


def test_decodes_at_smallest_scale_still_at_least_the_target(images):
    path = images['720p.jpg']  # 1280x720
    for scale, keep_ratio, reduction, shape in (
        ((72, 4096), True, 8, (90, 160)),
        ((100, 4096), True, 4, (180, 320)),
        ((200, 4096), True, 2, (360, 640)),
        ((400, 4096), True, 1, (720, 1280)),
        ((640, 640), True, 2, (360, 640)),  # long side 640
        ((200, 100), False, 4, (180, 320)),  # w >= 200 and h >= 100
        ((200, 200), False, 2, (360, 640)),
    ):
        results = LoadImageFromFileReduced(
            scale=scale, keep_ratio=keep_ratio)(dict(img_path=path))
        assert results['img'].shape[:2] == shape, (scale, keep_ratio)
        assert results['img_shape'] == shape
        assert results['ori_shape'] == (720, 1280)
        assert results['scale_factor'] == (1 / reduction, 1 / reduction)


@pytest.mark.parametrize('resize, reduction', [
    (dict(scale=(200, 150)), 8),
    (dict(scale=(201, 151)), 4),
    (dict(scale=(201, 150)), 4),
    (dict(scale=(200, 151)), 4),
    (dict(scale=(200, 150), keep_ratio=True), 8),
    (dict(scale=(201, 151), keep_ratio=True), 4),
])
def test_one_pixel_below_the_target_is_not_decoded_smaller(
        tmp_path_factory, resize, reduction):
    # 1600x1200 at 1/8 is 200x150: exactly the 200x150 target, 1 px short
    # of 201x151 (also what keep_ratio makes of 1600x1200 for (201, 151)).
    path = str(tmp_path_factory.getbasetemp() / 'uxga.jpg')
    if not osp.exists(path):
        with open(path, 'wb') as f:
            f.write(encode_jpeg(camera_like_image(1600, 1200, seed=3)))
    target = decode_target(dict(type='Resize', **resize))
    loaded = LoadImageFromFileReduced(**target)(dict(img_path=path))
    assert loaded['scale_factor'] == (1 / reduction, 1 / reduction)
    height, width = loaded['img'].shape[:2]
    assert width >= resize['scale'][0] and height >= resize['scale'][1]


def test_exact_shapes_reduce_only_by_scales_dividing_both_sides():
    choose = image_decoding.choose_reduction
    scales = image_decoding.backend_reductions('cv2')
    assert choose(1920, 1080, 200, 100, scales, exact_shapes=True) == Fraction(
        1, 8)
    # 750 / 4 and 750 / 8 are not whole: 1/2 is the smallest exact scale.
    assert choose(1000, 750, 100, 70, scales, exact_shapes=True) == Fraction(
        1, 2)
    assert choose(1000, 750, 100, 70, scales) == Fraction(1, 8)  # 125x94
    assert choose(1001, 751, 10, 10, scales, exact_shapes=True) == 1


@pytest.mark.skipif(
    'turbojpeg' not in available_backends(),
    reason='PyTurboJPEG with libturbojpeg is not installed (optional)')
def test_turbojpeg_uses_only_its_fast_power_of_two_scales(images):
    assert image_decoding.backend_reductions('turbojpeg') == (
        Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1))
    results = LoadImageFromFileReduced(
        scale=(200, 4096), keep_ratio=True,
        imdecode_backend='turbojpeg')(dict(img_path=images['720p.jpg']))
    assert results['img'].shape == (360, 640, 3)  # 1/2, not the slow 3/8
    assert results['scale_factor'] == (0.5, 0.5)


def test_missing_turbojpeg_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(image_decoding, 'turbojpeg_decoder', lambda: None)
    with pytest.raises(ImportError, match='PyTurboJPEG'):
        LoadImageFromFileReduced(scale=64, imdecode_backend='turbojpeg')
    assert 'turbojpeg' not in image_decoding.available_backends()


@pytest.mark.parametrize('name', ['frame.png', 'frame.bmp'])
@pytest.mark.parametrize('backend', available_backends())
def test_other_formats_are_decoded_in_full_like_mmcv(images, name, backend):
    mmcv_backend = 'cv2' if backend == 'turbojpeg' else backend
    expected = mmcv.imfrombytes(
        open(images[name], 'rb').read(), backend=mmcv_backend)
    results = LoadImageFromFileReduced(
        scale=16, keep_ratio=True,
        imdecode_backend=backend)(dict(img_path=images[name]))
    np.testing.assert_array_equal(results['img'], expected)
    assert results['ori_shape'] == results['img_shape'] == (200, 320)
    assert results['scale_factor'] == (1.0, 1.0)


@pytest.mark.parametrize('color_type', COLOR_TYPES)
def test_color_types_and_exif_orientation_follow_mmcv(images, color_type):
    for backend in _backends_for(color_type):
        for name in ('exif6.jpg', 'gray.jpg', '720p.jpg'):
            content = open(images[name], 'rb').read()
            if backend == 'turbojpeg':
                mmcv.use_backend('turbojpeg')
                mmcv.use_backend('cv2')
            full = mmcv.imfrombytes(content, flag=color_type, backend=backend)
            results = LoadImageFromFileReduced(
                scale=SHORT_SIDE,
                keep_ratio=True,
                color_type=color_type,
                imdecode_backend=backend)(dict(img_path=images[name]))
            img = results['img']
            where = (backend, name, color_type)
            assert results['ori_shape'] == full.shape[:2], where
            assert img.ndim == full.ndim and img.shape[2:] == full.shape[2:]
            assert results['scale_factor'][0] < 1, where
            # Same picture, same orientation: the full decode shrunk to the
            # reduced size (area average, as the DCT scaling does).
            shrunk = cv2.resize(full, img.shape[1::-1],
                                interpolation=cv2.INTER_AREA)
            assert pixel_difference(img, shrunk).psnr >= 30, where


def test_to_float32(images):
    results = LoadImageFromFileReduced(
        scale=64, to_float32=True)(dict(img_path=images['720p.jpg']))
    assert results['img'].dtype == np.float32


@pytest.mark.parametrize(
    'name', ['truncated.jpg', 'corrupt.jpg', 'truncated.png',
             'not_an_image.png', 'empty.jpg'])
@pytest.mark.parametrize('backend', available_backends())
def test_broken_files_raise_an_error_naming_the_path(images, name, backend):
    loader = LoadImageFromFileReduced(scale=64, imdecode_backend=backend)
    with pytest.raises(OSError, match='failed to decode image') as error:
        loader(dict(img_path=images[name]))
    assert images[name] in str(error.value)
    ignoring = LoadImageFromFileReduced(
        scale=64, imdecode_backend=backend, ignore_empty=True)
    assert ignoring(dict(img_path=images[name])) is None


def test_missing_file_behaves_like_mmcv(images):
    missing = osp.join(osp.dirname(images['720p.jpg']), 'missing.jpg')
    with pytest.raises(FileNotFoundError, match='missing.jpg'):
        LoadImageFromFileReduced(scale=64)(dict(img_path=missing))
    assert LoadImageFromFileReduced(
        scale=64, ignore_empty=True)(dict(img_path=missing)) is None


class _MemoryBackend(BaseStorageBackend):
    """Serves files from a dict: proves reads go through fileio.get."""
    files = {}

    def get(self, filepath):
        return self.files[filepath]

    def get_text(self, filepath, encoding='utf-8'):
        return self.files[filepath].decode(encoding)


def test_reads_go_through_mmengine_fileio_backends(images):
    register_backend('mmdata_test_memory', _MemoryBackend, force=True)
    _MemoryBackend.files['mem://frame.jpg'] = open(images['720p.jpg'],
                                                   'rb').read()
    results = LoadImageFromFileReduced(
        scale=64, keep_ratio=True,
        backend_args=dict(backend='mmdata_test_memory'))(
            dict(img_path='mem://frame.jpg'))
    assert results['ori_shape'] == (720, 1280)
    assert results['img'].shape == (90, 160, 3)
    with pytest.warns(DeprecationWarning, match='file_client_args'):
        old_style = LoadImageFromFileReduced(
            scale=64, keep_ratio=True, file_client_args=dict(backend='disk'))
    assert old_style(dict(img_path=images['720p.jpg']))['img'].shape == (
        90, 160, 3)


def test_samples_with_annotations_need_the_pipeline_wrapper(images):
    sample = dict(
        img_path=images['720p.jpg'],
        instances=[dict(bbox=[0, 0, 10, 10], bbox_label=0)])
    with pytest.raises(ValueError, match='ReducedDecodePipeline') as error:
        LoadImageFromFileReduced(scale=64)(dict(sample))
    assert images['720p.jpg'] in str(error.value)
    allowed = LoadImageFromFileReduced(scale=64, allow_annotations=True)
    assert allowed(dict(sample))['img'].shape[0] == 90


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match='scale'):
        LoadImageFromFileReduced(scale=(0, 10))
    with pytest.raises(ValueError, match='color_type'):
        LoadImageFromFileReduced(scale=64, color_type='colour')
    with pytest.raises(ValueError, match='imdecode_backend'):
        LoadImageFromFileReduced(scale=64, imdecode_backend='opencv')
    with pytest.raises(ValueError, match='at the same time'), \
            pytest.warns(DeprecationWarning, match='file_client_args'):
        LoadImageFromFileReduced(
            scale=64, file_client_args={}, backend_args={})
    assert 'scale=(64, 64)' in repr(LoadImageFromFileReduced(scale=64))


def test_pillow_draft_reduction_matches_the_reported_scale():
    data = encode_jpeg(camera_like_image(1001, 751, seed=7))
    for reduction in image_decoding.backend_reductions('pillow'):
        decoded = image_decoding.decode_image(
            data,
            backend='pillow',
            min_size=lambda w, h, r=reduction: (int(w * r), int(h * r)))
        assert decoded.reduction == reduction
        assert decoded.img.shape[:2] == tuple(
            reversed(image_decoding.reduced_size(1001, 751, reduction)))
    assert Fraction(1, 8) in image_decoding.backend_reductions('cv2')
    assert np.asarray(Image.open(io.BytesIO(data))).shape == (751, 1001, 3)


def test_decoder_disagreeing_with_the_header_falls_back_to_full_size(
        images, monkeypatch):
    """If a decoder read EXIF orientation differently from our parser, the
    reduced shape would not match; the full decode then tells the truth."""
    read_header = image_decoding.read_jpeg_header
    monkeypatch.setattr(
        image_decoding, 'read_jpeg_header',
        lambda content: read_header(content)._replace(orientation=6))
    with pytest.warns(UserWarning, match='decoding it at full size'):
        results = LoadImageFromFileReduced(
            scale=64, keep_ratio=True)(dict(img_path=images['720p.jpg']))
    assert results['img'].shape == (720, 1280, 3)
    assert results['ori_shape'] == (720, 1280)
    assert results['scale_factor'] == (1.0, 1.0)
