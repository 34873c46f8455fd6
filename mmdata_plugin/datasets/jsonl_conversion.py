"""OpenMMLab 2.0 JSON annotations -> JSON Lines, in bounded memory.

``json.load`` of a 1e8-sample ``{"metainfo": ..., "data_list": [...]}`` file
needs tens of GB. This converter streams it: it reads the file in blocks and
decodes one ``data_list`` element at a time (``json.JSONDecoder.raw_decode``,
the C scanner), so memory is bounded by the block size plus the largest
single element. Output: an optional ``{"metainfo": {...}}`` first line, then
one compact data-info dict per line, written atomically.
"""
import codecs
import contextlib
import json
import os
import os.path as osp
import shutil
from typing import Any, Dict, Iterator, Optional, TextIO, Tuple

from .annotation_lines import AnnotationFormatError
from .line_index import ByteProgressBar

_BLOCK = 4 << 20


class _JsonStream:
    """A text file read in blocks, with ``raw_decode`` of one value at a
    time; errors name ``file:line:column``."""

    def __init__(self, path: str):
        self.path = path
        self.file = open(path, 'rb')
        self.utf8 = codecs.getincrementaldecoder('utf-8')()
        self.bytes_read = 0
        self.buf = ''
        self.pos = 0
        self.eof = False
        self.line = 1  # line number of buf[0]
        self.col0 = 1  # column of buf[0] on that line
        self.decoder = json.JSONDecoder()

    def close(self) -> None:
        self.file.close()

    def _where(self, pos: int) -> str:
        before = self.buf[:pos]
        newlines = before.count('\n')
        column = (pos - before.rfind('\n')) if newlines else (pos + self.col0)
        return f'{self.path}:{self.line + newlines}:{column}'

    def error(self,
              message: str,
              pos: Optional[int] = None) -> AnnotationFormatError:
        where = self._where(self.pos if pos is None else pos)
        return AnnotationFormatError(f'{where}: {message}')

    def _compact(self) -> None:
        """Drop what was consumed (only between values: error positions
        refer to the buffer)."""
        if self.pos > len(self.buf) // 2:
            dropped = self.buf[:self.pos]
            newlines = dropped.count('\n')
            if newlines:
                self.line += newlines
                self.col0 = len(dropped) - dropped.rfind('\n')
            else:
                self.col0 += len(dropped)
            self.buf = self.buf[self.pos:]
            self.pos = 0

    def _fill(self) -> bool:
        """Read another block; False at the end of the file."""
        if self.eof:
            return False
        raw = self.file.read(_BLOCK)
        try:
            block = self.utf8.decode(raw, final=not raw)
        except UnicodeDecodeError as error:
            raise AnnotationFormatError(
                f'{self.path}: not valid UTF-8 ({error.reason}) near byte '
                f'{self.bytes_read + max(error.start, 0)}') from None
        self.bytes_read += len(raw)
        self.eof = not raw
        self.buf += block
        return bool(raw)

    def peek(self) -> str:
        """The next non-whitespace character ('' at the end)."""
        self._compact()
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in ' \t\r\n':
                self.pos += 1
            if self.pos < len(self.buf) or not self._fill():
                return self.buf[self.pos:self.pos + 1]

    def expect(self, chars: str, what: str) -> str:
        char = self.peek()
        if not char or char not in chars:
            raise self.error(f'expected {what}, found '
                             f'{char or "the end of the file"!r}')
        self.pos += 1
        return char

    def value(self) -> Any:
        """Decode the JSON value at the current position (which is then in
        ``value_start``)."""
        self.peek()
        self.value_start = self.pos
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as error:
                if _cut_short(error, len(self.buf)) and self._fill():
                    continue  # only cut off by the block end
                raise AnnotationFormatError(
                    f'{self._where(error.pos)}: invalid JSON: {error.msg}'
                ) from None
            # A value that ends at the block end (a number, say) may go on.
            if end == len(self.buf) and self._fill():
                continue
            self.pos = end
            return value


def _cut_short(error: json.JSONDecodeError, size: int) -> bool:
    """Whether a decode error may only mean the value goes on past the
    buffer's end (a genuine error further back is raised at once, not after
    reading the rest of the file into memory)."""
    # An escape cut in the middle errs a few characters before the end; a
    # string cut anywhere errs where it starts.
    return error.pos >= size - 8 or error.msg.startswith(
        'Unterminated string')


def convert_openmmlab_json_to_jsonl(src: str,
                                    dst: str,
                                    progress: bool = True) -> Dict:
    """Convert an OpenMMLab 2.0 annotation file to JSON Lines.

    Args:
        src (str): ``{"metainfo": {...}, "data_list": [{...}, ...]}`` JSON.
        dst (str): The JSON Lines file to write (atomically).
        progress (bool): Show a progress bar.

    Returns:
        dict: ``num_samples`` and whether a ``metainfo`` line was written.
    """
    stream = _JsonStream(src)
    bar = ByteProgressBar(os.path.getsize(src), f'converting {src}', progress)
    # data_list may come before metainfo, whose line must be first: park the
    # records in a side file until the whole object has been read.
    records_path = f'{dst}.records.{os.getpid()}'
    try:
        with atomic_text_output(dst) as out:
            metainfo, num_samples = _convert(stream, out, records_path, bar)
    finally:
        stream.close()
        if osp.exists(records_path):
            os.remove(records_path)
    bar.close()
    return dict(num_samples=num_samples, metainfo=metainfo is not None)


@contextlib.contextmanager
def atomic_text_output(dst: str) -> Iterator[TextIO]:
    """A UTF-8 text file that appears at ``dst`` only if the block ends
    without an error (nothing is left behind otherwise)."""
    tmp_path = f'{dst}.tmp.{os.getpid()}'
    try:
        with open(tmp_path, 'w', encoding='utf-8') as out:
            yield out
        os.replace(tmp_path, dst)
    finally:
        if osp.exists(tmp_path):
            os.remove(tmp_path)


def _convert(stream: _JsonStream, out, records_path: str,
             bar: ByteProgressBar) -> Tuple[Optional[dict], int]:
    metainfo: Optional[dict] = None
    num_samples: Optional[int] = None
    stream.expect('{', 'the top-level object "{"')
    while stream.peek() != '}':
        key = stream.value()
        if not isinstance(key, str):
            raise stream.error('expected a key', stream.value_start)
        stream.expect(':', '":"')
        if key == 'data_list' and metainfo is not None:
            num_samples = _copy_records(stream, out, bar)
        elif key == 'data_list':
            with open(records_path, 'w', encoding='utf-8') as records:
                num_samples = _copy_records(stream, records, bar)
        elif key == 'metainfo':
            metainfo = stream.value()
            if not isinstance(metainfo, dict):
                raise stream.error('"metainfo" must be an object',
                                   stream.value_start)
            if num_samples is None:
                write_record(out, dict(metainfo=metainfo))
        else:
            stream.value()  # other top-level keys are not samples
        if stream.expect(',}', '"," or "}"') == '}':
            break
    else:
        stream.pos += 1
    if num_samples is None:
        raise AnnotationFormatError(
            f'{stream.path}: no "data_list" in the top-level object')
    if osp.exists(records_path):
        if metainfo is not None:
            write_record(out, dict(metainfo=metainfo))
        with open(records_path, encoding='utf-8') as records:
            shutil.copyfileobj(records, out, _BLOCK)
    if stream.peek():
        raise stream.error('unexpected data after the top-level object')
    return metainfo, num_samples


def _copy_records(stream: _JsonStream, out, bar: ByteProgressBar) -> int:
    stream.expect('[', '"[" to start data_list')
    count = 0
    if stream.peek() == ']':
        stream.pos += 1
        return count
    while True:
        record = stream.value()
        if not isinstance(record, dict):
            raise stream.error(
                f'data_list[{count}] is a {type(record).__name__}, not an '
                'object', stream.value_start)
        write_record(out, record)
        count += 1
        if count % 65536 == 0:
            bar.update(stream.bytes_read)
        if stream.expect(',]', '"," or "]" in data_list') == ']':
            return count


def write_record(out, record: dict) -> None:
    """One compact JSON line."""
    out.write(json.dumps(record, ensure_ascii=False, separators=(',', ':')))
    out.write('\n')
