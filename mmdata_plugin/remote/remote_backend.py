"""What every remote fileio backend of ours shares.

A subclass answers three questions for one attempt: how to make a client,
how to open a body (optionally a byte range) and how to stat an object.
This base class turns them into mmengine's ``BaseStorageBackend`` methods
with bounded retries, streaming downloads checked against the announced
length, ETag validation and one client per process.
"""
import abc
import hashlib
import io
import os
import os.path as osp
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import (BinaryIO, Callable, Generator, Iterator, Optional, Tuple,
                    Union)

from mmengine.fileio.backends import BaseStorageBackend

from .errors import (RemoteChangedError, RemoteCorruptError, RemoteIOError,
                     RemoteNotFoundError, RetryableError)
from .retry import RetryPolicy

# Bytes per read of a streamed body.
CHUNK_SIZE = 1 << 16
# Downloads of an object whose bytes failed their checksum, in all.
CORRUPT_ATTEMPTS = 3
# A strong ETag that is the body's MD5 (S3 single-part objects, most HTTP
# servers); S3 multipart ETags ("<md5>-<parts>") and weak ones are not.
_MD5_ETAG = re.compile(r'"?([0-9a-fA-F]{32})"?')


def is_md5_etag(etag: Optional[str]) -> bool:
    """Whether ``etag`` is the MD5 of the object's bytes (as far as its
    form tells: 32 hex digits, quoted or not)."""
    return _MD5_ETAG.fullmatch(etag or '') is not None


@dataclass(frozen=True)
class RemoteStat:
    """Size in bytes and ETag (as the server spells it; None if absent)."""
    size: int
    etag: Optional[str]


@dataclass
class RemoteBody:
    """An open response body of one attempt.

    Attributes:
        size: Size of the whole object (-1: unknown, a chunked answer).
        etag: Its ETag, if the server sent one.
        start: Offset in the object of the body's first byte.
        length: Bytes the body announces (None: not announced).
        chunks: The body; raises ``RetryableError`` on a broken stream.
        close: Frees the connection; ``complete`` says if it was read out.
    """
    size: int
    etag: Optional[str]
    start: int
    length: Optional[int]
    chunks: Iterator[bytes]
    close: Callable[[bool], None]


class RemoteBackend(BaseStorageBackend):
    """Base of the S3 and HTTP backends (see their docs for the arguments).

    Args:
        timeout (float): Seconds a read may wait for the next bytes (first
            byte included) before the attempt counts as timed out.
        connect_timeout (float): Seconds to establish a connection.
        retries (int): Retries of an attempt that failed retryably (5xx,
            429, timeout, connection reset or refused, truncated body).
        backoff (float): First backoff bound in seconds; doubles per retry,
            full jitter.
        max_backoff (float): Largest backoff bound in seconds.
    """

    def __init__(self,
                 timeout: float = 30.0,
                 connect_timeout: float = 10.0,
                 retries: int = 5,
                 backoff: float = 0.2,
                 max_backoff: float = 10.0) -> None:
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError(f'timeouts must be > 0 s, got timeout={timeout}'
                             f', connect_timeout={connect_timeout}')
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retry = RetryPolicy(retries, backoff, max_backoff)
        self.requests_made = 0
        self.bytes_read = 0
        self.corrupt_bodies = 0
        self._client_handle = None
        self._client_pid: Optional[int] = None

    # ---------------------------------------------------- to implement
    @abc.abstractmethod
    def _new_client(self):
        """A client (connection pool) for the current process."""

    @abc.abstractmethod
    def _open(self, url: str, span: Optional[Tuple[int, int]]) -> RemoteBody:
        """One GET of ``url`` (``span=(start, length)``: that range)."""

    @abc.abstractmethod
    def _head(self, url: str) -> RemoteStat:
        """One metadata request for ``url``."""

    # ----------------------------------------------- client per process
    @property
    def client(self):
        """This process's client.

        mmengine keeps backends as per-process singletons, and DataLoader
        workers fork from a parent that may have used one: a forked child
        must never talk through the parent's sockets, so it builds its own.
        """
        pid = os.getpid()
        if self._client_handle is None or self._client_pid != pid:
            self._client_handle = self._new_client()
            self._client_pid = pid
        return self._client_handle

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state['_client_handle'] = None
        state['_client_pid'] = None
        return state

    # ------------------------------------------------------- reading
    def stat(self, filepath: Union[str, os.PathLike]) -> RemoteStat:
        """Size and ETag of the object, e.g. to validate a cached copy."""
        url = str(filepath)

        def attempt() -> RemoteStat:
            self.requests_made += 1
            return self._head(url)

        return self.retry.call(attempt, url)

    def download(self,
                 filepath: Union[str, os.PathLike],
                 fileobj: BinaryIO,
                 expect: Optional[RemoteStat] = None,
                 span: Optional[Tuple[int, int]] = None) -> RemoteStat:
        """Stream the object (or ``span=(start, length)`` of it) into a file.

        ``fileobj`` only needs ``write``. A body cut short (timeout, reset,
        fewer bytes than its ``Content-Length``) is resumed with a range
        request from the first missing byte, and only if the object still
        has the size and ETag of the first answer; so the file ends up with
        exactly the object's bytes, or the call raises. A whole object
        whose ETag is an MD5 is checked against it; on a mismatch a
        seekable ``fileobj`` is rewritten from a new download (up to
        ``CORRUPT_ATTEMPTS`` in all), any other raises.

        Args:
            filepath: The URL.
            fileobj: A binary sink (``write``).
            expect (RemoteStat, optional): The size/ETag the object must
                still have (e.g. from :meth:`stat` or a cache's record).
            span (tuple, optional): ``(start, length)`` of a range read.

        Returns:
            RemoteStat: The object's size and ETag as served.

        Raises:
            RemoteChangedError: The object is not ``expect`` or changed
                between attempts.
            RemoteCorruptError: The bytes do not match the ETag's MD5.
            RemoteNotFoundError, RemoteAccessDeniedError, RemoteIOError:
                Final answers of the server.
            RemoteUnavailableError: Every attempt failed retryably.
        """
        url = str(filepath)
        attempts = 1
        while True:
            try:
                return self._download_once(url, fileobj, expect, span)
            except RemoteCorruptError:
                self.corrupt_bodies += 1
                if attempts == CORRUPT_ATTEMPTS or not _rewind(fileobj):
                    raise
            attempts += 1

    def _download_once(self, url: str, fileobj: BinaryIO,
                       expect: Optional[RemoteStat],
                       span: Optional[Tuple[int, int]]) -> RemoteStat:
        """:meth:`download` from a first request, checked once complete."""
        progress = _Progress(url, span)

        def attempt() -> RemoteStat:
            self.requests_made += 1
            body = self._open(url, progress.next_span())
            complete = False
            try:
                _check_expected(url, body, expect or progress.stat)
                if progress.stat is None:
                    progress.answered(_first_answer(body, expect))
                    _announce(fileobj, progress.needed(), span)
                self._copy(url, body, progress, fileobj)
                complete = True
            finally:
                body.close(complete)
            return progress.stat

        stat = self.retry.call(attempt, url)
        progress.verify()
        return stat

    def _copy(self, url: str, body: RemoteBody, progress: '_Progress',
              fileobj: BinaryIO) -> None:
        # A server may answer a range request with the whole object (200):
        # keep only the wanted window [progress.position, progress.end).
        if body.start > progress.position:
            raise RemoteIOError(
                url, f'asked for bytes from {progress.position}, the server '
                f'sent bytes from {body.start}')
        end = progress.end
        position = body.start
        received = 0
        try:
            for chunk in body.chunks:
                received += len(chunk)
                chunk_end = position + len(chunk)
                if chunk_end > progress.position and (end is None
                                                      or position < end):
                    piece = chunk[progress.position -
                                  position:None if end is None else end -
                                  position]
                    fileobj.write(piece)
                    progress.wrote(piece)
                position = chunk_end
        finally:
            self.bytes_read += received
        needed = progress.needed()
        if needed is not None:
            if progress.position < needed:
                raise RetryableError(
                    f'truncated body: {received} of {body.length} bytes, '
                    f'ended at byte {progress.position} of {needed}')
            if progress.position > needed:
                # A body of unannounced length (chunked) beyond the size
                # expected of the object.
                raise RemoteChangedError(
                    url, f'the remote object changed: more than the '
                    f'expected {needed} bytes')
        elif body.length is not None and received != body.length:
            raise RetryableError(
                f'truncated body: {received} of {body.length} bytes')

    def get(self, filepath: Union[str, os.PathLike]) -> bytes:
        buffer = io.BytesIO()
        self.download(filepath, buffer)
        return buffer.getvalue()

    def get_text(self,
                 filepath: Union[str, os.PathLike],
                 encoding: str = 'utf-8') -> str:
        return self.get(filepath).decode(encoding)

    def get_range(self, filepath: Union[str, os.PathLike], start: int,
                  length: int) -> bytes:
        """``length`` bytes from offset ``start`` (a Range request)."""
        if start < 0 or length < 0:
            raise ValueError(f'bad range start={start} length={length}')
        if length == 0:
            return b''
        buffer = io.BytesIO()
        self.download(filepath, buffer, span=(start, length))
        return buffer.getvalue()

    def exists(self, filepath: Union[str, os.PathLike]) -> bool:
        try:
            self.stat(filepath)
        except RemoteNotFoundError:
            return False
        return True

    def isfile(self, filepath: Union[str, os.PathLike]) -> bool:
        return not str(filepath).endswith('/') and self.exists(filepath)

    def join_path(self, filepath: Union[str, os.PathLike],
                  *filepaths: Union[str, os.PathLike]) -> str:
        """Join with '/'; a part that is itself a URL starts over."""
        url = str(filepath)
        for part in map(str, filepaths):
            if '://' in part:
                url = part
            elif part:
                url = url.rstrip('/') + '/' + part.lstrip('/')
        return url

    @contextmanager
    def get_local_path(
            self, filepath: Union[str, os.PathLike]) -> Generator[str, None,
                                                                  None]:
        """Download to a temporary file, removed when the block ends."""
        suffix = osp.splitext(str(filepath).split('?')[0])[1]
        fd, path = tempfile.mkstemp(suffix=suffix)
        try:
            with os.fdopen(fd, 'wb') as f:
                self.download(filepath, f)
            yield path
        finally:
            os.remove(path)


class _Progress:
    """How far a download got, so a retry resumes instead of restarting."""

    def __init__(self, url: str, span: Optional[Tuple[int, int]]) -> None:
        self.url = url
        self.span = span
        self.position = span[0] if span else 0
        self.stat: Optional[RemoteStat] = None
        self._md5 = None

    def answered(self, stat: RemoteStat) -> None:
        """The first answer's size and ETag; an MD5 ETag of a whole
        object is checked once the bytes are in."""
        self.stat = stat
        whole = self.span is None or (self.span[0] == 0
                                      and self.span[1] >= stat.size >= 0)
        if whole and is_md5_etag(stat.etag):
            self._md5 = hashlib.md5()

    def wrote(self, piece: bytes) -> None:
        self.position += len(piece)
        if self._md5 is not None:
            self._md5.update(piece)

    def verify(self) -> None:
        if self._md5 is None:
            return
        expected = _MD5_ETAG.fullmatch(self.stat.etag).group(1).lower()
        got = self._md5.hexdigest()
        if got != expected:
            raise RemoteCorruptError(
                self.url, f'the body received has MD5 {got}, its ETag '
                f'{self.stat.etag} says {expected}: damaged in transit')

    @property
    def end(self) -> Optional[int]:
        """Offset after the last wanted byte; None: the object's end."""
        return self.span[0] + self.span[1] if self.span else None

    def needed(self) -> Optional[int]:
        """Where the download is complete (None: unknown size)."""
        size = self.stat.size if self.stat and self.stat.size >= 0 else None
        if self.end is None:
            return size
        return self.end if size is None else min(self.end, size)

    def next_span(self) -> Optional[Tuple[int, int]]:
        """The range to ask for now: None (whole object) on a first try."""
        if self.stat is None or self.stat.size < 0:
            if self.position != (self.span[0] if self.span else 0):
                raise RemoteIOError(
                    self.url, 'the connection broke and the server sent no '
                    'size, so the download cannot resume')
            return self.span
        needed = self.needed()
        return (self.position, needed - self.position)


def _rewind(fileobj) -> bool:
    """Empty a seekable sink for a new download; False if it cannot be."""
    seekable = getattr(fileobj, 'seekable', None)
    if not callable(seekable) or not seekable():
        return False
    fileobj.seek(0)
    fileobj.truncate()
    return True


def _announce(fileobj, needed: Optional[int],
              span: Optional[Tuple[int, int]]) -> None:
    """Tell a sink that can make room (a node store's writer) how many
    bytes come, before any is read."""
    will_write = getattr(fileobj, 'will_write', None)
    if needed is not None and callable(will_write):
        will_write(needed - (span[0] if span else 0))


def _first_answer(body: RemoteBody,
                  expect: Optional[RemoteStat]) -> RemoteStat:
    """Size and ETag of the object as first served; a body sent without
    its length (chunked) takes the expected size, so that a cut body is
    still seen and resumed."""
    if body.size < 0 and expect is not None:
        return RemoteStat(expect.size, body.etag or expect.etag)
    return RemoteStat(body.size, body.etag)


def _check_expected(url: str, body: RemoteBody,
                    expect: Optional[RemoteStat]) -> None:
    if expect is None:
        return
    # A chunked body announces no size: only its length can tell.
    if body.size >= 0 and body.size != expect.size:
        raise RemoteChangedError(
            url, f'the remote object changed: {body.size} bytes instead of '
            f'the expected {expect.size}')
    if expect.etag and body.etag and body.etag != expect.etag:
        raise RemoteChangedError(
            url, f'the remote object changed: ETag {body.etag} instead of '
            f'the expected {expect.etag}')
