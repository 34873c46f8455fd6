"""Lean keep-alive HTTP/1.1 connections, pooled per host in one process.

The HTTP backend's transport. A download of a small object is mostly
per-request overhead: urllib3's pool, retry, timeout and response objects
cost about as much CPU as reading a 100 KB body, and even the standard
library's ``http.client`` parses every response's headers with the
``email`` package (~65 us of CPU per response; issue 22, item 4). Here a
request is one ``sendall`` of a header block, the status line and headers
are read with ``readline`` into a plain dict, and the body is read with
``readinto`` into a buffer that belongs to the connection, so no bytes
object is made per body: 100 KB arrive in one call.

Framing follows RFC 9112: no body for ``HEAD``, 1xx, 204 and 304; else
``Transfer-Encoding: chunked``, else ``Content-Length``, else the body
ends when the server closes the connection.

Proxies are those of the environment (``http_proxy``, ``https_proxy``,
``no_proxy``, read as urllib and botocore read them): boto3 honoured them
for s3:// before its GETs came here, and a cluster whose object store is
reachable only through a proxy must keep working. https:// goes through a
``CONNECT`` tunnel, http:// as an absolute-form request to the proxy.
"""
import base64
import socket
import ssl
import threading
from typing import Dict, List, NamedTuple, Optional, Tuple
from urllib.parse import unquote, urlsplit
from urllib.request import getproxies_environment, proxy_bypass_environment

#: Bytes the body of one response is read in at most (a 100 KB object in
#: one read).
BUFFER_SIZE = 1 << 18
#: Limits on a response's header block (those of ``http.client``).
MAX_LINE = 65536
MAX_HEADERS = 100


class BadResponse(ConnectionError):
    """The server's answer is not HTTP/1.x (worth a retry: a proxy or
    server that broke off mid-answer)."""


class ProxyRefused(ConnectionError):
    """The proxy answered a tunnel request with an error status (e.g. 407:
    proxy credentials missing or wrong; 403: the destination is not
    allowed)."""

    def __init__(self, proxy: 'Proxy', status: int, reason: str) -> None:
        super().__init__(f'the proxy {proxy.host}:{proxy.port} refused the '
                         f'tunnel: HTTP {status} {reason}')
        self.status = status


class Proxy(NamedTuple):
    """A forward proxy: where it listens and the ``Proxy-Authorization``
    value of the credentials in its URL (None without)."""
    host: str
    port: int
    authorization: Optional[str]


def environment_proxy(scheme: str, host: str) -> Optional[Proxy]:
    """The proxy the environment names for ``scheme://host`` (None: go
    direct, ``no_proxy`` included)."""
    proxies = getproxies_environment()
    url = proxies.get(scheme)
    if not url or proxy_bypass_environment(host, proxies):
        return None
    if '://' not in url:
        url = 'http://' + url
    parts = urlsplit(url)
    if parts.scheme != 'http' or not parts.hostname:
        raise ValueError(
            f'{scheme}_proxy={url!r}: only http:// proxies are supported '
            '(a CONNECT tunnel carries https:// inside it)')
    authorization = None
    if parts.username is not None:
        credentials = f'{unquote(parts.username)}:' \
                      f'{unquote(parts.password or "")}'
        authorization = 'Basic ' + base64.b64encode(
            credentials.encode()).decode('ascii')
    return Proxy(parts.hostname, parts.port or 80, authorization)


class ClosedBeforeAnswer(ConnectionResetError):
    """The connection closed before a status line arrived: what a kept
    connection that the server closed while it was idle does."""


#: How a kept connection that the server closed while it was idle fails,
#: before any answer: the request is sent again at once on a new one.
STALE_CONNECTION = (ConnectionResetError, BrokenPipeError,
                    ConnectionAbortedError, ssl.SSLEOFError,
                    ssl.SSLZeroReturnError)


class Response:
    """Status, headers and body of one answer.

    Attributes:
        status (int): The status code.
        reason (str): The reason phrase.
        headers (dict): Header values by lower-case name (repeated headers
            joined with ``', '``).
    """

    def __init__(self, connection: 'Connection', method: str) -> None:
        self._reader = connection.reader
        self.status, self.reason, version = _status_line(self._reader)
        while 100 <= self.status < 200:  # interim answers: the next one
            _header_block(self._reader)
            self.status, self.reason, version = _status_line(self._reader)
        self.headers = _header_block(self._reader)
        tokens = self.headers.get('connection', '').lower()
        self.will_close = 'close' in tokens or (
            version == 'HTTP/1.0' and 'keep-alive' not in tokens)
        self._chunked = False
        self._left: Optional[int] = 0
        if method == 'HEAD' or self.status in (204, 304):
            return
        if 'chunked' in self.headers.get('transfer-encoding', '').lower():
            self._chunked = True
        elif 'content-length' in self.headers:
            try:
                self._left = int(self.headers['content-length'])
            except ValueError:
                raise BadResponse('a Content-Length that is no number: '
                                  f'{self.headers["content-length"]!r}')
        else:
            self._left = None  # up to the end of the connection
            self.will_close = True

    def getheader(self, name: str, default: Optional[str] = None):
        return self.headers.get(name.lower(), default)

    @property
    def complete(self) -> bool:
        """Whether the body was read to its end."""
        return self._left == 0 and not self._chunked

    @property
    def reusable(self) -> bool:
        """Whether the connection can carry the next request."""
        return self.complete and not self.will_close

    def readinto(self, buffer: memoryview) -> int:
        """Bytes of the body read into ``buffer``; 0 at its end, or when
        the connection closed before it (the caller compares lengths)."""
        if self._chunked:
            return self._readinto_chunked(buffer)
        if self._left is None:
            received = self._reader.readinto(buffer)
            if not received:
                self._left = 0
            return received
        if not self._left:
            return 0
        received = self._reader.readinto(buffer[:self._left])
        self._left -= received
        if not received:
            self.will_close = True
        return received

    def _readinto_chunked(self, buffer: memoryview) -> int:
        if not self._left:
            line = self._reader.readline(MAX_LINE + 1)
            try:
                self._left = int(line.split(b';', 1)[0], 16)
            except ValueError:
                raise BadResponse(f'a chunk size that is no number: '
                                  f'{line[:40]!r}') from None
            if self._left == 0:
                _header_block(self._reader)  # trailers
                self._chunked = False
                return 0
        received = self._reader.readinto(buffer[:self._left])
        if not received:
            raise BadResponse('the connection closed inside a chunk')
        self._left -= received
        if not self._left and self._reader.readline(MAX_LINE + 1) != \
                b'\r\n':
            raise BadResponse('a chunk not followed by CRLF')
        return received

    def read(self) -> None:
        """Read the rest of the body and drop it."""
        buffer = memoryview(bytearray(1 << 16))
        while self.readinto(buffer):
            pass


class Connection:
    """One keep-alive connection to ``scheme://host:port``, opened on first
    use (again after a close), with its own read buffer.

    Connects under ``connect_timeout`` (TLS handshake included), then
    waits at most ``read_timeout`` for each read: the longest silence
    allowed before the first byte or between two parts of a body (a slow
    but steady transfer is not cut). Through ``proxy`` when given.
    """

    def __init__(self,
                 scheme: str,
                 host: str,
                 port: int,
                 connect_timeout: float,
                 read_timeout: float,
                 context: Optional[ssl.SSLContext],
                 proxy: Optional[Proxy] = None) -> None:
        self.scheme = scheme
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.context = context
        self.proxy = proxy
        self.buffer = memoryview(bytearray(BUFFER_SIZE))
        self.sock: Optional[socket.socket] = None
        self.reader = None

    @property
    def is_open(self) -> bool:
        return self.sock is not None

    @property
    def _authority(self) -> str:
        host = f'[{self.host}]' if ':' in self.host else self.host
        return f'{host}:{self.port}'

    def _open(self) -> None:
        peer = ((self.host, self.port) if self.proxy is None else
                (self.proxy.host, self.proxy.port))
        sock = socket.create_connection(peer, self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.proxy is not None and self.scheme == 'https':
                self._tunnel(sock)
            if self.context is not None:
                sock = self.context.wrap_socket(sock,
                                                server_hostname=self.host)
            sock.settimeout(self.read_timeout)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.reader = sock.makefile('rb')

    def _tunnel(self, sock: socket.socket) -> None:
        """Ask the proxy for a tunnel to the origin (TLS then runs inside
        it, end to end)."""
        sock.settimeout(self.connect_timeout)
        lines = [f'CONNECT {self._authority} HTTP/1.1',
                 f'Host: {self._authority}']
        if self.proxy.authorization:
            lines.append(f'Proxy-Authorization: {self.proxy.authorization}')
        sock.sendall(('\r\n'.join(lines) + '\r\n\r\n').encode('latin-1'))
        # Unbuffered: the bytes after the proxy's answer are the origin's
        # (its TLS handshake), not this reader's.
        reader = sock.makefile('rb', buffering=0)
        status, reason, _ = _status_line(reader)
        _header_block(reader)
        if not 200 <= status < 300:
            raise ProxyRefused(self.proxy, status, reason)

    def _through_proxy(self, head: bytes) -> bytes:
        """``head`` as a forward proxy takes it: the absolute URL as the
        request target, and the proxy's credentials."""
        method, _, rest = head.partition(b' ')
        line_end = rest.index(b'\r\n')
        extra = (b'\r\nProxy-Authorization: ' +
                 self.proxy.authorization.encode('latin-1')
                 if self.proxy.authorization else b'')
        return (method + b' http://' + self._authority.encode('latin-1') +
                rest[:line_end] + extra + rest[line_end:])

    def request(self, method: str, head: bytes) -> Response:
        """Send ``head`` (request line and headers) and read the answer's
        status and headers."""
        if self.sock is None:
            self._open()
        if self.proxy is not None and self.scheme == 'http':
            head = self._through_proxy(head)
        try:
            self.sock.sendall(head)
            return Response(self, method)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.sock is not None:
            self.reader.close()
            self.sock.close()
            self.sock = self.reader = None


class HostConnections:
    """Idle keep-alive connections of one process, per ``(scheme, host,
    port)``.

    A request takes one (or makes one), the caller gives it back once the
    response is read out, or closes it. At most ``maxsize`` idle ones are
    kept per host: as many as threads of the process read one host at once.

    Args:
        connect_timeout (float): Seconds to connect (and TLS handshake).
        read_timeout (float): Seconds a read may wait for bytes.
        maxsize (int): Idle connections kept per host.
        verify (bool): Check TLS certificates and host names.
        ca_certs (str, optional): CA bundle for private endpoints.
    """

    def __init__(self,
                 connect_timeout: float,
                 read_timeout: float,
                 maxsize: int,
                 verify: bool = True,
                 ca_certs: Optional[str] = None) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.maxsize = maxsize
        self.verify = verify
        self.ca_certs = ca_certs
        self._context: Optional[ssl.SSLContext] = None
        self._idle: Dict[Tuple[str, str, int], List[Connection]] = {}
        self._lock = threading.Lock()

    def take(self, scheme: str, host: str, port: int) -> Connection:
        """A connection to ``host`` (an open one when one is idle)."""
        with self._lock:
            idle = self._idle.get((scheme, host, port))
            if idle:
                return idle.pop()
        return Connection(scheme, host, port, self.connect_timeout,
                          self.read_timeout,
                          self.context if scheme == 'https' else None,
                          environment_proxy(scheme, host))

    def give_back(self, connection: Connection) -> None:
        """Keep ``connection`` (its response read out) for the next request
        to its host; closed when ``maxsize`` are idle already."""
        origin = (connection.scheme, connection.host, connection.port)
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if len(idle) < self.maxsize:
                idle.append(connection)
                return
        connection.close()

    @property
    def context(self) -> ssl.SSLContext:
        """The TLS settings, made on first https:// use."""
        if self._context is None:
            if self.verify:
                context = ssl.create_default_context(cafile=self.ca_certs)
            else:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._context = context
        return self._context


def _status_line(reader) -> Tuple[int, str, str]:
    line = reader.readline(MAX_LINE + 1)
    if not line:
        raise ClosedBeforeAnswer('the server closed the connection '
                                 'without an answer')
    version, _, rest = line.decode('latin-1').rstrip('\r\n').partition(' ')
    code, _, reason = rest.partition(' ')
    if not version.startswith('HTTP/1.') or len(code) != 3 or \
            not code.isdigit():
        raise BadResponse(f'not an HTTP/1.x status line: {line[:80]!r}')
    return int(code), reason, version


def _header_block(reader) -> Dict[str, str]:
    headers: Dict[str, str] = {}
    name = None
    for _ in range(MAX_HEADERS + 1):
        line = reader.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise BadResponse('a header line longer than '
                              f'{MAX_LINE} bytes')
        if line in (b'\r\n', b'\n'):
            return headers
        if not line:
            raise BadResponse('the connection closed inside the headers')
        text = line.decode('latin-1').rstrip('\r\n')
        if text[0] in ' \t' and name is not None:  # a folded line
            headers[name] += ' ' + text.strip()
            continue
        name, colon, value = text.partition(':')
        if not colon:
            raise BadResponse(f'not a header line: {line[:80]!r}')
        name = name.strip().lower()
        value = value.strip()
        headers[name] = (headers[name] + ', ' +
                         value) if name in headers else value
    raise BadResponse(f'more than {MAX_HEADERS} header lines')
