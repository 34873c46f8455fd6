"""Downloads through the environment's forward proxy (http_proxy,
https_proxy, no_proxy), as boto3 made them before its GETs came to our
connections: a real proxy on loopback (``LoopbackProxy``)."""
import base64

import pytest
from test_http_backend import blob, tls_files

from mmdata_plugin.remote import (HTTPRemoteBackend, RemoteIOError,
                                  RemoteUnavailableError)
from mmdata_plugin.testing import (LoopbackHTTPServer, LoopbackProxy,
                                   MotoS3Server)

FAST = dict(timeout=5, backoff=0.01, retries=2)
OBJECTS = {f'set/{i:02d}.bin': blob(i, 20_000) for i in range(6)}


def _basic(user: str, password: str) -> str:
    return 'Basic ' + base64.b64encode(
        f'{user}:{password}'.encode()).decode()


def test_http_goes_through_the_proxy_as_absolute_requests(monkeypatch):
    with LoopbackHTTPServer(OBJECTS) as server, LoopbackProxy() as proxy:
        monkeypatch.setenv('http_proxy', proxy.url)
        backend = HTTPRemoteBackend(**FAST)
        for path, data in OBJECTS.items():
            assert backend.get(server.url(path)) == data
        assert backend.stat(server.url('set/00.bin')).size == 20_000
        targets = [target for _, target, _ in proxy.requests]
        assert targets == [server.url(p) for p in OBJECTS
                           ] + [server.url('set/00.bin')]


def test_no_proxy_hosts_go_direct(monkeypatch):
    with LoopbackHTTPServer(OBJECTS) as server, LoopbackProxy() as proxy:
        monkeypatch.setenv('http_proxy', proxy.url)
        monkeypatch.setenv('no_proxy', 'example.com,127.0.0.1')
        assert HTTPRemoteBackend(**FAST).get(
            server.url('set/01.bin')) == OBJECTS['set/01.bin']
    assert proxy.requests == []


def test_proxy_credentials_from_the_url_are_sent(monkeypatch):
    wanted = _basic('ann', 'p@ss word')
    with LoopbackHTTPServer(OBJECTS) as server, \
            LoopbackProxy(authorization=wanted) as proxy:
        monkeypatch.setenv(
            'http_proxy', proxy.url.replace('//', '//ann:p%40ss%20word@'))
        assert HTTPRemoteBackend(**FAST).get(
            server.url('set/02.bin')) == OBJECTS['set/02.bin']
        assert proxy.requests[-1][2] == wanted
        monkeypatch.setenv('http_proxy',
                           proxy.url.replace('//', '//ann:wrong@'))
        url = server.url('set/03.bin')
        with pytest.raises(RemoteIOError, match=f"HTTP 407 Proxy.*{url}"):
            HTTPRemoteBackend(**FAST).get(url)


def test_an_https_proxy_url_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.setenv('http_proxy', 'https://127.0.0.1:9')
    with pytest.raises(RemoteUnavailableError,
                       match=r"http_proxy='https://127\.0\.0\.1:9'.*"
                       r'only http:// proxies.*http://127\.0\.0\.1:1/x'):
        HTTPRemoteBackend(**FAST).get('http://127.0.0.1:1/x')


@pytest.fixture
def tls_server(tmp_path):
    (tmp_path / 'a.bin').write_bytes(blob(5, 100_000))
    with tls_files(tmp_path) as served:
        yield served


def test_https_is_tunnelled_with_the_certificate_checked_end_to_end(
        monkeypatch, tls_server):
    origin, cert_file = tls_server
    wanted = _basic('ann', 'secret')
    with LoopbackProxy(authorization=wanted) as proxy:
        monkeypatch.setenv('https_proxy',
                           proxy.url.replace('//', '//ann:secret@'))
        backend = HTTPRemoteBackend(ca_certs=cert_file, **FAST)
        data = blob(5, 100_000)
        assert backend.get(f'{origin}/a.bin') == backend.get(
            f'{origin}/a.bin') == data
        # One tunnel carried both requests (a kept connection).
        assert proxy.requests == [('CONNECT', origin[len('https://'):],
                                   wanted)]
        with pytest.raises(RemoteUnavailableError,
                           match='CERTIFICATE_VERIFY_FAILED'):
            HTTPRemoteBackend(**FAST).get(f'{origin}/a.bin')
        monkeypatch.setenv('https_proxy',
                           proxy.url.replace('//', '//ann:wrong@'))
        refused = HTTPRemoteBackend(ca_certs=cert_file, **FAST)
        with pytest.raises(RemoteUnavailableError,
                           match=f'proxy 127.0.0.1:.* refused the tunnel: '
                           f'HTTP 407.*{origin}/a.bin'):
            refused.get(f'{origin}/a.bin')
        assert refused.retry.retried == 0


def test_s3_gets_go_through_the_proxy_like_boto3s_calls(monkeypatch):
    with MotoS3Server() as s3, LoopbackProxy() as proxy:
        s3.put_objects('bucket', {'k/0.bin': OBJECTS['set/00.bin']})
        monkeypatch.setenv('http_proxy', proxy.url)
        from mmengine import fileio
        backend = fileio.get_file_backend(
            's3://bucket', backend_args=s3.backend_args(backoff=0.01))
        assert backend.get('s3://bucket/k/0.bin') == OBJECTS['set/00.bin']
    assert any(method == 'GET' and target.endswith('/bucket/k/0.bin')
               for method, target, _ in proxy.requests)
