"""What a reduced-size JPEG decode needs to know before decoding.

The frame header gives the stored size and the number of colour components,
the EXIF orientation tells whether decoders that honour it swap width and
height, and the position of the first scan lets a truncated file be told
apart from a complete one (OpenCV returns a partly grey image for some
truncated files instead of failing).
"""
import struct
from typing import NamedTuple, Optional

# Start-of-frame markers: 0xC0-0xCF except DHT (C4), JPG (C8) and DAC (CC).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE_MARKERS = frozenset(range(0xD0, 0xD8)) | {0x01, 0xD8}
_SOS, _EOI, _APP1 = 0xDA, 0xD9, 0xE1
_EXIF_ORIENTATION_TAG = 0x0112
_EOI_BYTES = b'\xff\xd9'


class JpegHeader(NamedTuple):
    """Header facts of a JPEG file.

    Attributes:
        width (int): Stored width, before any EXIF rotation.
        height (int): Stored height, before any EXIF rotation.
        components (int): 1 for grayscale, 3 for YCbCr/RGB, 4 for CMYK.
        orientation (int): EXIF orientation (1 when absent or unreadable);
            5 to 8 mean the upright image is the stored one transposed.
        scan_offset (int): Byte offset of the first scan's entropy-coded
            data.
    """
    width: int
    height: int
    components: int
    orientation: int
    scan_offset: int

    @property
    def transposed(self) -> bool:
        return self.orientation in (5, 6, 7, 8)

    def is_complete(self, content: bytes) -> bool:
        """Whether an end-of-image marker follows the scan data.

        Entropy-coded data never contains the bytes FF D9 (an FF there is
        always followed by 00 or a restart marker), so their absence after
        the first scan means the file was cut short. Bytes after the marker
        (camera trailers) are allowed.
        """
        return content.rfind(_EOI_BYTES, self.scan_offset) != -1


def is_jpeg(content: bytes) -> bool:
    return content[:3] == b'\xff\xd8\xff'


def read_jpeg_header(content: bytes) -> Optional[JpegHeader]:
    """Parse the markers of a JPEG up to its first scan.

    Args:
        content (bytes): The whole file.

    Returns:
        JpegHeader | None: None when ``content`` is not a JPEG.

    Raises:
        ValueError: The file starts like a JPEG but its header is corrupt or
            cut short, or it has no frame header before the scan.
    """
    if not is_jpeg(content):
        return None
    size = len(content)
    frame = None
    orientation = None
    pos = 2
    while True:
        if pos >= size or content[pos] != 0xFF:
            raise ValueError(f'corrupt JPEG header: no marker at byte {pos}'
                             if pos < size else
                             'JPEG file ends inside its header')
        while pos < size and content[pos] == 0xFF:
            pos += 1  # fill bytes
        if pos + 1 > size:
            raise ValueError('JPEG file ends inside its header')
        marker = content[pos]
        pos += 1
        if marker in _STANDALONE_MARKERS:
            continue
        if marker == _EOI:
            raise ValueError('JPEG file has no image data')
        if pos + 2 > size:
            raise ValueError('JPEG file ends inside its header')
        (length, ) = struct.unpack_from('>H', content, pos)
        end = pos + length
        if length < 2:
            raise ValueError(f'corrupt JPEG header: segment length {length} '
                             f'at byte {pos}')
        if end > size:
            raise ValueError('JPEG file ends inside its header')
        segment = content[pos + 2:end]
        if marker in _SOF_MARKERS and frame is None:
            if len(segment) < 6:
                raise ValueError('corrupt JPEG frame header')
            height, width = struct.unpack_from('>HH', segment, 1)
            frame = (width, height, segment[5])
        elif marker == _APP1 and orientation is None:
            orientation = _exif_orientation(segment)
        elif marker == _SOS:
            if frame is None:
                raise ValueError('JPEG file has no frame header')
            width, height, components = frame
            return JpegHeader(width, height, components, orientation or 1,
                              end)
        pos = end


def _exif_orientation(segment: bytes) -> Optional[int]:
    """The orientation tag of IFD0 in an APP1 segment, or None.

    Decoders ignore malformed EXIF blocks, so this returns None for them
    rather than failing.
    """
    if not segment.startswith(b'Exif\x00\x00'):
        return None
    tiff = segment[6:]
    order = {b'II': '<', b'MM': '>'}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return None
    (ifd, ) = struct.unpack_from(order + 'I', tiff, 4)
    if ifd + 2 > len(tiff):
        return None
    (count, ) = struct.unpack_from(order + 'H', tiff, ifd)
    for entry in range(ifd + 2, min(ifd + 2 + 12 * count, len(tiff) - 11),
                       12):
        tag, = struct.unpack_from(order + 'H', tiff, entry)
        if tag == _EXIF_ORIENTATION_TAG:
            (value, ) = struct.unpack_from(order + 'H', tiff, entry + 8)
            return value if 1 <= value <= 8 else None
    return None
