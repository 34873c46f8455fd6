"""http(s):// objects over lean keep-alive connections pooled per host."""
import re
import ssl
from typing import Callable, Dict, Iterator, Optional, Tuple
from urllib.parse import quote, urljoin, urlsplit

from .errors import (RemoteIOError, RemoteUnavailableError, RetryableError,
                     error_for_status)
from .http_connections import (STALE_CONNECTION, Connection, HostConnections,
                               ProxyRefused, Response)
from .remote_backend import RemoteBackend, RemoteBody, RemoteStat

_CONTENT_RANGE = re.compile(r'bytes (\d+)-(\d+)/(\d+|\*)')
_REDIRECTS = frozenset((301, 302, 303, 307, 308))
#: Redirects followed per request (urllib3's default, which this backend
#: used before).
MAX_REDIRECTS = 5
#: Headers a redirect to another host does not carry on.
_CREDENTIAL_HEADERS = frozenset(('authorization', 'cookie',
                                 'proxy-authorization'))
_DEFAULT_PORTS = {'http': 80, 'https': 443}
#: Characters sent as they are in a request target; others are quoted.
_URL_SAFE = "!#$%&'()*+,/:;=?@[]~"
_UNSAFE = re.compile(r'[\x00-\x20\x7f]')


class HTTPRemoteBackend(RemoteBackend):
    """Read http:// and https:// objects, for mmengine's fileio.

    Registered as backend ``'remote_http'`` and for the ``http``/``https``
    prefixes, so ``fileio.get('https://...')`` and every transform with a
    URL path use it; mmengine's bare ``urlopen`` backend stays available as
    ``backend_args=dict(backend='http')``.

    Keep-alive connections are pooled per host and process (no TCP/TLS
    handshake per sample; see :mod:`.http_connections`), redirects are
    followed (to any host, at most ``MAX_REDIRECTS``; credentials are not
    sent on to another host). Responses are streamed and checked against
    their ``Content-Length``; 5xx, 408, 429, timeouts, resets, refused
    connections and truncated bodies are retried with jittered exponential
    backoff; 404/401/403 fail at once, naming the URL. The environment's
    ``http_proxy`` / ``https_proxy`` / ``no_proxy`` are followed (see
    :mod:`.http_connections`).

    Args:
        headers (dict, optional): Sent with every request, e.g.
            ``{'Authorization': 'Bearer ...'}`` (put secrets in environment
            variables: ``'{{$TOKEN:}}'`` in an mmengine config; mmengine
            substitutes only with the ``:``).
        pool_maxsize (int): Idle connections kept per host and process.
            Raise it when many threads of one process read at once.
        verify (bool): Check TLS certificates.
        ca_certs (str, optional): CA bundle for private endpoints.
        **kwargs: ``timeout``, ``connect_timeout``, ``retries``, ``backoff``,
            ``max_backoff`` (see :class:`RemoteBackend`).
    """

    def __init__(self,
                 headers: Optional[Dict[str, str]] = None,
                 pool_maxsize: int = 16,
                 verify: bool = True,
                 ca_certs: Optional[str] = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.headers = dict(headers or {})
        for name, value in self.headers.items():
            if any(char in f'{name}{value}' for char in '\r\n\0'):
                raise ValueError(
                    f'headers[{name!r}] holds a control character '
                    '(a line break would end the header block)')
        # Asked for as it is (no compressed transfer): sizes, ranges and
        # ETags are the object's.
        self._headers = {
            'User-Agent': 'mmdata_plugin',
            'Accept-Encoding': 'identity',
            **self.headers
        }
        self.pool_maxsize = pool_maxsize
        self.verify = verify
        self.ca_certs = ca_certs

    def _new_client(self) -> HostConnections:
        return HostConnections(self.connect_timeout, self.timeout,
                               self.pool_maxsize, self.verify, self.ca_certs)

    def _request(self,
                 method: str,
                 url: str,
                 headers: Dict[str, str],
                 target: Optional[str] = None) -> '_Answer':
        """The first answer to ``target`` (default ``url``) that is no
        redirect; errors name ``url``."""
        headers = {**self._headers, **headers}
        target = target or url
        for _ in range(MAX_REDIRECTS + 1):
            answer = self._send(method, url, target, headers)
            status = answer.response.status
            if status not in _REDIRECTS:
                return answer
            location = answer.response.getheader('Location')
            answer.drain()
            if location is None:
                raise RemoteIOError(
                    url, f'HTTP {status} redirect without a Location')
            moved = urljoin(target, location)
            if urlsplit(moved).netloc != urlsplit(target).netloc:
                headers = {
                    name: value
                    for name, value in headers.items()
                    if name.lower() not in _CREDENTIAL_HEADERS
                }
            if status == 303 and method != 'HEAD':
                method = 'GET'
            target = moved
        raise RemoteIOError(
            url, f'too many redirects (more than {MAX_REDIRECTS})')

    def _send(self, method: str, url: str, target: str,
              headers: Dict[str, str]) -> '_Answer':
        """One request to ``target`` (``url`` or where it redirected);
        errors name ``url``."""
        scheme, host, port, head = request_head(url, method, target, headers)
        try:
            connection = self.client.take(scheme, host, port)
        except ValueError as error:  # a proxy setting we cannot use
            raise RemoteUnavailableError(url, str(error)) from None
        try:
            try:
                reused = connection.is_open
                response = connection.request(method, head)
            except STALE_CONNECTION:
                if not reused:
                    raise
                response = connection.request(method, head)
        except ssl.SSLError as error:
            raise RemoteUnavailableError(url, f'TLS error: {error}') from None
        except ProxyRefused as error:
            if error.status in (403, 407):
                raise RemoteUnavailableError(url, str(error)) from None
            raise RetryableError(str(error)) from None
        except OSError as error:
            raise RetryableError(
                f'{type(error).__name__}: {error}') from None
        return _Answer(response, connection, self.client)

    def _head(self, url: str) -> RemoteStat:
        answer = self._request('HEAD', url, {})
        answer.drain()
        response = answer.response
        if response.status in (405, 501):
            # HEAD not allowed: a 1-byte range GET tells the size as well.
            body = self._open(url, (0, 1))
            body.close(False)
            size, etag = (None if body.size < 0 else body.size), body.etag
        elif response.status != 200:
            raise error_for_status(url, response.status)
        else:
            size = response.getheader('Content-Length')
            etag = response.getheader('ETag')
        if size is None:
            raise RemoteIOError(url, 'the server sent no Content-Length')
        return RemoteStat(int(size), etag)

    def _open(self, url: str, span: Optional[Tuple[int, int]]) -> RemoteBody:
        return self.open_body(url, url, range_headers(span))

    def open_body(self,
                  url: str,
                  target: str,
                  headers: Dict[str, str],
                  failed: Callable[[str, int, str, bytes],
                                   Exception] = None) -> RemoteBody:
        """One GET of ``target`` (``url`` itself, or where an S3 object is
        read from) with ``headers``, as a body of ``url``.

        ``failed(url, status, reason, start of the error page)`` is the
        error a status other than 200/206 raises (default: by the status,
        :func:`~.errors.error_for_status`).
        """
        answer = self._request('GET', url, headers, target)
        response = answer.response
        if response.status not in (200, 206):
            page = answer.error_page()
            if failed is None:
                raise error_for_status(url, response.status, response.reason)
            raise failed(url, response.status, response.reason, page)
        length_header = response.getheader('Content-Length')
        length = int(length_header) if length_header is not None else None
        start, size = 0, length
        if response.status == 206:
            content_range = response.getheader('Content-Range', '')
            match = _CONTENT_RANGE.fullmatch(content_range)
            if match is None or match.group(3) == '*':
                answer.release(False)
                raise RemoteIOError(
                    url, 'a range answer without a usable Content-Range '
                    f'({content_range!r})')
            start, size = int(match.group(1)), int(match.group(3))
        if size is None:
            size = -1  # chunked answer: a cut one still raises
        return RemoteBody(size, response.getheader('ETag'), start, length,
                          answer.chunks(), answer.release)


def range_headers(span: Optional[Tuple[int, int]]) -> Dict[str, str]:
    """The ``Range`` header of ``span=(start, length)`` (none for None)."""
    if span is None:
        return {}
    return {'Range': f'bytes={span[0]}-{span[0] + span[1] - 1}'}


def request_head(url: str, method: str, target: str,
                  headers: Dict[str, str]) -> Tuple[str, str, int, bytes]:
    """Scheme, host, port and the request's bytes (request line and
    headers) for ``target``; a URL that cannot be sent names ``url``."""
    parts = urlsplit(target)
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError as error:
        raise RemoteIOError(url, f'not a valid URL ({error})') from None
    if port is None or not parts.hostname:
        raise RemoteIOError(url, f'not a valid URL ({target!r})')
    path = parts.path or '/'
    if parts.query:
        path += '?' + parts.query
    if not path.isascii() or _UNSAFE.search(path):
        # as a browser sends them (non-ASCII names, spaces)
        path = quote(path, safe=_URL_SAFE)
    lines = [f'{method} {path} HTTP/1.1', f'Host: {parts.netloc}']
    lines.extend(f'{name}: {value}' for name, value in headers.items())
    try:
        return parts.scheme, parts.hostname, port, (
            '\r\n'.join(lines) + '\r\n\r\n').encode('latin-1')
    except UnicodeEncodeError as error:
        raise RemoteIOError(
            url, f'a header that is not latin-1 ({error})') from None


class _Answer:
    """A response and the pooled connection it arrived on.

    Args:
        response (Response): The response, body unread.
        connection (Connection): Its connection.
        pool (HostConnections): Where the connection goes back.
    """

    def __init__(self, response: Response, connection: Connection,
                 pool: HostConnections) -> None:
        self.response = response
        self.connection = connection
        self.pool = pool

    def chunks(self) -> Iterator[memoryview]:
        """The body, read into the connection's buffer: each part is valid
        until the next is asked for."""
        buffer = self.connection.buffer
        readinto = self.response.readinto
        try:
            while True:
                received = readinto(buffer)
                if not received:
                    return
                yield buffer[:received]
        except OSError as error:
            raise RetryableError(
                f'connection broken: {type(error).__name__}: {error}') \
                from None

    def release(self, complete: bool) -> None:
        """Give the connection back when the body was read out, else close
        it (bytes of this answer may still be on the way)."""
        if complete and self.response.reusable:
            self.pool.give_back(self.connection)
        else:
            self.connection.close()

    def error_page(self) -> bytes:
        """The start of an error answer's body (at most 64 KB, enough for
        an S3 error document); the rest is drained."""
        page = memoryview(bytearray(1 << 16))
        try:
            received = self.response.readinto(page)
        except OSError:
            self.release(False)
            return b''
        self.drain()
        return bytes(page[:received])

    def drain(self) -> None:
        """Read out a body nobody wants (a redirect's, an error page), so
        the connection serves the next request."""
        try:
            self.response.read()
        except OSError:
            self.release(False)
            return
        self.release(True)
