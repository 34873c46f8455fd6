"""A forward HTTP proxy on 127.0.0.1 for the tests of proxied downloads.

It takes absolute-form requests (``GET http://host:port/path``) and passes
each to the origin on a connection of its own, and ``CONNECT host:port``
tunnels (https://), relaying bytes both ways until either side closes. It
records what it was asked (:attr:`LoopbackProxy.requests`) and can demand
credentials (``Proxy-Authorization``, answered 407 without them).
"""
import http.client
import http.server
import socket
import threading
from typing import List, Optional, Tuple
from urllib.parse import urlsplit

_HOP_BY_HOP = frozenset(('connection', 'keep-alive', 'proxy-authorization',
                         'proxy-connection', 'transfer-encoding', 'te',
                         'trailer', 'upgrade'))


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, format, *args):  # noqa: A002
        pass

    def _admitted(self) -> bool:
        owner = self.server.owner
        owner.record(self.command, self.path,
                     self.headers.get('Proxy-Authorization'))
        if owner.authorization is None or self.headers.get(
                'Proxy-Authorization') == owner.authorization:
            return True
        self.send_response(407, 'Proxy Authentication Required')
        self.send_header('Proxy-Authenticate', 'Basic realm="test"')
        self.send_header('Content-Length', '0')
        self.end_headers()
        return False

    def do_CONNECT(self):
        if not self._admitted():
            return
        host, _, port = self.path.rpartition(':')
        upstream = socket.create_connection((host.strip('[]'), int(port)),
                                            timeout=10)
        self.send_response(200, 'Connection Established')
        self.end_headers()
        self.wfile.flush()
        pump = threading.Thread(target=_relay,
                                args=(upstream, self.connection),
                                daemon=True)
        pump.start()
        _relay(self.connection, upstream)
        pump.join(10)
        self.close_connection = True

    def _forward(self):
        if not self._admitted():
            return
        target = urlsplit(self.path)
        if target.scheme != 'http':
            self.send_error(400, 'absolute-form http:// target expected')
            return
        path = target.path + (f'?{target.query}' if target.query else '')
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() not in _HOP_BY_HOP
        }
        origin = http.client.HTTPConnection(target.hostname, target.port,
                                            timeout=10)
        try:
            origin.request(self.command, path, headers=headers)
            answer = origin.getresponse()
            body = answer.read()
            self.send_response(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() not in _HOP_BY_HOP | {'content-length'}:
                    self.send_header(name, value)
            self.send_header(
                'Content-Length',
                answer.getheader('Content-Length', str(len(body)))
                if self.command == 'HEAD' else str(len(body)))
            self.end_headers()
            if self.command != 'HEAD':
                self.wfile.write(body)
        finally:
            origin.close()

    do_GET = do_HEAD = _forward


def _relay(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(1 << 16)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class LoopbackProxy:
    """A forward proxy on ``127.0.0.1`` (a free port), as a context manager.

    Args:
        authorization (str, optional): The ``Proxy-Authorization`` value a
            request must carry (others get 407); None: any request is
            served.
    """

    def __init__(self, authorization: Optional[str] = None) -> None:
        self.authorization = authorization
        #: ``(method, target, Proxy-Authorization)`` of each request.
        self.requests: List[Tuple[str, str, Optional[str]]] = []
        self._lock = threading.Lock()
        self._server: Optional[http.server.ThreadingHTTPServer] = None

    def record(self, method: str, target: str,
               authorization: Optional[str]) -> None:
        with self._lock:
            self.requests.append((method, target, authorization))

    @property
    def url(self) -> str:
        return f'http://127.0.0.1:{self._server.server_address[1]}'

    def __enter__(self) -> 'LoopbackProxy':
        self._server = http.server.ThreadingHTTPServer(('127.0.0.1', 0),
                                                       _ProxyHandler)
        self._server.daemon_threads = True
        self._server.owner = self
        threading.Thread(target=self._server.serve_forever,
                         daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
