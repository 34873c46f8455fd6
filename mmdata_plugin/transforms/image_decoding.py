"""Decode image bytes, JPEGs at a reduced size chosen from a target size.

JPEG stores 8x8 blocks of DCT coefficients; libjpeg can reconstruct each
block at N/8 of its size straight from the coefficients, skipping most of
the inverse DCT, the colour conversion and the memory traffic of the full
image. OpenCV exposes 1/2, 1/4 and 1/8 (``IMREAD_REDUCED_*``), Pillow the
same through ``Image.draft``, and libjpeg-turbo's own API (PyTurboJPEG, when
installed) every N/8, of which the power-of-two ones are fast. The reduced
image covers the whole picture: the content at original pixel ``x`` lands
at ``x * N/8``.

Every other format, and JPEGs a backend cannot reduce in the requested
colour type, go through :func:`mmcv.imfrombytes` unchanged, so the output is
exactly what ``LoadImageFromFile`` gives.
"""
import functools
import io
import warnings
from fractions import Fraction
from typing import Callable, List, NamedTuple, Optional, Tuple

import cv2
import mmcv
import numpy as np
from PIL import Image

from .jpeg_header import JpegHeader, read_jpeg_header

DECODE_BACKENDS = ('cv2', 'pillow', 'turbojpeg')
COLOR_TYPES = ('color', 'grayscale', 'unchanged', 'color_ignore_orientation',
               'grayscale_ignore_orientation')
# Colour types for which OpenCV and Pillow apply the EXIF orientation
# (mmcv's convention); turbojpeg never does.
_ORIENTED_COLOR_TYPES = ('color', 'grayscale')
_POWER_OF_TWO_REDUCTIONS = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2),
                            Fraction(1))
_CV2_REDUCED_FLAGS = {
    (False, 1): cv2.IMREAD_COLOR,
    (False, 2): cv2.IMREAD_REDUCED_COLOR_2,
    (False, 4): cv2.IMREAD_REDUCED_COLOR_4,
    (False, 8): cv2.IMREAD_REDUCED_COLOR_8,
    (True, 1): cv2.IMREAD_GRAYSCALE,
    (True, 2): cv2.IMREAD_REDUCED_GRAYSCALE_2,
    (True, 4): cv2.IMREAD_REDUCED_GRAYSCALE_4,
    (True, 8): cv2.IMREAD_REDUCED_GRAYSCALE_8,
}

SizeRule = Callable[[int, int], Tuple[int, int]]


class DecodedImage(NamedTuple):
    """A decoded image and how it relates to the full-size one.

    Attributes:
        img (np.ndarray): The decoded pixels (BGR or grayscale, uint8).
        ori_shape (tuple[int, int]): ``(h, w)`` a full decode gives.
        reduction (Fraction): Scale of the decode; original pixel ``x`` is
            at ``x * reduction`` in ``img``.
    """
    img: np.ndarray
    ori_shape: Tuple[int, int]
    reduction: Fraction


@functools.lru_cache(maxsize=None)
def turbojpeg_decoder():
    """The process's PyTurboJPEG decoder, or None when it cannot be used.

    PyTurboJPEG is optional: it needs the ``turbojpeg`` module and the
    system's libturbojpeg (PyTurboJPEG 2.x needs libjpeg-turbo >= 3).
    """
    try:
        from turbojpeg import TurboJPEG
        return TurboJPEG()
    except (ImportError, OSError, RuntimeError):
        return None


def available_backends() -> List[str]:
    """The decode backends usable in this process, in a fixed order."""
    return [
        backend for backend in DECODE_BACKENDS
        if backend != 'turbojpeg' or turbojpeg_decoder() is not None
    ]


def check_backend(backend: str, color_type: str) -> None:
    """Raise a clear error for a backend/colour-type pair that cannot work."""
    if color_type not in COLOR_TYPES:
        raise ValueError(
            f'color_type must be one of {COLOR_TYPES}, got {color_type!r}')
    if backend == 'turbojpeg':
        if turbojpeg_decoder() is None:
            raise ImportError(
                "imdecode_backend='turbojpeg' needs PyTurboJPEG and the "
                'libturbojpeg library (pip install PyTurboJPEG; apt install '
                'libturbojpeg0 or libjpeg-turbo). Use cv2 or pillow otherwise.')
        if color_type not in _ORIENTED_COLOR_TYPES:
            raise ValueError("the turbojpeg backend decodes color_type 'color'"
                             " or 'grayscale' only, like mmcv's")
    elif backend not in mmcv.image.io.supported_backends:
        raise ValueError(f'unknown imdecode_backend {backend!r}; choose from '
                         f'{mmcv.image.io.supported_backends}')


def backend_reductions(backend: str) -> Tuple[Fraction, ...]:
    """The decode scales used with a backend, smallest first, 1 included.

    Only 1/8, 1/4 and 1/2: libjpeg-turbo has SIMD code for these scaled
    inverse DCTs (1/8 keeps the DC term only), while its other N/8 scales
    run in plain C and decoded slower than a full decode when measured
    (docs/reduced_decoding.md), so turbojpeg's 3/8, 5/8 ... are not used.
    """
    if backend == 'turbojpeg':
        offered = {
            Fraction(num, denom)
            for num, denom in turbojpeg_decoder().scaling_factors
        }
        return tuple(r for r in _POWER_OF_TWO_REDUCTIONS if r in offered)
    if backend in ('cv2', 'pillow'):
        return _POWER_OF_TWO_REDUCTIONS
    return (Fraction(1), )


def reduced_size(width: int, height: int,
                 reduction: Fraction) -> Tuple[int, int]:
    """``(w, h)`` of a decode at ``reduction`` (libjpeg rounds up)."""
    return (-(-width * reduction.numerator // reduction.denominator),
            -(-height * reduction.numerator // reduction.denominator))


def divides_exactly(width: int, height: int, reduction: Fraction) -> bool:
    """Whether a decode at ``reduction`` has both sides exactly scaled.

    Then the decoded image is the full one scaled by a power of two, which
    floating point represents exactly: every resize rule built from size
    ratios (mmcv's ``rescale_size``, ``int(scale * h / w)`` ...) computes
    bit for bit the output size it computes for the full image.
    """
    return (width * reduction).denominator == 1 and (
        height * reduction).denominator == 1


def choose_reduction(width: int,
                     height: int,
                     min_width: int,
                     min_height: int,
                     reductions: Tuple[Fraction, ...],
                     exact_shapes: bool = False) -> Fraction:
    """The smallest reduction whose image is at least the minimum size.

    Args:
        exact_shapes (bool): Only reductions that divide both sides
            (:func:`divides_exactly`).
    """
    for reduction in reductions:
        if exact_shapes and not divides_exactly(width, height, reduction):
            continue
        red_w, red_h = reduced_size(width, height, reduction)
        # Pillow's draft is asked for side // denominator pixels, which must
        # not be 0: keep both sides at least one pixel at every decoder.
        if (min(width, height) * reduction >= 1 and red_w >= min_width
                and red_h >= min_height):
            return reduction
    return Fraction(1)


def decode_image(content: bytes,
                 color_type: str = 'color',
                 backend: str = 'cv2',
                 min_size: Optional[SizeRule] = None,
                 exact_shapes: bool = False) -> DecodedImage:
    """Decode ``content``; JPEGs at the smallest scale ``min_size`` allows.

    Args:
        content (bytes): The file's bytes.
        color_type (str): mmcv's ``flag`` (``'color'``, ``'grayscale'``,
            ``'unchanged'``, ``'*_ignore_orientation'``).
        backend (str): ``'cv2'``, ``'pillow'``, ``'turbojpeg'``, or another
            :func:`mmcv.imfrombytes` backend (never reduces).
        min_size (callable, optional): Maps the full-size ``(w, h)`` to the
            smallest ``(w, h)`` the decode may return. None: full size.
        exact_shapes (bool): Only use scales that divide both sides
            (:func:`divides_exactly`); other sizes get the largest such
            scale, or a full decode.

    Raises:
        ValueError: The bytes are not a decodable image, or a truncated
            JPEG.
    """
    header = read_jpeg_header(content)
    if header is None:
        return _full_size(_decode_with_mmcv(content, color_type, backend))
    if not header.is_complete(content):
        raise ValueError('truncated JPEG: no end-of-image marker after the '
                         'image data')
    if not _can_reduce(header, color_type, backend):
        return _full_size(_decode_with_mmcv(content, color_type, backend))
    width, height = header.width, header.height
    if header.transposed and (backend != 'turbojpeg'
                              and color_type in _ORIENTED_COLOR_TYPES):
        width, height = height, width
    reduction = Fraction(1)
    if min_size is not None:
        reduction = choose_reduction(width, height, *min_size(width, height),
                                     backend_reductions(backend),
                                     exact_shapes)
    img = _decode_jpeg(content, header, color_type, backend, reduction)
    expected_w, expected_h = reduced_size(width, height, reduction)
    if img.shape[:2] != (expected_h, expected_w):
        # The decoder read the orientation differently from our header
        # parser; only a full decode tells the true original shape then.
        warnings.warn(f'{backend} decoded a JPEG to {img.shape[:2]}, not the '
                      f'expected {(expected_h, expected_w)}; decoding it at '
                      'full size instead')
        return _full_size(
            _decode_jpeg(content, header, color_type, backend, Fraction(1)))
    return DecodedImage(img, (height, width), reduction)


def _full_size(img: np.ndarray) -> DecodedImage:
    return DecodedImage(img, img.shape[:2], Fraction(1))


def _can_reduce(header: JpegHeader, color_type: str, backend: str) -> bool:
    if backend == 'cv2':
        # IMREAD_UNCHANGED has no reduced twin; for 1- and 3-component
        # JPEGs it equals the grayscale/colour read without orientation.
        return color_type != 'unchanged' or header.components in (1, 3)
    return backend in ('pillow', 'turbojpeg')


def _decode_jpeg(content: bytes, header: JpegHeader, color_type: str,
                 backend: str, reduction: Fraction) -> np.ndarray:
    if backend == 'cv2':
        img = _decode_cv2(content, header, color_type, reduction)
    elif backend == 'pillow':
        img = _decode_pillow(content, header, color_type, reduction)
    else:
        img = _decode_turbojpeg(content, color_type, reduction)
    if img is None:
        raise ValueError(f'{backend} could not decode the JPEG data')
    return img


def _decode_cv2(content: bytes, header: JpegHeader, color_type: str,
                reduction: Fraction) -> Optional[np.ndarray]:
    gray = color_type.startswith('grayscale') or (color_type == 'unchanged'
                                                  and header.components == 1)
    flag = _CV2_REDUCED_FLAGS[(gray, reduction.denominator)]
    if color_type not in _ORIENTED_COLOR_TYPES:
        flag |= cv2.IMREAD_IGNORE_ORIENTATION
    try:
        return cv2.imdecode(np.frombuffer(content, np.uint8), flag)
    except cv2.error as error:
        raise ValueError(f'cv2: {error}') from error


def _decode_pillow(content: bytes, header: JpegHeader, color_type: str,
                   reduction: Fraction) -> np.ndarray:
    # mmcv's own Pillow-to-array conversion (EXIF transpose, mode handling)
    # so that the result matches LoadImageFromFile(imdecode_backend=
    # 'pillow'); it is private in mmcv 2.x, hence imported here only.
    from mmcv.image.io import _pillow2array
    try:
        with io.BytesIO(content) as buff:
            img = Image.open(buff)
            if reduction < 1:
                # draft picks the largest power-of-two scale whose image is
                # at least the requested size.
                img.draft(img.mode, (header.width // reduction.denominator,
                                     header.height // reduction.denominator))
            return _pillow2array(img, color_type, 'bgr')
    except OSError as error:
        raise ValueError(f'pillow: {error}') from error


def _decode_turbojpeg(content: bytes, color_type: str,
                      reduction: Fraction) -> np.ndarray:
    from turbojpeg import TJPF_BGR, TJPF_GRAY
    pixel_format = TJPF_GRAY if color_type.startswith('grayscale') \
        else TJPF_BGR
    try:
        img = turbojpeg_decoder().decode(
            content,
            pixel_format=pixel_format,
            scaling_factor=(reduction.numerator, reduction.denominator))
    except OSError as error:
        raise ValueError(f'turbojpeg: {error}') from error
    return img[..., 0] if img.ndim == 3 and img.shape[-1] == 1 else img


def _decode_with_mmcv(content: bytes, color_type: str,
                      backend: str) -> np.ndarray:
    if backend == 'turbojpeg':
        backend = 'cv2'  # turbojpeg reads JPEG only
    if not content:
        raise ValueError('the file is empty')
    try:
        img = mmcv.imfrombytes(content, flag=color_type, backend=backend)
    except (OSError, cv2.error) as error:
        raise ValueError(f'{backend}: {error}') from error
    if img is None:
        raise ValueError(f'{backend} could not decode it (not an image, or '
                         'a corrupt or truncated file)')
    return img
