import numpy as np
import pytest

from mmdata_plugin.datasets import (AnnotationFormatError, iter_path_labels,
                                    parse_path_label, sample_line_starts)
from mmdata_plugin.datasets.annotation_lines import is_sample_line


@pytest.mark.parametrize('line, expected', [
    ('a/b.jpg 3\n', ('a/b.jpg', 3)),
    ('a b/c d.jpg 12\n', ('a b/c d.jpg', 12)),
    ('x.jpg 1234567\r\n', ('x.jpg', 1234567)),
    ('x.jpg\t7', ('x.jpg', 7)),
    ('x.jpg 0   \n', ('x.jpg', 0)),
])
def test_parse_path_label(line, expected):
    assert parse_path_label(line, 'ann.txt', 1) == expected


@pytest.mark.parametrize(
    'line', ['no_label.jpg\n', 'x.jpg -1\n', 'x.jpg 1.5\n', ' 3\n',
             'x.jpg ３\n'])
def test_malformed_line_names_file_and_line(line):
    with pytest.raises(AnnotationFormatError, match=r'ann\.txt:7:'):
        parse_path_label(line, 'ann.txt', 7)


@pytest.mark.parametrize('line', ['scan 0042 3', 'a.jpg 1 2', 'a b\t7 0'])
def test_path_ending_in_a_separate_number_is_ambiguous(line):
    # Is the label the last number, the one before it, or missing (a file
    # named "scan 0042")? No rule can tell: refuse, naming file and line.
    with pytest.raises(AnnotationFormatError, match=r'ann\.txt:7: ambiguous'):
        parse_path_label(line, 'ann.txt', 7)


@pytest.mark.parametrize('line, expected', [
    ('scan_0042 3', ('scan_0042', 3)),
    ('0042 3', ('0042', 3)),
    ('scan 0042.png 3', ('scan 0042.png', 3)),
    ('scan ０４ 3', ('scan ０４', 3)),
])
def test_numbers_inside_a_path_word_are_not_ambiguous(line, expected):
    assert parse_path_label(line, 'ann.txt', 1) == expected


def test_iter_skips_blank_lines_and_keeps_unterminated_last(tmp_path):
    ann = tmp_path / 'ann.txt'
    ann.write_bytes(b'a.jpg 1\n\n  \nb c.jpg 22\r\nlast.jpg 3')
    assert list(iter_path_labels(str(ann))) == [(1, 'a.jpg', 1),
                                                 (4, 'b c.jpg', 22),
                                                 (5, 'last.jpg', 3)]


def test_utf8_byte_order_mark_is_not_part_of_the_first_path(tmp_path):
    ann = tmp_path / 'ann.txt'
    ann.write_bytes(b'\xef\xbb\xbfa.jpg 1\nb.jpg 2\n')
    assert list(iter_path_labels(str(ann))) == [(1, 'a.jpg', 1),
                                                 (2, 'b.jpg', 2)]


def test_undecodable_bytes_name_the_line(tmp_path):
    ann = tmp_path / 'ann.txt'
    ann.write_bytes(b'a.jpg 1\nb\xff.jpg 2\n')
    with pytest.raises(AnnotationFormatError, match=r'ann\.txt:2: .*UTF-8'):
        list(iter_path_labels(str(ann)))


# ------------------------------------------------ bulk scan == line parser
def _reference_starts(data: bytes, fmt: str):
    """Sample offsets by the per-line functions (the definition)."""
    starts, pos = [], 0
    lines = data.split(b'\n')
    for lineno, line in enumerate(lines, 1):
        raw = line + (b'\n' if lineno < len(lines) else b'')
        if raw and is_sample_line(raw, fmt, 'ann.txt', lineno):
            starts.append(pos)
        pos += len(raw)
    return starts


_TRICKY_LINES = [
    b'a.jpg 1', b'', b'   ', b'\t\r', b'b c.jpg 22\r', b'x.jpg 0   ',
    b'x.jpg\t7', b'dir/x.jpg 1234567890123', b'p  q.jpg  5', b'9 8',
    b'x.jpg\xc2\xa01', b'x.jpg \xc2\xa0', b'\xe3\x80\x80 1', b'x\x1f 3',
    b'x.jpg\x1f4', b'\xc3\xa9t\xc3\xa9.jpg 2', b'x.jpg 3\xc2\xa0',
    b'{"a": 1}', b' {"img_path": "x y.jpg"} ', b'{}\r',
    b'{"img_path": "a b.jpg", "gt_label": 3}', b'{"x": "\xc3\xa9"}',
    b'{"a": "}"}\t', b'\xc2\xa0{"a": 1}', b'a.jpg 1 2', b'scan 0042 3',
    b'x\xc2\xa012 3', b'x_12 3', b'12 34', b' 12 3', b'x\t12\t3', b'x \xef\xbc\x93 3'
]
_BAD_LINES = {
    'lines': [b'no_label.jpg', b'x.jpg -1', b'x.jpg 1.5', b' 3', b'x.jpg +3',
              b'x.jpg \xef\xbc\x93', b'{"a": 1}', b'a.jpg 1 2',
              b'scan 0042 3', b'x\xc2\xa012 3'],
    'jsonl': [b'a.jpg 1', b'{"a": 1', b'[1, 2]'],
}


def _good_for(fmt):
    good = []
    for line in _TRICKY_LINES:
        try:
            is_sample_line(line, fmt, 'ann.txt', 1)
        except AnnotationFormatError:
            continue
        good.append(line)
    return good


@pytest.mark.parametrize('fmt', ['lines', 'jsonl'])
def test_bulk_scan_agrees_with_line_parser_on_random_files(fmt):
    rng = np.random.default_rng(0)
    good = _good_for(fmt)
    assert len(good) > 6
    for trial in range(200):
        picks = rng.integers(0, len(good), rng.integers(0, 12))
        data = b'\n'.join(good[i] for i in picks)
        if rng.random() < 0.5:
            data += b'\n'
        starts, lines = sample_line_starts(
            np.frombuffer(data, np.uint8), fmt, 'ann.txt', 1)
        assert starts.tolist() == _reference_starts(data, fmt), data
        assert lines == data.count(b'\n') + (not data.endswith(b'\n')
                                            and len(data) > 0)


@pytest.mark.parametrize('fmt', ['lines', 'jsonl'])
def test_bulk_scan_names_the_bad_line(fmt):
    good = _good_for(fmt)
    for bad in _BAD_LINES[fmt] + [b'bad\xff 1']:
        data = b'\n'.join(good[:4] + [bad] + good[:2])
        with pytest.raises(AnnotationFormatError, match=r'ann\.txt:15:'):
            sample_line_starts(np.frombuffer(data, np.uint8), fmt, 'ann.txt',
                               11)
