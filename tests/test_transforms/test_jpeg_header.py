import io

import numpy as np
import pytest
from PIL import Image

from mmdata_plugin.transforms.jpeg_header import read_jpeg_header
from mmdata_plugin.utils import camera_like_image, encode_jpeg


def _pil_jpeg(img, orientation=None, mode=None):
    image = Image.fromarray(img)
    if mode:
        image = image.convert(mode)
    kwargs = {}
    if orientation:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs['exif'] = exif.tobytes()
    buff = io.BytesIO()
    image.save(buff, 'JPEG', quality=90, **kwargs)
    return buff.getvalue()


def test_reads_size_components_and_orientation():
    img = camera_like_image(96, 40, seed=1)
    header = read_jpeg_header(encode_jpeg(img))
    assert (header.width, header.height, header.components) == (96, 40, 3)
    assert header.orientation == 1 and not header.transposed
    gray = read_jpeg_header(_pil_jpeg(img, mode='L'))
    assert gray.components == 1
    for orientation, transposed in ((3, False), (6, True), (8, True)):
        header = read_jpeg_header(_pil_jpeg(img, orientation=orientation))
        assert header.orientation == orientation
        assert header.transposed is transposed
        assert (header.width, header.height) == (96, 40)


def test_not_a_jpeg_gives_none_and_broken_header_raises():
    assert read_jpeg_header(b'\x89PNG\r\n\x1a\n' + b'\0' * 20) is None
    data = encode_jpeg(camera_like_image(64, 48))
    with pytest.raises(ValueError, match='ends inside its header'):
        read_jpeg_header(data[:100])
    with pytest.raises(ValueError, match='no marker'):
        read_jpeg_header(data[:20] + b'\x00' * 50)  # after JFIF APP0


def test_completeness_tells_truncated_from_trailing_data():
    data = encode_jpeg(camera_like_image(64, 48))
    header = read_jpeg_header(data)
    assert header.is_complete(data)
    assert header.is_complete(data + b'camera trailer \xff\x00')
    assert not header.is_complete(data[:len(data) * 2 // 3])


def test_malformed_exif_is_ignored_like_decoders_do():
    data = bytearray(_pil_jpeg(camera_like_image(32, 16), orientation=6))
    start = data.find(b'Exif\x00\x00') + 6
    data[start:start + 2] = b'XX'  # unknown byte order
    assert read_jpeg_header(bytes(data)).orientation == 1
    assert np.array_equal(
        np.asarray(Image.open(io.BytesIO(bytes(data)))).shape, (16, 32, 3))
