"""Pipeline head entries: round trip, and damage is an error, never data."""
import json
import zlib

import numpy as np
import pytest

from mmdata_plugin.cache.head_entry_format import (_CRC, _HEADER_LENGTH,
                                                   MAGIC, HeadEntryError,
                                                   decode_head_entry,
                                                   encode_head_entry)

IMG = (np.arange(4 * 6 * 3) % 251).astype(np.uint8).reshape(4, 6, 3)
FIELDS = dict(img=IMG, img_shape=(4, 6), scale_factor=(0.5, 0.5),
              gt_label=np.uint8(7), seg_fields=['gt_seg_map'])


def _rewritten(data: bytes, mutate) -> bytes:
    """The entry with its header changed by ``mutate`` and a valid CRC: a
    writer that is not ours."""
    start = len(MAGIC) + _CRC.size
    (length, ) = _HEADER_LENGTH.unpack_from(data, start)
    begin = start + _HEADER_LENGTH.size
    header = json.loads(data[begin:begin + length])
    mutate(header)
    body = json.dumps(header).encode()
    rest = _HEADER_LENGTH.pack(len(body)) + body + data[begin + length:]
    return MAGIC + _CRC.pack(zlib.crc32(rest)) + rest


@pytest.mark.parametrize('codec', ['raw', 'png'])
def test_round_trip_and_a_damaged_header_or_size_is_caught(codec):
    data = encode_head_entry(FIELDS, ['img_path'], codec)
    entry = decode_head_entry(data)
    assert np.array_equal(entry.fields['img'], IMG)
    assert entry.fields['img_shape'] == (4, 6)
    assert entry.fields['seg_fields'] == ['gt_seg_map']
    assert entry.removed == ['img_path']
    (length, ) = _HEADER_LENGTH.unpack_from(data, len(MAGIC) + _CRC.size)
    header_end = len(MAGIC) + _CRC.size + _HEADER_LENGTH.size + length
    # Any flipped bit from the CRC to the header's end: a digit of the
    # image's shape would otherwise give another geometry.
    for position in range(len(MAGIC), header_end, 7):
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        with pytest.raises(HeadEntryError, match='CRC'):
            decode_head_entry(bytes(damaged))
    for cut in (data[:-1], data + b'\0'):
        with pytest.raises(HeadEntryError, match='size'):
            decode_head_entry(cut)


@pytest.mark.parametrize('mutate', [
    lambda h: h['fields']['img']['array'].__setitem__(2, 5),
    lambda h: h['fields']['gt_label']['scalar'].__setitem__(1, 300),
    lambda h: h['blobs'][0].__setitem__(0, -10),
    lambda h: h['fields'].__setitem__('x', {'array': ['|O', [1], 0]}),
    lambda h: h.__setitem__('fields', []),
],
                         ids=['blob index', 'scalar range', 'negative offset',
                              'object dtype', 'fields type'])
def test_a_header_no_writer_makes_is_an_entry_error(mutate):
    data = _rewritten(encode_head_entry(FIELDS, [], 'raw'), mutate)
    with pytest.raises(HeadEntryError, match='damaged|truncated|numeric'):
        decode_head_entry(data)
