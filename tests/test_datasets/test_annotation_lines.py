import pytest

from mmdata_plugin.datasets import (AnnotationFormatError, iter_path_labels,
                                    parse_path_label)


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


def test_iter_skips_blank_lines_and_keeps_unterminated_last(tmp_path):
    ann = tmp_path / 'ann.txt'
    ann.write_bytes(b'a.jpg 1\n\n  \nb c.jpg 22\r\nlast.jpg 3')
    assert list(iter_path_labels(str(ann))) == [(1, 'a.jpg', 1),
                                                 (4, 'b c.jpg', 22),
                                                 (5, 'last.jpg', 3)]


def test_undecodable_bytes_name_the_line(tmp_path):
    ann = tmp_path / 'ann.txt'
    ann.write_bytes(b'a.jpg 1\nb\xff.jpg 2\n')
    with pytest.raises(AnnotationFormatError, match=r'ann\.txt:2: .*UTF-8'):
        list(iter_path_labels(str(ann)))
