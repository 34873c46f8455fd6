"""Bytes that fail their checksum are never served or kept."""
import numpy as np
import pytest

import mmdata_plugin  # noqa: F401  (registers the remote backends)
from mmdata_plugin.remote import (HTTPRemoteBackend, RemoteCorruptError,
                                  RetryableError)
from mmdata_plugin.remote_cache.node_cache_backend import (NAMESPACE,
                                                           NodeCacheBackend)
from mmdata_plugin.testing import LoopbackHTTPServer

DATA = np.random.default_rng(0).bytes(150_000)


def node_cache(tmp_path):
    return NodeCacheBackend(str(tmp_path / 'cache'), '1MB',
                            remote=dict(backend='remote_http'))


def test_a_flipped_byte_is_downloaded_again(tmp_path):
    with LoopbackHTTPServer({'obj.bin': DATA}) as server:
        server.faults.script('obj.bin', ['corrupt'])
        backend = node_cache(tmp_path)
        assert backend.get(server.url('obj.bin')) == DATA
        assert server.stats().downloads['obj.bin'] == 2
        # The copy kept is the good one: read again from the cache.
        assert backend.get(server.url('obj.bin')) == DATA
        assert server.stats().downloads['obj.bin'] == 2
    assert backend.store.counters(NAMESPACE)['corrupt'] == 1


def test_bodies_that_always_fail_raise_and_keep_nothing(tmp_path):
    with LoopbackHTTPServer({'obj.bin': DATA}, fault_rate=1.0,
                            fault_kinds=('corrupt', )) as server:
        backend = node_cache(tmp_path)
        url = server.url('obj.bin')
        with pytest.raises(RemoteCorruptError, match=url) as error:
            backend.get(url)
        assert 'MD5' in str(error.value)
        assert backend.store.lookup(NAMESPACE, url) is None
        assert backend.store.usage()[:2] == (0, 0)
    assert backend.store.counters(NAMESPACE)['corrupt'] == 3


def test_the_plain_backend_downloads_a_corrupt_body_again():
    with LoopbackHTTPServer({'obj.bin': DATA}) as server:
        server.faults.script('obj.bin', ['corrupt', 'truncated'])
        backend = HTTPRemoteBackend()
        # A cut body resumed by a range read is checked as a whole.
        assert backend.get(server.url('obj.bin')) == DATA
        assert backend.corrupt_bodies == 1


def test_an_etag_that_is_no_md5_checks_only_the_length(tmp_path):
    # A directory served with "<size>-<mtime>" ETags (like nginx): what is
    # not verified, the docs say.
    root = tmp_path / 'root'
    root.mkdir()
    (root / 'obj.bin').write_bytes(DATA)
    with LoopbackHTTPServer(str(root)) as server:
        server.faults.script('obj.bin', ['corrupt'])
        got = HTTPRemoteBackend().get(server.url('obj.bin'))
    assert len(got) == len(DATA) and got != DATA


def _script_faults(backend, kinds):
    """Make ``backend``'s next answers fail as S3 answers fail, one kind
    each (moto injects none): a 5xx, a body cut short, a flipped byte
    (past botocore's own checksum, as a broken proxy would)."""
    opened, kinds = backend._open, list(kinds)

    def faulty_open(url, span):
        kind = kinds.pop(0) if kinds else None
        if kind == '5xx':
            raise RetryableError('S3 InternalError (HTTP 500)')
        body = opened(url, span)
        chunks = body.chunks

        def cut():
            first = next(chunks)
            yield first[:len(first) // 2]
            raise RetryableError('connection broken')

        def flip():
            first = bytearray(next(chunks))
            first[0] ^= 0xFF
            yield bytes(first)
            yield from chunks

        if kind == 'truncated':
            body.chunks = cut()
        elif kind == 'corrupt':
            body.chunks = flip()
        return body

    backend._open = faulty_open


def test_s3_faults_through_the_node_cache(tmp_path):
    from mmdata_plugin.testing import MotoS3Server
    with MotoS3Server() as server:
        server.put_objects('bucket', {'obj.bin': DATA})
        args = server.backend_args(backoff=0.01)
        backend = NodeCacheBackend(str(tmp_path / 'cache'), '1MB',
                                   remote=args)
        url = 's3://bucket/obj.bin'
        remote = backend.reader.remote(url)
        _script_faults(remote, ['5xx', 'truncated', 'corrupt'])
        assert backend.get(url) == DATA
        # 5xx retried, the cut body resumed by a range read (damaged), the
        # whole object rejected by its ETag and downloaded again.
        assert remote.requests_made == 4
        assert backend.get(url) == DATA and remote.requests_made == 4
    assert backend.store.counters(NAMESPACE)['corrupt'] == 1


def test_s3_checksum_errors_are_corrupt_bodies():
    import botocore.exceptions as boto_errors

    from mmdata_plugin.remote.s3_backend import _classify
    error = _classify('s3://b/k', boto_errors.FlexibleChecksumError(
        error_msg='Expected checksum x did not match calculated checksum y'))
    assert isinstance(error, RemoteCorruptError) and 's3://b/k' in str(error)
