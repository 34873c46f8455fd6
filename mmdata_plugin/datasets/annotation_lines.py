"""What a sample line of an annotation file is.

Shared by every dataset that reads annotation files, so that all of them agree
on what a valid line is. Two formats exist:

* ``'lines'``: ``relative/path label``. The label is the last
  whitespace-separated word (any number of ASCII digits), everything before
  it is the path (spaces allowed). A path that itself ends in a separate
  all-digits word (``scan 0042 3``, ``a.jpg 1 2``) is refused as ambiguous:
  it may be a number in a file name, a second label, or a line whose label
  is missing, and no rule tells them apart. Name such files otherwise, or
  use JSON Lines (explicit ``img_path`` and ``gt_label``).
* ``'jsonl'``: JSON Lines, one JSON object (an mmengine data-info dict) per
  line.

In both, lines are separated by ``\\n`` (a ``\\r`` before it is ignored),
blank lines are not samples, a last line without a newline is still a sample,
every line must be valid UTF-8 and a UTF-8 byte-order mark at the start of
the file is not part of the first line. Errors name ``file:line``.

:func:`sample_line_starts` classifies a whole buffer of lines at once with
numpy (used to index 1e9-line files); it takes a vectorised fast path only
for lines that the per-line functions would accept with the same result, and
hands every other line to them, so both always agree.
"""
from typing import Callable, Iterator, Optional, Tuple

import numpy as np

LINE_FORMATS = ('lines', 'jsonl')
UTF8_BOM = b'\xef\xbb\xbf'


class AnnotationFormatError(ValueError):
    """An annotation file has a line we cannot parse."""


def decode_line(raw: bytes, filename: str, lineno: int) -> str:
    """Decode one annotation line as UTF-8, naming the line on failure."""
    return decode_text(raw, lambda: f'{filename}:{lineno}')


def decode_text(raw: bytes, where: Optional[Callable[[], str]]) -> str:
    """:func:`decode_line` with the error location computed lazily (None:
    the caller adds it)."""
    try:
        return raw.decode('utf-8')
    except UnicodeDecodeError as error:
        raise AnnotationFormatError(
            _at(where, f'line is not valid UTF-8 ({error.reason} at byte '
                f'{error.start}): {raw[:80]!r}')) from None


def parse_path_label(line: str, filename: str,
                     lineno: int) -> Tuple[str, int]:
    """Split ``relative/path label`` into its path and integer label.

    Args:
        line (str): One line, with or without its line terminator.
        filename (str): The annotation file, for error messages.
        lineno (int): 1-based line number, for error messages.

    Returns:
        tuple[str, int]: The relative path and the label.
    """
    return split_path_label(line, lambda: f'{filename}:{lineno}')


def split_path_label(line: str,
                     where: Optional[Callable[[], str]]) -> Tuple[str, int]:
    """:func:`parse_path_label` with the error location computed lazily.

    Args:
        line (str): One line, with or without its line terminator.
        where (Callable[[], str], optional): Returns ``file:line`` for an
            error message; called only when the line is bad (finding a line
            number at read time costs a scan of the file). None: the caller
            adds the location to the error.
    """
    fields = line.rstrip().rsplit(maxsplit=1)
    if len(fields) != 2 or not fields[1].isdigit() or not fields[1].isascii():
        raise AnnotationFormatError(
            _at(where, 'expected "relative/path label" with an integer '
                f'label, got {line.rstrip()!r}'))
    path, label = fields
    # (The second split only for paths that end in a digit: it is per
    # sample at read time.)
    last_word = path.rsplit(maxsplit=1) if path[-1].isdigit() else ()
    if (len(last_word) == 2 and last_word[1].isdigit()
            and last_word[1].isascii()):
        raise AnnotationFormatError(
            _at(where, f'ambiguous line {line.rstrip()!r}: the path '
                f'{path!r} ends in the separate number {last_word[1]!r}, so '
                'the label may be either number (or missing). The label is '
                'the last word; rename such files or use JSON Lines '
                '(img_path, gt_label).'))
    return path, int(label)


def check_label(label, num_classes: Optional[int],
                where: Optional[Callable[[], str]]) -> None:
    """Refuse a label outside ``range(num_classes)`` (the dataset's
    ``metainfo['classes']``) before it reaches the loss as an IndexError.

    With classes known, a label must be a class index: a string, a float
    or a bool (JSON ``"cat"``, ``1.7``, ``true``) is refused here, where the
    line is known, rather than cast or rejected later by the pipeline.

    Args:
        label (int | list[int]): A ``gt_label`` (None: unlabelled).
        num_classes (int, optional): Number of classes; None checks nothing.
        where (Callable[[], str], optional): Returns ``file:line``; called
            on error. None: the caller adds the location.
    """
    if num_classes is None or label is None or (type(label) is int
                                                and 0 <= label < num_classes):
        return
    labels = label if isinstance(label, list) else [label]
    for value in labels:
        if type(value) is not int:
            raise AnnotationFormatError(
                _at(where, f'label {value!r} is not a class index (an int '
                    f'in 0..{num_classes - 1}, metainfo["classes"])'))
        if not 0 <= value < num_classes:
            raise AnnotationFormatError(
                _at(where, f'label {value} is outside the dataset\'s '
                    f'{num_classes} classes (metainfo["classes"]; labels '
                    f'are 0..{num_classes - 1})'))


def _at(where: Optional[Callable[[], str]], message: str) -> str:
    return f'{where()}: {message}' if where is not None else message


def check_json_object_line(line: str, filename: str, lineno: int) -> None:
    """Check the outline of a JSON Lines record: ``{ ... }`` on one line.

    The record itself is decoded when the sample is read (decoding 1e9
    records up front would take longer than the training epoch).
    """
    text = line.strip()
    if not (text.startswith('{') and text.endswith('}')):
        raise AnnotationFormatError(
            f'{filename}:{lineno}: expected one JSON object per line, got '
            f'{text[:80]!r}')


def _sample_text(raw: bytes, filename: str, lineno: int) -> Optional[str]:
    """The decoded line, or None if it is blank."""
    line = decode_line(raw, filename, lineno)
    return line if line.strip() else None


def is_sample_line(raw: bytes, fmt: str, filename: str, lineno: int) -> bool:
    """Whether one raw line is a sample (True) or blank (False).

    Raises:
        AnnotationFormatError: If the line is neither, naming file and line.
    """
    line = _sample_text(raw, filename, lineno)
    if line is None:
        return False
    if fmt == 'lines':
        parse_path_label(line, filename, lineno)
    else:
        check_json_object_line(line, filename, lineno)
    return True


def iter_path_labels(filename: str) -> Iterator[Tuple[int, str, int]]:
    """Yield ``(lineno, path, label)`` for every sample line of a file."""
    with open(filename, 'rb') as file:
        for lineno, raw in enumerate(file, 1):
            if lineno == 1 and raw.startswith(UTF8_BOM):
                raw = raw[len(UTF8_BOM):]
            line = _sample_text(raw, filename, lineno)
            if line is not None:
                path, label = parse_path_label(line, filename, lineno)
                yield lineno, path, label


# Bytes that Python's str.isspace() counts as whitespace, among ASCII; a
# non-ASCII byte may be part of a Unicode space, so the fast path never
# decides on one.
_ASCII_SPACE = np.array([chr(b).isspace() for b in range(128)] + [False] * 128)
_ASCII_WORD = np.array([not chr(b).isspace() for b in range(128)] +
                       [False] * 128)
_DIGIT = np.zeros(256, bool)
_DIGIT[ord('0'):ord('9') + 1] = True
_NEWLINE = ord('\n')


def _skip_back(buf: np.ndarray, pos: np.ndarray, floor: np.ndarray,
               table: np.ndarray) -> np.ndarray:
    """Move each ``pos`` (an exclusive end) back over bytes in ``table``."""
    pos = pos.copy()
    # Whole-array steps are cheapest while most lines still move (runs are
    # short: a label, a line end); long runs finish on the moving lines only.
    for _ in range(8):
        move = table[buf[pos - 1]] & (pos > floor)
        if not move.any():
            return pos
        pos -= move
    active = np.flatnonzero(table[buf[pos - 1]] & (pos > floor))
    while active.size:
        pos[active] -= 1
        active = active[table[buf[pos[active] - 1]] & (pos[active] >
                                                       floor[active])]
    return pos


def _fast_sample_mask(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                      fmt: str) -> Tuple[np.ndarray, np.ndarray]:
    """(surely a sample, surely blank) for lines ``buf[starts:ends]``."""
    content_end = _skip_back(buf, ends, starts, _ASCII_SPACE)
    blank = content_end == starts
    last = buf[np.maximum(content_end - 1, 0)]
    if fmt == 'jsonl':
        first = buf[np.minimum(starts, buf.size - 1)]
        sure = ~blank & (first == ord('{')) & (last == ord('}'))
        return sure, blank
    # lines: digits, ASCII whitespace, then a non-space ASCII byte (so that
    # rsplit() surely leaves a non-empty path and this exact label).
    sure = ~blank & _DIGIT[last]
    label_start = _skip_back(buf, content_end, starts, _DIGIT)
    path_end = _skip_back(buf, label_start, starts, _ASCII_SPACE)
    sure &= (path_end < label_start) & (path_end > starts)
    sure &= _ASCII_WORD[buf[np.maximum(path_end - 1, 0)]]
    # Not ambiguous: the path's last word is not a separate number (digits
    # reaching back to the line start make a one-word path).
    digits_start = _skip_back(buf, path_end, starts, _DIGIT)
    sure &= ((digits_start == path_end) | (digits_start == starts)
             | _ASCII_WORD[buf[np.maximum(digits_start - 1, 0)]])
    return sure, blank


def sample_line_starts(buf: np.ndarray, fmt: str, filename: str,
                       first_lineno: int) -> Tuple[np.ndarray, int]:
    """Offsets (in ``buf``) of the sample lines in a buffer of whole lines.

    Args:
        buf (np.ndarray): uint8 bytes of whole lines: every line ends with
            ``\\n`` except, at the end of the file, the last one.
        fmt (str): ``'lines'`` or ``'jsonl'``.
        filename (str): The annotation file, for error messages.
        first_lineno (int): 1-based line number of the first line of ``buf``.

    Returns:
        tuple[np.ndarray, int]: int64 offsets of the first byte of every
        sample line, and the number of lines in ``buf``.

    Raises:
        AnnotationFormatError: For the first bad line, naming file and line.
    """
    if buf.size == 0:
        return np.zeros(0, np.int64), 0
    ends = np.flatnonzero(buf == _NEWLINE)
    if ends.size == 0 or ends[-1] != buf.size - 1:
        ends = np.append(ends, buf.size)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if buf.max() >= 0x80:
        _check_utf8(buf, starts, ends, filename, first_lineno)
    sure, blank = _fast_sample_mask(buf, starts, ends, fmt)
    keep = sure
    unsure = np.flatnonzero(~sure & ~blank)
    for line in unsure.tolist():
        raw = buf[starts[line]:ends[line]].tobytes()
        keep[line] = is_sample_line(raw, fmt, filename, first_lineno + line)
    return starts[keep], int(ends.size)


def _check_utf8(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                filename: str, first_lineno: int) -> None:
    """Raise for the first line of ``buf`` that is not UTF-8."""
    try:
        buf.tobytes().decode('utf-8')
    except UnicodeDecodeError as error:
        line = int(np.searchsorted(ends, error.start))
        # A newline cannot be inside a UTF-8 sequence, so the bad bytes are
        # in this line and decode_line raises the error that names it.
        decode_line(buf[starts[line]:ends[line]].tobytes(), filename,
                    first_lineno + line)
        raise
