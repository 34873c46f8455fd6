"""The bytes of one cached pipeline head: what it changed in a sample.

Layout: ``MAGIC``, a CRC-32 of the header (4 bytes), the header's length
(8 bytes; both little endian), a JSON header, then the binary blobs the
header points into, back to back up to the entry's end. Values are tagged JSON: ``int``,
``float``, ``str``, ``bool``, ``None``, lists, tuples, dicts with str keys,
numpy scalars and arrays of numeric dtypes (their bytes in a blob), and the
image, stored raw or re-encoded as PNG or JPEG.

The CRC and the length check make a damaged header (a bad sector, a
stray write) an error rather than another shape, dtype or key. The blobs'
bytes are not checksummed: that would add ~25% to a raw hit (~60 us per
260 KB), and a flipped bit in them is what the same flip in the source
file would give -- the cache is as safe as the files it stands for.

Nothing in an entry can run code when read (no pickle): a cache directory
another user can write to can corrupt samples, never take over the reader.
"""
import json
import struct
import zlib
from typing import Dict, List, NamedTuple, Tuple

import cv2
import numpy as np

MAGIC = b'MMHEAD2\n'
CODECS = ('raw', 'png', 'jpeg')
_CRC = struct.Struct('<I')
_HEADER_LENGTH = struct.Struct('<Q')


class HeadEntryError(ValueError):
    """An entry that cannot be read (or a value that cannot be stored)."""


class HeadEntry(NamedTuple):
    """A decoded entry: keys to set and keys to remove."""
    fields: dict
    removed: List[str]


class _Writer:

    def __init__(self, codec: str, quality: int, png_compression: int):
        self.codec = codec
        self.quality = quality
        self.png_compression = png_compression
        self.blobs: List[bytes] = []

    def blob(self, data) -> int:
        self.blobs.append(data)
        return len(self.blobs) - 1

    def value(self, value, where: str):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, np.generic):
            _check_dtype(value.dtype, where)
            return {'scalar': [value.dtype.str, value.item()]}
        if isinstance(value, np.ndarray):
            _check_dtype(value.dtype, where)
            return {
                'array': [
                    value.dtype.str,
                    list(value.shape),
                    # a view, not a copy: joined into the entry once
                    self.blob(memoryview(np.ascontiguousarray(value)).cast(
                        'B'))
                ]
            }
        if isinstance(value, tuple):
            return {'tuple': [self.value(v, where) for v in value]}
        if isinstance(value, list):
            return [self.value(v, where) for v in value]
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise HeadEntryError(f'{where}: dict keys must be str')
            return {
                'dict': {k: self.value(v, f'{where}.{k}')
                         for k, v in value.items()}
            }
        raise HeadEntryError(
            f'{where} is a {type(value).__module__}.{type(value).__name__}, '
            'which a cached pipeline head cannot store (numbers, strings, '
            'tuples, lists, dicts and numpy arrays can). Move the transform '
            'that makes it after CachedPipelineHead.')

    def image(self, img: np.ndarray, where: str):
        if self.codec == 'raw':
            return self.value(img, where)
        if img.dtype != np.uint8 or img.ndim not in (2, 3) or (
                img.ndim == 3 and img.shape[2] not in (1, 3, 4)) or (
                    self.codec == 'jpeg' and img.ndim == 3
                    and img.shape[2] == 4):
            raise HeadEntryError(
                f'{where}: storage={self.codec!r} stores uint8 images with '
                f'1 or 3 channels (PNG also 4), got {img.dtype} '
                f'{img.shape}; use storage="raw"')
        if self.codec == 'png':
            params = [cv2.IMWRITE_PNG_COMPRESSION, self.png_compression]
        else:
            # 4:4:4: at training sizes (~224 px) 4:2:0 chroma costs ~10 dB
            # PSNR on coloured edges for ~25% fewer bytes
            params = [
                cv2.IMWRITE_JPEG_QUALITY, self.quality,
                cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
                cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444
            ]
        ok, data = cv2.imencode('.png' if self.codec == 'png' else '.jpg',
                                img, params)
        if not ok:
            raise HeadEntryError(f'{where}: OpenCV could not encode it')
        return {
            'image': [self.codec, list(img.shape),
                      self.blob(memoryview(data).cast('B'))]
        }


def _check_dtype(dtype: np.dtype, where: str) -> None:
    if dtype.kind not in 'biufc':
        raise HeadEntryError(
            f'{where} has dtype {dtype}; only numeric arrays are stored')


def encode_head_entry(fields: Dict[str, object],
                      removed: List[str],
                      codec: str = 'raw',
                      quality: int = 95,
                      png_compression: int = 1,
                      image_key: str = 'img') -> bytes:
    """Serialise what a pipeline head changed in a sample.

    Args:
        fields (dict): Keys the head set, with their values.
        removed (list[str]): Keys the head removed.
        codec (str): How the image (``fields[image_key]``) is stored:
            'raw', 'png' or 'jpeg'.
        quality (int): JPEG quality.
        png_compression (int): PNG compression level (0-9).
        image_key (str): The image's key.

    Raises:
        HeadEntryError: A value that cannot be stored (names its key).
    """
    if codec not in CODECS:
        raise HeadEntryError(f'storage must be one of {CODECS}, got {codec!r}')
    writer = _Writer(codec, quality, png_compression)
    encoded = {}
    for key, value in fields.items():
        if key == image_key and isinstance(value, np.ndarray):
            encoded[key] = writer.image(value, key)
        else:
            encoded[key] = writer.value(value, key)
    offsets, position = [], 0
    for blob in writer.blobs:
        offsets.append([position, blob.nbytes])
        position += blob.nbytes
    header = json.dumps({
        'fields': encoded,
        'removed': list(removed),
        'blobs': offsets
    }).encode()
    length = _HEADER_LENGTH.pack(len(header))
    crc = zlib.crc32(header, zlib.crc32(length))
    return b''.join([MAGIC, _CRC.pack(crc), length, header] + writer.blobs)


class _Reader:

    def __init__(self, data: bytes, blobs: List[Tuple[int, int]],
                 start: int):
        self.data = memoryview(data)
        self.blobs = blobs
        self.start = start

    def blob(self, index: int) -> memoryview:
        offset, length = self.blobs[index]
        begin = self.start + offset
        if offset < 0 or length < 0 or begin + length > len(self.data):
            raise HeadEntryError('entry truncated')
        return self.data[begin:begin + length]

    def value(self, value):
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if not isinstance(value, dict):
            return value
        (tag, body), = value.items()
        if tag == 'tuple':
            return tuple(self.value(v) for v in body)
        if tag == 'dict':
            return {k: self.value(v) for k, v in body.items()}
        if tag == 'scalar':
            return np.dtype(_numeric(body[0])).type(body[1])
        if tag == 'array':
            dtype, shape, index = body
            # a copy: later transforms may write into the image in place
            return np.frombuffer(self.blob(index),
                                 dtype=_numeric(dtype)).reshape(shape).copy()
        if tag == 'image':
            codec, shape, index = body
            img = cv2.imdecode(
                np.frombuffer(self.blob(index), np.uint8),
                cv2.IMREAD_UNCHANGED)
            if img is None:
                raise HeadEntryError(f'cannot decode the stored {codec}')
            return img.reshape(shape)
        raise HeadEntryError(f'unknown tag {tag!r}')


def _numeric(dtype: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind not in 'biufc':
        raise HeadEntryError(f'dtype {dtype} in an entry is not numeric')
    return dtype


def decode_head_entry(data: bytes) -> HeadEntry:
    """Inverse of :func:`encode_head_entry`.

    Raises:
        HeadEntryError: Not an entry of this format, or damaged.
    """
    start = len(MAGIC) + _CRC.size + _HEADER_LENGTH.size
    if data[:len(MAGIC)] != MAGIC or len(data) < start:
        raise HeadEntryError('not a pipeline head entry')
    (crc, ) = _CRC.unpack_from(data, len(MAGIC))
    (length, ) = _HEADER_LENGTH.unpack_from(data, len(MAGIC) + _CRC.size)
    header = bytes(data[start:start + length])
    if zlib.crc32(header, zlib.crc32(
            data[start - _HEADER_LENGTH.size:start])) != crc:
        raise HeadEntryError('damaged pipeline head entry: CRC mismatch')
    try:
        header = json.loads(header)
        blobs = header['blobs']
        if start + length + sum(size for _, size in blobs) != len(data):
            raise HeadEntryError('damaged pipeline head entry: its size is '
                                 'not what its header says')
        reader = _Reader(data, blobs, start + length)
        fields = {k: reader.value(v) for k, v in header['fields'].items()}
        return HeadEntry(fields, list(header['removed']))
    except HeadEntryError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError,
            ArithmeticError) as error:
        # Well-formed bytes with a header no writer of ours makes.
        raise HeadEntryError(f'damaged pipeline head entry: {error}') \
            from error
