import http.client
import os
import socket
import threading
import time

import pytest

from mmdata_plugin.testing import FaultPlan, LoopbackHTTPServer

BLOB = bytes(range(256)) * 40  # 10 KiB


def request(server, method, path, headers=None, timeout=10):
    conn = http.client.HTTPConnection('127.0.0.1', server.port,
                                      timeout=timeout)
    try:
        conn.request(method, '/' + path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.fixture
def server():
    with LoopbackHTTPServer({'d/blob.bin': BLOB, 'small': b'abc'}) as srv:
        yield srv


def test_get_head_and_headers(server):
    status, headers, body = request(server, 'GET', 'd/blob.bin')
    assert (status, body) == (200, BLOB)
    assert headers['Content-Length'] == str(len(BLOB))
    assert headers['Accept-Ranges'] == 'bytes'
    status, head_headers, body = request(server, 'HEAD', 'd/blob.bin')
    assert (status, body) == (200, b'')
    assert head_headers['ETag'] == headers['ETag']
    assert head_headers['Content-Length'] == str(len(BLOB))
    assert request(server, 'GET', 'missing')[0] == 404
    # '..' never leaves the served tree.
    assert request(server, 'GET', '../../etc/passwd')[0] == 404


@pytest.mark.parametrize('spec,expected', [
    ('bytes=10-19', BLOB[10:20]),
    ('bytes=10240-', None),
    ('bytes=100-', BLOB[100:]),
    ('bytes=-7', BLOB[-7:]),
    ('bytes=0-999999', BLOB),
], ids=['closed', 'past-end', 'open', 'suffix', 'beyond-end'])
def test_range_reads(server, spec, expected):
    status, headers, body = request(server, 'GET', 'd/blob.bin',
                                     {'Range': spec})
    if expected is None:
        assert status == 416
        assert headers['Content-Range'] == f'bytes */{len(BLOB)}'
        return
    assert body == expected
    if len(expected) < len(BLOB):
        assert status == 206
        assert headers['Content-Range'].endswith(f'/{len(BLOB)}')


def test_keep_alive_reuses_one_connection(server):
    conn = http.client.HTTPConnection('127.0.0.1', server.port, timeout=10)
    for _ in range(5):
        conn.request('GET', '/small')
        assert conn.getresponse().read() == b'abc'
    conn.close()
    stats = server.stats()
    assert (stats.connections, stats.requests) == (1, 5)


def test_put_changes_etag_and_counters_count_duplicates(server):
    etag = request(server, 'HEAD', 'small')[1]['ETag']
    server.put('small', b'abcd')
    status, headers, body = request(server, 'GET', 'small')
    assert body == b'abcd' and headers['ETag'] != etag
    request(server, 'GET', 'small')
    request(server, 'GET', 'd/blob.bin', {'Range': 'bytes=0-9'})
    stats = server.stats()
    assert stats.downloads == {'small': 2, 'd/blob.bin': 1}
    assert stats.duplicate_downloads == 1
    assert stats.bytes_per_path['d/blob.bin'] == 10
    assert stats.head_requests == 1 and stats.get_requests == 3
    server.reset_stats()
    assert server.stats().requests == 0


def test_directory_source(tmp_path):
    (tmp_path / 'sub').mkdir()
    (tmp_path / 'sub' / 'x.bin').write_bytes(BLOB)
    (tmp_path.parent / 'outside.bin').write_bytes(b'secret')
    with LoopbackHTTPServer(str(tmp_path)) as srv:
        assert request(srv, 'GET', 'sub/x.bin')[2] == BLOB
        assert request(srv, 'GET', '../outside.bin')[0] == 404
        etag = request(srv, 'HEAD', 'sub/x.bin')[1]['ETag']
        srv.put('sub/x.bin', BLOB[:100])
        status, headers, body = request(srv, 'GET', 'sub/x.bin')
        assert body == BLOB[:100] and headers['ETag'] != etag


def test_a_file_is_read_through_one_descriptor_closed_after_its_answer(
        tmp_path):
    # Bodies larger than a chunk, whole, in ranges, cut short by a fault
    # and answered with a 416: no descriptor is left open.
    big = bytes(range(256)) * 1024  # 256 KiB: 4 chunks
    (tmp_path / 'big.bin').write_bytes(big)
    (tmp_path / 'dir').mkdir()
    open_fds = lambda: len(os.listdir('/proc/self/fd'))  # noqa: E731
    with LoopbackHTTPServer(str(tmp_path), fault_rate=0.3,
                            fault_kinds=('truncated', )) as srv:
        before = open_fds()
        for start in range(1, 13):
            try:
                status, _, body = request(srv, 'GET', 'big.bin',
                                          {'Range': f'bytes={start}-'})
            except http.client.IncompleteRead:  # a truncated answer
                continue
            assert status == 206 and body == big[start:]
        assert request(srv, 'GET', 'big.bin',
                       {'Range': 'bytes=999999-'})[0] == 416
        assert request(srv, 'GET', 'dir')[0] == 404
        assert srv.stats().faults['truncated'] > 0
        time.sleep(0.2)  # the handler threads end their requests
        assert open_fds() <= before


def test_latency_is_added_per_request():
    with LoopbackHTTPServer({'a': b'1'}, latency=0.2) as srv:
        start = time.monotonic()
        request(srv, 'GET', 'a')
        request(srv, 'HEAD', 'a')
        assert time.monotonic() - start >= 0.4


def test_bandwidth_cap_is_shared_by_connections():
    # 2 x 256 KiB at 1 MiB/s less the 64 KiB burst: >= 0.43 s, however
    # the two connections interleave.
    data = {'a': b'a' * (256 << 10), 'b': b'b' * (256 << 10)}
    with LoopbackHTTPServer(data, bandwidth=1 << 20) as srv:
        results = {}
        threads = [
            threading.Thread(
                target=lambda p=p: results.update({p: request(srv, 'GET', p)}))
            for p in data
        ]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert time.monotonic() - start >= 0.42
        assert {p: r[2] for p, r in results.items()} == data


def test_faults_are_deterministic_and_of_each_kind():
    plan = FaultPlan(rate=0.3, seed=7)
    draws = [plan.draw('GET', f'k{i}', 0) for i in range(400)]
    again = [FaultPlan(rate=0.3, seed=7).draw('GET', f'k{i}', 0)
             for i in range(400)]
    other = [FaultPlan(rate=0.3, seed=8).draw('GET', f'k{i}', 0)
             for i in range(400)]
    assert draws == again and draws != other
    assert 80 <= sum(d is not None for d in draws) <= 160
    assert set(draws) == {None, '5xx', 'timeout', 'truncated'}
    # A retry (next attempt of the same path) draws again.
    assert [plan.draw('GET', 'k0', a) for a in range(50)].count(None) > 20


def test_injected_faults_on_the_wire():
    with LoopbackHTTPServer({'a': BLOB}, stall=1.0) as srv:
        srv.faults.script('a', ['5xx', 'truncated', 'timeout'])
        assert request(srv, 'GET', 'a')[0] in (500, 502, 503, 504)
        with pytest.raises(http.client.IncompleteRead):
            request(srv, 'GET', 'a')
        with pytest.raises(socket.timeout):
            request(srv, 'GET', 'a', timeout=0.3)
        assert request(srv, 'GET', 'a')[2] == BLOB
        stats = srv.stats()
        assert stats.faults == {'5xx': 1, 'truncated': 1, 'timeout': 1}
        assert stats.downloads == {'a': 1}


def test_required_headers_answer_401():
    with LoopbackHTTPServer({'a': b'1'},
                            required_headers={'Authorization': 'Bearer k'}) \
            as srv:
        assert request(srv, 'GET', 'a')[0] == 401
        assert request(srv, 'GET', 'a', {'Authorization': 'Bearer k'})[2] \
            == b'1'


def test_many_simultaneous_connections():
    # More clients than socketserver's default backlog of 5, all at once.
    with LoopbackHTTPServer({'a': b'x' * 1000}, latency=0.05) as srv:
        barrier = threading.Barrier(64)
        bodies = []

        def client():
            barrier.wait()
            bodies.append(request(srv, 'GET', 'a')[2])

        threads = [threading.Thread(target=client) for _ in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert bodies == [b'x' * 1000] * 64
        assert srv.stats().max_concurrent > 5


def test_stops_by_itself_and_on_exit():
    srv = LoopbackHTTPServer({'a': b'1'}, max_lifetime=0.3).start()
    port = srv.port
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=5)
    conn.request('GET', '/a')
    conn.getresponse().read()  # an idle keep-alive connection stays open
    # Polled, not slept: the server is gone once a connection is refused.
    deadline = time.monotonic() + 30
    with pytest.raises(ConnectionError):
        while time.monotonic() < deadline:
            request_port(port)
            time.sleep(0.05)
    conn.close()


def request_port(port):
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=2)
    try:
        conn.request('GET', '/a')
        conn.getresponse().read()
    finally:
        conn.close()


def test_command_line_serves_until_its_lifetime(tmp_path, capsys):
    from mmdata_plugin.testing.serve_loopback import main
    main([str(tmp_path), '--latency', '0.01', '--lifetime', '0.3'])
    assert capsys.readouterr().out.startswith('http://127.0.0.1:')
