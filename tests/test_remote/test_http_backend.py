import contextlib
import http.server
import io
import pickle
import threading
import time

import pytest
from mmengine import fileio
from mmengine.fileio.backends import HTTPBackend

from mmdata_plugin.remote import (HTTPRemoteBackend, RemoteAccessDeniedError,
                                  RemoteChangedError, RemoteNotFoundError,
                                  RemoteStat, RemoteUnavailableError)
from mmdata_plugin.testing import LoopbackHTTPServer, find_free_port

# Quick retries: faults are injected, not a real outage.
FAST = dict(backend='remote_http', timeout=5, backoff=0.01, retries=6)


def blob(i, size=3000):
    return bytes((i * 7 + j) % 251 for j in range(size + i))


@pytest.fixture
def objects():
    return {f'set/{i:03d}.bin': blob(i) for i in range(40)}


def test_prefixes_route_to_our_backend():
    assert isinstance(fileio.get_file_backend('http://127.0.0.1:9/a'),
                      HTTPRemoteBackend)
    assert isinstance(fileio.get_file_backend('https://127.0.0.1:9/a'),
                      HTTPRemoteBackend)
    # mmengine's urlopen backend stays reachable by name.
    assert isinstance(
        fileio.get_file_backend(backend_args=dict(backend='http')),
        HTTPBackend)


@pytest.mark.compat
def test_every_object_byte_exact_over_few_connections(objects):
    with LoopbackHTTPServer(objects) as srv:
        for path, data in objects.items():
            assert fileio.get(srv.url(path)) == data
            assert fileio.get(srv.url(path), backend_args=FAST) == data
        backend = fileio.get_file_backend(
            srv.base_url, backend_args=FAST, enable_singleton=True)
        assert backend.get_range(srv.url('set/005.bin'), 100, 50) == \
            objects['set/005.bin'][100:150]
        assert backend.get_text(srv.url('set/000.bin'), 'latin-1') == \
            objects['set/000.bin'].decode('latin-1')
        stat = backend.stat(srv.url('set/001.bin'))
        assert stat.size == len(objects['set/001.bin']) and stat.etag
        assert backend.exists(srv.url('set/001.bin'))
        assert not backend.exists(srv.url('set/missing.bin'))
        with backend.get_local_path(srv.url('set/002.bin')) as local:
            assert open(local, 'rb').read() == objects['set/002.bin']
        # Two backends (default and FAST args), keep-alive pools: a
        # handful of connections for ~90 requests, not one per request.
        assert srv.stats().connections <= 4


def test_one_percent_faults_are_retried_never_a_wrong_sample():
    objects = {f'o/{i}.bin': blob(i, 2000) for i in range(250)}
    # seed 2 draws every fault kind in these 500 requests.
    with LoopbackHTTPServer(objects, fault_rate=0.01, seed=2,
                            stall=2.0) as srv:
        backend = HTTPRemoteBackend(timeout=0.3, backoff=0.01, retries=6)
        for path, data in objects.items():
            assert backend.get(srv.url(path)) == data
            assert backend.get_range(srv.url(path), 500, 700) == \
                data[500:1200]
        faults = srv.stats().faults
    assert set(faults) == {'5xx', 'timeout', 'truncated'}
    # Each fault cost a retry (a busy machine may add timeouts of its own).
    assert backend.retry.retried >= sum(faults.values())


def test_truncated_body_resumes_from_the_missing_byte():
    data = blob(1, 300_000)
    with LoopbackHTTPServer({'big.bin': data}) as srv:
        srv.faults.script('big.bin', ['truncated', 'truncated'])
        sink = io.BytesIO()
        HTTPRemoteBackend(backoff=0.01).download(srv.url('big.bin'), sink)
        assert sink.getvalue() == data
        # Half, then half of the rest, then the rest: each byte sent once.
        assert srv.stats().bytes_per_path['big.bin'] == len(data)


def test_a_body_one_byte_short_is_resumed_not_taken():
    # A truncated answer sends half the body: 1 of 2 bytes here, the
    # smallest shortfall, which the length check must still see (taken,
    # only the ETag's MD5 would catch it: a whole second download).
    data = b'xy'
    with LoopbackHTTPServer({'two.bin': data}) as srv:
        srv.faults.script('two.bin', ['truncated'])
        backend = HTTPRemoteBackend(backoff=0.01)
        sink = io.BytesIO()
        backend.download(srv.url('two.bin'), sink)
        assert sink.getvalue() == data
        assert backend.corrupt_bodies == 0
        assert srv.stats().bytes_per_path['two.bin'] == len(data)


def test_object_changed_is_refused_not_mixed():
    data = blob(2, 200_000)
    with LoopbackHTTPServer({'a.bin': data}) as srv:
        url = srv.url('a.bin')
        backend = HTTPRemoteBackend(backoff=0.01)
        before = backend.stat(url)
        srv.put('a.bin', data[::-1])
        with pytest.raises(RemoteChangedError, match=url):
            backend.download(url, io.BytesIO(), expect=before)

        # Changed between the attempts of one download (after a cut).
        class ChangesRemote(io.BytesIO):

            def write(self, piece):
                if self.tell() == 0:
                    srv.put('a.bin', data)
                return super().write(piece)

        srv.faults.script('a.bin', ['truncated'])
        with pytest.raises(RemoteChangedError, match='ETag'):
            backend.download(url, ChangesRemote())


def test_final_errors_name_the_url_and_are_not_retried():
    with LoopbackHTTPServer({'a': b'1'},
                            required_headers={'Authorization': 'Bearer t'}) \
            as srv:
        backend = HTTPRemoteBackend(backoff=0.01)
        with pytest.raises(RemoteAccessDeniedError, match=srv.url('a')):
            backend.get(srv.url('a'))
        authorized = HTTPRemoteBackend(headers={'Authorization': 'Bearer t'})
        assert authorized.get(srv.url('a')) == b'1'
        with pytest.raises(RemoteNotFoundError, match=srv.url('nope')) as info:
            authorized.get(srv.url('nope'))
        assert isinstance(info.value, FileNotFoundError)
        assert srv.stats().requests_per_path['nope'] == 1


def test_unreachable_host_gives_up_after_bounded_retries():
    url = f'http://127.0.0.1:{find_free_port()}/x.bin'
    backend = HTTPRemoteBackend(retries=2, backoff=0.01, connect_timeout=1)
    with pytest.raises(RemoteUnavailableError,
                       match=r'gave up after 3 attempt.*x\.bin'):
        backend.get(url)


def test_persistent_5xx_gives_up():
    with LoopbackHTTPServer({'a': b'1'}) as srv:
        srv.faults.script('a', ['5xx'] * 10)
        backend = HTTPRemoteBackend(retries=3, backoff=0.01)
        with pytest.raises(RemoteUnavailableError, match='HTTP 50'):
            backend.get(srv.url('a'))
        assert srv.stats().requests == 4


def test_pickles_without_its_connections():
    with LoopbackHTTPServer({'a': b'abc'}) as srv:
        backend = HTTPRemoteBackend()
        assert backend.get(srv.url('a')) == b'abc'
        clone = pickle.loads(pickle.dumps(backend))
        assert clone._client_handle is None
        assert clone.get(srv.url('a')) == b'abc'
        assert clone.stat(srv.url('a')) == RemoteStat(3, backend.stat(
            srv.url('a')).etag)


@pytest.mark.parametrize('args', [
    ('http://127.0.0.1/a.jpg', 'remote object not found (HTTP 404)'),
    # as a DataLoader re-raises a worker's error: its message alone
    ('Caught RemoteNotFoundError in DataLoader worker process 0.\n'
     'Traceback ...: http://127.0.0.1/a.jpg', ),
])
def test_errors_survive_pickling(args):
    from mmdata_plugin.remote.errors import RemoteNotFoundError
    error = RemoteNotFoundError(*args)
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is RemoteNotFoundError
    assert (str(clone), clone.url, clone.reason) == (str(error), error.url,
                                                     error.reason)


class _ChunkedAndLooping(http.server.BaseHTTPRequestHandler):
    """A server that sends GET bodies chunked (HEAD gives the length),
    redirects /loop to itself and /moved to /plain."""
    protocol_version = 'HTTP/1.1'
    data = bytes(range(256)) * 40

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.send_response(200)
        self.send_header('ETag', '"v1"')
        self.send_header('Content-Length', str(len(self.data)))
        self.end_headers()

    def do_GET(self):
        if self.path in ('/loop', '/moved'):
            self.send_response(302 if self.path == '/loop' else 301)
            self.send_header('Location',
                             '/loop' if self.path == '/loop' else '/plain')
            self.send_header('Content-Length', '0')
            self.end_headers()
            return
        # /grown: the object has grown since the HEAD
        body = self.data + (b'x' if self.path == '/grown' else b'')
        self.send_response(200)
        self.send_header('ETag', '"v1"')
        self.send_header('Transfer-Encoding', 'chunked')
        self.end_headers()
        for start in range(0, len(body), 4000):
            chunk = body[start:start + 4000]
            self.wfile.write(b'%x\r\n%s\r\n' % (len(chunk), chunk))
        self.wfile.write(b'0\r\n\r\n')


def test_chunked_bodies_and_redirect_loops():
    from mmdata_plugin.remote.errors import RemoteChangedError, RemoteIOError
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0),
                                             _ChunkedAndLooping)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f'http://127.0.0.1:{server.server_address[1]}'
    try:
        backend = HTTPRemoteBackend(retries=2, backoff=0.01)
        data = _ChunkedAndLooping.data
        # A body without Content-Length checked against the size a HEAD
        # gave (what fetching a remote annotation file once per node does).
        stat = backend.stat(f'{base}/plain')
        sink = io.BytesIO()
        assert backend.download(f'{base}/plain', sink, expect=stat) == stat
        assert sink.getvalue() == data
        with pytest.raises(RemoteChangedError, match='more than the expected'):
            backend.download(f'{base}/grown', io.BytesIO(), expect=stat)
        # A redirect is followed, also by a copy made after use (a
        # DataLoader worker's: the host's pool is not pickled).
        assert backend.get(f'{base}/moved') == data
        assert pickle.loads(pickle.dumps(backend)).get(
            f'{base}/moved') == data
        # A redirect loop is the server's answer, not worth a retry.
        made = backend.requests_made
        with pytest.raises(RemoteIOError, match='too many redirects'):
            backend.get(f'{base}/loop')
        assert backend.requests_made == made + 1
    finally:
        server.shutdown()
        server.server_close()


def test_a_kept_connection_the_server_closed_is_replaced_without_a_retry():
    with LoopbackHTTPServer({'a': b'abc'}, idle_timeout=0.2) as srv:
        backend = HTTPRemoteBackend(backoff=5)
        assert backend.get(srv.url('a')) == b'abc'
        time.sleep(0.6)  # the server closes the idle connection
        assert backend.get(srv.url('a')) == b'abc'
        assert backend.retry.retried == 0
        assert srv.stats().connections == 2


def test_names_with_spaces_or_beyond_ascii_are_sent_quoted():
    objects = {'a b.bin': b'space', 'bild_ä.bin': b'umlaut'}
    with LoopbackHTTPServer(objects) as srv:
        backend = HTTPRemoteBackend()
        for name, data in objects.items():
            assert backend.get(srv.url(name)) == data


@pytest.mark.parametrize('value', [
    'a\r\nHost: evil',
    # a bare line feed ends a header line for many servers
    'a\nHost: evil',
    # a token read from a file keeps the file's last line feed
    'Bearer t\n',
    'a\rb',
    'a\0b'
])
def test_a_header_with_a_line_break_is_refused_naming_it(value):
    with pytest.raises(ValueError, match="headers\\['X-Token'\\]"):
        HTTPRemoteBackend(headers={'X-Token': value})


_CREDENTIALS = {'Authorization': 'Bearer t', 'Cookie': 'session=s',
                'Proxy-Authorization': 'Basic cA=='}


class _Redirecting(http.server.BaseHTTPRequestHandler):
    """/to-other-host answers 302 to the same server under 'localhost',
    /to-other-port 307 to /plain of the server at ``other_port``;
    /see-other answers 303 to /plain; /plain records the credential headers
    it got and sends a body without length, closing the connection;
    anything else answers with a line that is not HTTP."""
    protocol_version = 'HTTP/1.1'
    credentials = []
    other_port = None

    def log_message(self, *args):
        pass

    def do_GET(self):
        port = self.server.server_address[1]
        moves = {
            '/to-other-host': (302, f'http://localhost:{port}/plain'),
            '/to-other-port': (307,
                               f'http://127.0.0.1:{self.other_port}/plain'),
            '/see-other': (303, '/plain')
        }
        if self.path in moves:
            status, location = moves[self.path]
            self.send_response(status)
            self.send_header('Location', location)
            self.send_header('Content-Length', '0')
            self.end_headers()
        elif self.path == '/plain':
            self.credentials.append(
                {name: self.headers.get(name)
                 for name in _CREDENTIALS})
            self.send_response(200)
            self.send_header('Connection', 'close')
            self.end_headers()
            self.wfile.write(b'until the end')
            self.close_connection = True
        else:
            self.wfile.write(b'SPAM 200 OK\r\n\r\n')
            self.close_connection = True

    do_HEAD = do_GET


def test_redirects_to_another_host_drop_credentials_and_bad_answers_retry():
    servers = [
        http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Redirecting)
        for _ in range(2)
    ]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f'http://127.0.0.1:{servers[0].server_address[1]}'
    _Redirecting.other_port = servers[1].server_address[1]
    _Redirecting.credentials = []
    try:
        backend = HTTPRemoteBackend(headers=_CREDENTIALS, retries=2,
                                    backoff=0.01)
        # Another host, and the same host on another port (another origin
        # as browsers and urllib3 count it), get none of the credentials;
        # a redirect on the same server keeps them all.
        for path in ('/to-other-host', '/to-other-port', '/see-other'):
            assert backend.get(f'{base}{path}') == b'until the end'
        nothing = dict.fromkeys(_CREDENTIALS)
        assert _Redirecting.credentials == [nothing, nothing, _CREDENTIALS]
        with pytest.raises(RemoteUnavailableError,
                           match=r'not an HTTP/1.x status line.*'
                           r'gave up after 3 attempt.*/garbage'):
            backend.get(f'{base}/garbage')
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def _self_signed_certificate(folder):
    """A certificate and key for 127.0.0.1, as PEM files in ``folder``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, '127.0.0.1')])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = x509.CertificateBuilder().subject_name(name).issuer_name(
        name).public_key(key.public_key()).serial_number(1).not_valid_before(
            now - datetime.timedelta(hours=1)).not_valid_after(
                now + datetime.timedelta(hours=1)).add_extension(
                    x509.SubjectAlternativeName(
                        [x509.IPAddress(ipaddress.ip_address('127.0.0.1'))]),
                    critical=False).sign(key, hashes.SHA256())
    cert_file, key_file = folder / 'cert.pem', folder / 'key.pem'
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM,
                          serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption()))
    return str(cert_file), str(key_file)


class _Files(http.server.SimpleHTTPRequestHandler):
    """Files of the current folder over keep-alive, counting connections."""
    protocol_version = 'HTTP/1.1'
    connections = 0

    def setup(self):
        type(self).connections += 1
        super().setup()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def tls_files(folder):
    """An https:// server of ``folder`` (keep-alive, a self-signed
    certificate for 127.0.0.1): its base URL and the certificate file."""
    import functools
    import ssl
    pytest.importorskip('cryptography')
    cert_file, key_file = _self_signed_certificate(folder)
    _Files.connections = 0
    server = http.server.ThreadingHTTPServer(
        ('127.0.0.1', 0), functools.partial(_Files, directory=str(folder)))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f'https://127.0.0.1:{server.server_address[1]}', cert_file
    finally:
        server.shutdown()
        server.server_close()


def test_https_checks_the_certificate_and_keeps_the_connection(tmp_path):
    (tmp_path / 'a.bin').write_bytes(blob(3, 100_000))
    with tls_files(tmp_path) as (origin, cert_file):
        url = f'{origin}/a.bin'
        trusted = HTTPRemoteBackend(ca_certs=cert_file)
        data = blob(3, 100_000)
        assert trusted.get(url) == trusted.get(url) == data
        assert HTTPRemoteBackend(verify=False).stat(url).size == len(data)
        assert _Files.connections == 2
        untrusted = HTTPRemoteBackend(backoff=0.01)
        with pytest.raises(RemoteUnavailableError,
                           match=f'TLS error.*CERTIFICATE_VERIFY_FAILED.*'
                           f'{url}'):
            untrusted.get(url)
        assert untrusted.retry.retried == 0
