"""A stand-in remote object store over HTTP on 127.0.0.1, started by our code.

Tests and benchmarks of remote reading need a remote that behaves like a
real one (latency per request, a shared bandwidth limit, keep-alive, range
reads, ETags, and faults) yet never leaves the machine and stops by itself.
This is a threaded stdlib HTTP/1.1 server with those knobs:

- ``latency``: seconds added before every response (time to first byte);
- ``bandwidth``: bytes/s shared by all connections (one token bucket);
- ``fault_rate``: the fraction of requests that fail, as 5xx answers,
  stalls without an answer (client timeouts), bodies cut short of their
  ``Content-Length`` or (when asked for) bodies with one byte flipped;
  which request fails is a pure function of
  ``(seed, method, path, n-th request for that path)``, so a run is
  reproducible whatever the thread interleaving, and a retry of a failed
  request draws again;
- counters per path (requests, complete bodies served, bytes) so a test can
  count duplicate downloads.

Python's socketserver listens with a backlog of 5, which drops connection
attempts (SYNs) as soon as dozens of clients connect at once; we listen with
a backlog of 1024.
"""
import email.utils
import hashlib
import http.server
import os
import os.path as osp
import posixpath
import socket
import stat
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import unquote, urlsplit

FAULT_KINDS = ('5xx', 'timeout', 'truncated', 'corrupt')
# Drawn when no kinds are given ('corrupt' only when asked for).
DEFAULT_FAULT_KINDS = ('5xx', 'timeout', 'truncated')
# Status codes an injected '5xx' fault answers with, chosen per request.
_FAULT_STATUSES = (500, 502, 503, 504)
_CHUNK = 64 * 1024


class TokenBucket:
    """A bandwidth limit shared by every connection of the server.

    Senders take tokens (bytes) before writing; a sender that overdraws the
    bucket sleeps until the debt is paid, so the aggregate rate converges to
    ``rate`` however many connections send at once.

    Args:
        rate (float): Bytes per second.
        burst (int): Bytes that may be sent at once after an idle period.
    """

    def __init__(self, rate: float, burst: int = _CHUNK) -> None:
        if rate <= 0:
            raise ValueError(f'bandwidth must be > 0 bytes/s, got {rate}')
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = self.burst
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def consume(self, nbytes: int, stop: threading.Event) -> None:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst,
                               self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= nbytes
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            stop.wait(wait)


class FaultPlan:
    """Which requests fail, and how: deterministic from a seed.

    Args:
        rate (float): Probability in [0, 1] that a request fails.
        kinds (Sequence[str]): Fault kinds drawn uniformly among those
            given: ``'5xx'``, ``'timeout'`` (the server stalls without
            answering), ``'truncated'`` (the body stops short of its
            ``Content-Length`` and the connection closes), ``'corrupt'``
            (the whole body with one byte flipped, under the true ETag).
            Default: all but ``'corrupt'``.
        seed (int): Seed of the draw.
    """

    def __init__(self,
                 rate: float = 0.0,
                 kinds: Sequence[str] = DEFAULT_FAULT_KINDS,
                 seed: int = 0) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f'fault_rate must be in [0, 1], got {rate}')
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown or not kinds:
            raise ValueError(f'fault kinds must be a non-empty subset of '
                             f'{FAULT_KINDS}, got {tuple(kinds)}')
        self.rate = rate
        self.kinds = tuple(kinds)
        self.seed = seed
        self._scripted: Dict[str, list] = {}
        self._lock = threading.Lock()

    def script(self, path: str, kinds: Sequence[str]) -> None:
        """Make the next ``len(kinds)`` requests of ``path`` fail so."""
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f'unknown fault kinds {sorted(unknown)}; '
                             f'use {FAULT_KINDS}')
        with self._lock:
            self._scripted.setdefault(_clean_path(path), []).extend(kinds)

    def draw(self, method: str, path: str, attempt: int) -> Optional[str]:
        """The fault of the ``attempt``-th ``method`` request of ``path``."""
        with self._lock:
            queue = self._scripted.get(path)
            if queue:
                return queue.pop(0)
        if self.rate <= 0.0:
            return None
        digest = hashlib.blake2b(
            f'{self.seed}\0{method}\0{path}\0{attempt}'.encode(),
            digest_size=16).digest()
        if int.from_bytes(digest[:8], 'little') / 2.0**64 >= self.rate:
            return None
        return self.kinds[int.from_bytes(digest[8:], 'little') %
                          len(self.kinds)]

    @staticmethod
    def fault_status(path: str, attempt: int) -> int:
        digest = hashlib.blake2b(f'{path}\0{attempt}'.encode(),
                                 digest_size=4).digest()
        return _FAULT_STATUSES[digest[0] % len(_FAULT_STATUSES)]


@dataclass
class ServerStats:
    """A snapshot of what the server has served since its last reset.

    ``downloads`` counts complete GET bodies per path (a ranged GET counts
    as one download of that path); ``duplicate_downloads`` is how many of
    them were not the first for their path.
    """
    connections: int = 0
    requests: int = 0
    get_requests: int = 0
    head_requests: int = 0
    bytes_sent: int = 0
    max_concurrent: int = 0
    faults: Counter = field(default_factory=Counter)
    requests_per_path: Counter = field(default_factory=Counter)
    downloads: Counter = field(default_factory=Counter)
    bytes_per_path: Counter = field(default_factory=Counter)

    @property
    def duplicate_downloads(self) -> int:
        return sum(n - 1 for n in self.downloads.values() if n > 1)

    def copy(self) -> 'ServerStats':
        return ServerStats(self.connections, self.requests, self.get_requests,
                           self.head_requests, self.bytes_sent,
                           self.max_concurrent, Counter(self.faults),
                           Counter(self.requests_per_path),
                           Counter(self.downloads),
                           Counter(self.bytes_per_path))


def _clean_path(path: str) -> str:
    """``/a/./b%20c?x`` -> ``a/b c``; ``..`` cannot climb above the root."""
    path = posixpath.normpath('/' + unquote(urlsplit(path).path))
    return path.lstrip('/')


class _Objects:
    """The served objects: a directory tree or an in-memory mapping."""

    def __init__(self, source: Union[str, Mapping[str, bytes]]) -> None:
        self._lock = threading.Lock()
        if isinstance(source, (str, os.PathLike)):
            self.root: Optional[str] = osp.realpath(os.fspath(source))
            if not osp.isdir(self.root):
                raise NotADirectoryError(
                    f'loopback server root {self.root} is not a directory')
            self._data: Dict[str, Tuple[bytes, str]] = {}
        else:
            self.root = None
            self._data = {}
            for key, value in source.items():
                self.put(key, value)

    def put(self, path: str, data: bytes) -> None:
        key = _clean_path(path)
        if self.root is not None:
            target = osp.join(self.root, key)
            os.makedirs(osp.dirname(target), exist_ok=True)
            tmp = f'{target}.tmp{os.getpid()}'
            with open(tmp, 'wb') as f:
                f.write(data)
            os.replace(tmp, target)
            return
        etag = '"%s"' % hashlib.md5(data).hexdigest()
        with self._lock:
            self._data[key] = (bytes(data), etag)

    def delete(self, path: str) -> None:
        key = _clean_path(path)
        if self.root is not None:
            os.remove(osp.join(self.root, key))
        else:
            with self._lock:
                del self._data[key]

    def open(self, key: str):
        """``(size, etag, reader)`` of ``key`` or None when absent.

        ``reader(start, length)`` returns the bytes of that slice; files are
        read at the time of sending so a directory can hold more than RAM.
        Call ``reader.close()`` once the request is answered.
        """
        if self.root is None:
            with self._lock:
                entry = self._data.get(key)
            if entry is None:
                return None
            data, etag = entry
            return len(data), etag, _BytesSlices(data)
        path = osp.realpath(osp.join(self.root, key))
        if not path.startswith(self.root + os.sep):
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        return st.st_size, etag, _FileSlices(path)


class _BytesSlices:
    """Slices of an in-memory object."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __call__(self, start: int, n: int) -> bytes:
        return self._data[start:start + n]

    def close(self) -> None:
        pass


class _FileSlices:
    """Slices of a file, read through one descriptor for the request: its
    CPU is the client machine's (the cores this server shares with the
    clients it stands in a remote for), so a chunk is one ``pread``, not
    an open, a seek and a close."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: Optional[int] = None

    def __call__(self, start: int, n: int) -> bytes:
        if self._fd is None:
            self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(self._fd, n, start)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _flip_byte(read, offset: int):
    """``read`` with the byte at ``offset`` of the object inverted."""

    def flipped(start: int, n: int) -> bytes:
        data = read(start, n)
        if start <= offset < start + len(data):
            data = bytearray(data)
            data[offset - start] ^= 0xFF
            data = bytes(data)
        return data

    return flipped


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    disable_nagle_algorithm = True
    server: '_Server'

    def log_message(self, format, *args):  # noqa: A002
        pass

    def setup(self):
        self.timeout = self.server.owner.idle_timeout
        super().setup()

    def do_GET(self):
        self._serve(send_body=True)

    def do_HEAD(self):
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        owner = self.server.owner
        key = _clean_path(self.path)
        attempt = owner._count_request(self.command, key)
        owner._enter()
        try:
            if owner.latency > 0:
                owner._stop.wait(owner.latency)
            fault = owner.faults.draw(self.command, key, attempt)
            if fault in ('truncated', 'corrupt') and not send_body:
                fault = None
            if fault is not None:
                owner._count_fault(fault)
            if fault == 'timeout':
                owner._stop.wait(owner.stall)
                self.close_connection = True
                return
            if fault == '5xx':
                self._send_empty(FaultPlan.fault_status(key, attempt),
                                 b'injected fault\n')
                return
            if owner.required_headers and any(
                    self.headers.get(name) != value
                    for name, value in owner.required_headers.items()):
                self._send_empty(401, b'missing or wrong credentials\n')
                return
            found = owner.objects.open(key)
            if found is None:
                self._send_empty(404, b'not found\n')
                return
            size, etag, read = found
            try:
                self._send_object(key, size, etag, read, fault, send_body)
            finally:
                read.close()
        finally:
            owner._leave()

    def _send_object(self, key: str, size: int, etag: str, read,
                     fault: Optional[str], send_body: bool) -> None:
        """Answer with the object (its range), ``fault`` applied."""
        span = self._range(size)
        if span is None:
            self._send_empty(416, b'range not satisfiable\n',
                             {'Content-Range': f'bytes */{size}'})
            return
        start, length = span
        partial = 'Range' in self.headers and (start, length) != (0, size)
        self.send_response(206 if partial else 200)
        self.send_header('Content-Length', str(length))
        self.send_header('Content-Type', 'application/octet-stream')
        self.send_header('ETag', etag)
        self.send_header('Accept-Ranges', 'bytes')
        self.send_header('Date', email.utils.formatdate(usegmt=True))
        if partial:
            self.send_header('Content-Range',
                             f'bytes {start}-{start + length - 1}/{size}')
        self.end_headers()
        if not send_body:
            return
        if fault == 'truncated':
            self.close_connection = True
        if fault == 'corrupt':
            read = _flip_byte(read, start + length // 2)
        self._send_body(key, read, start,
                        length // 2 if fault == 'truncated' else length,
                        length)

    def _range(self, size: int) -> Optional[Tuple[int, int]]:
        """``(start, length)`` to send; None when the Range is unsatisfiable.

        One ``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` range is honoured;
        multi-range or malformed headers are ignored (RFC 9110 allows it) and
        the whole object is sent.
        """
        header = self.headers.get('Range')
        if not header or not header.startswith('bytes=') or ',' in header:
            return 0, size
        first, _, last = header[6:].strip().partition('-')
        try:
            if first == '':
                n = int(last)
                return (max(0, size - n), min(n, size)) if n > 0 else None
            start = int(first)
            end = int(last) if last else size - 1
        except ValueError:
            return 0, size
        if start >= size or end < start:
            return None
        end = min(end, size - 1)
        return start, end - start + 1

    def _send_body(self, key: str, read, start: int, length: int,
                   full_length: int) -> None:
        """Send ``length`` bytes (``full_length`` unless truncated).

        Each chunk is counted before it is written, so a client that has
        read a whole body always finds it in the counters.
        """
        owner = self.server.owner
        sent = 0
        try:
            while sent < length and not owner._stop.is_set():
                n = min(_CHUNK, length - sent)
                if owner.bucket is not None:
                    owner.bucket.consume(n, owner._stop)
                chunk = read(start + sent, n)
                sent += n
                owner._count_body(key, n, full_length, start,
                                  complete=sent == full_length)
                self.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_empty(self, status: int, body: bytes,
                    headers: Optional[Dict[str, str]] = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        if self.command != 'HEAD':
            self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    # socketserver's default of 5 drops SYNs once tens of clients connect
    # at the same moment (measured: 1,694 -> 189 GET/s at 128 clients).
    request_queue_size = 1024
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: 'LoopbackHTTPServer', port: int) -> None:
        self.owner = owner
        self._connections = set()
        self._connections_lock = threading.Lock()
        super().__init__(('127.0.0.1', port), _Handler)

    def process_request(self, request, client_address):
        with self._connections_lock:
            self._connections.add(request)
        self.owner._count_connection()
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        # A client closing its keep-alive connection (a worker exiting) is
        # routine for a server, not a traceback on stderr.
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, socket.timeout)):
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        """Wake handler threads blocked on idle keep-alive connections."""
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class LoopbackHTTPServer:
    """A local HTTP object store with latency, a bandwidth cap and faults.

    Use it as a context manager; it binds 127.0.0.1 on a free port, serves
    from a daemon thread, and stops on exit or after ``max_lifetime``
    seconds, whichever comes first. All knobs except ``source`` may be
    changed while it runs (e.g. ``server.latency = 0``).

    Args:
        source (str | Mapping[str, bytes]): A directory to serve, or a
            mapping of path -> bytes (paths relative, '/'-separated).
        latency (float): Seconds before each response. Default: 0.
        bandwidth (float, optional): Bytes/s shared by all connections;
            None for no cap.
        fault_rate (float): Fraction of requests that fail. Default: 0.
        fault_kinds (Sequence[str]): Among ``'5xx'``, ``'timeout'``,
            ``'truncated'``, ``'corrupt'``. Default: all but
            ``'corrupt'``.
        seed (int): Seed of the fault draws. Default: 0.
        stall (float): Seconds a ``'timeout'`` fault holds the request
            before dropping the connection. Default: 5.
        required_headers (dict, optional): Headers a request must carry
            (e.g. ``{'Authorization': 'Bearer x'}``), else 401.
        idle_timeout (float): Seconds an idle keep-alive connection is kept.
        max_lifetime (float): Seconds after which the server stops by
            itself, a bound for runs that forget to stop it. Default: 3600.
        port (int): Port on 127.0.0.1; 0 (default) picks a free one.
        log_downloads (bool): Keep ``(time.time(), path, bytes, start)``
            of every complete GET body (:meth:`download_log`; ``start``:
            its first byte in the object, non-zero for a range), to split
            counts by period (e.g. per epoch) and find bytes sent twice.
            Default: False.

    Example:
        >>> with LoopbackHTTPServer({'a.bin': b'xyz'}, latency=0.05) as srv:
        ...     requests.get(srv.url('a.bin')).content
        b'xyz'
    """

    def __init__(self,
                 source: Union[str, Mapping[str, bytes]],
                 latency: float = 0.0,
                 bandwidth: Optional[float] = None,
                 fault_rate: float = 0.0,
                 fault_kinds: Sequence[str] = DEFAULT_FAULT_KINDS,
                 seed: int = 0,
                 stall: float = 5.0,
                 required_headers: Optional[Dict[str, str]] = None,
                 idle_timeout: float = 60.0,
                 max_lifetime: float = 3600.0,
                 port: int = 0,
                 log_downloads: bool = False) -> None:
        self.objects = _Objects(source)
        self.latency = latency
        self.bucket = TokenBucket(bandwidth) if bandwidth else None
        self.faults = FaultPlan(fault_rate, fault_kinds, seed)
        self.stall = stall
        self.required_headers = dict(required_headers or {})
        self.idle_timeout = idle_timeout
        self.max_lifetime = max_lifetime
        self._port = port
        self._log: Optional[list] = [] if log_downloads else None
        self._stop = threading.Event()
        self._stats = ServerStats()
        self._attempts: Counter = Counter()
        self._active = 0
        self._lock = threading.Lock()
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._timer: Optional[threading.Timer] = None

    # -- lifecycle --------------------------------------------------------
    def start(self) -> 'LoopbackHTTPServer':
        if self._server is not None:
            raise RuntimeError('the loopback server is already running')
        self._stop.clear()
        self._server = _Server(self, self._port)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs=dict(poll_interval=0.1),
            name='loopback-http',
            daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.max_lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stop.set()
        if self._timer is not None and self._timer is not \
                threading.current_thread():
            self._timer.cancel()
        server.shutdown()
        server.close_connections()
        server.server_close()

    def __enter__(self) -> 'LoopbackHTTPServer':
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    # -- addresses and content ---------------------------------------------
    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError('the loopback server is not running')
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f'http://127.0.0.1:{self.port}/'

    def url(self, path: str) -> str:
        return self.base_url + path.lstrip('/')

    def put(self, path: str, data: bytes) -> None:
        """Add or replace an object (a new ETag; e.g. a changed remote)."""
        self.objects.put(path, data)

    def delete(self, path: str) -> None:
        self.objects.delete(path)

    @property
    def bandwidth(self) -> Optional[float]:
        return self.bucket.rate if self.bucket else None

    @bandwidth.setter
    def bandwidth(self, rate: Optional[float]) -> None:
        self.bucket = TokenBucket(rate) if rate else None

    # -- counters ---------------------------------------------------------
    def stats(self) -> ServerStats:
        with self._lock:
            return self._stats.copy()

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = ServerStats()
            if self._log is not None:
                self._log = []

    def download_log(self) -> list:
        """``[(time.time(), path, bytes, start), ...]`` of complete GET
        bodies (``start``: the body's first byte in the object)."""
        if self._log is None:
            raise RuntimeError('start the server with log_downloads=True')
        with self._lock:
            return list(self._log)

    def _count_request(self, method: str, key: str) -> int:
        with self._lock:
            stats = self._stats
            stats.requests += 1
            if method == 'GET':
                stats.get_requests += 1
            else:
                stats.head_requests += 1
            stats.requests_per_path[key] += 1
            attempt = self._attempts[method, key]
            self._attempts[method, key] += 1
            return attempt

    def _count_connection(self) -> None:
        with self._lock:
            self._stats.connections += 1

    def _count_fault(self, kind: str) -> None:
        with self._lock:
            self._stats.faults[kind] += 1

    def _count_body(self, key: str, nbytes: int, body_size: int,
                    start: int, complete: bool) -> None:
        with self._lock:
            self._stats.bytes_sent += nbytes
            self._stats.bytes_per_path[key] += nbytes
            if complete:
                self._stats.downloads[key] += 1
                if self._log is not None:
                    self._log.append(
                        (time.time(), key, body_size, start))

    def _enter(self) -> None:
        with self._lock:
            self._active += 1
            self._stats.max_concurrent = max(self._stats.max_concurrent,
                                             self._active)

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1

