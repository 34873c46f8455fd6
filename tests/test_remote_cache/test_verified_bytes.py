"""Bytes that fail their checksum are never served or kept."""
import numpy as np
import pytest

import mmdata_plugin  # noqa: F401  (registers the remote backends)
from mmdata_plugin.remote import HTTPRemoteBackend, RemoteCorruptError
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


def _flip_first_body(backend):
    """Damage the first body ``backend`` receives, past botocore's own
    checksum (as a broken proxy or NIC would before it, had it one)."""
    opened, flipped = backend._open, []

    def damaged_open(url, span):
        body = opened(url, span)
        if flipped:
            return body
        flipped.append(url)
        chunks = body.chunks

        def flip():
            first = bytearray(next(chunks))
            first[0] ^= 0xFF
            yield bytes(first)
            yield from chunks

        body.chunks = flip()
        return body

    backend._open = damaged_open


def test_s3_bodies_are_checked_by_their_etag(tmp_path):
    from mmdata_plugin.testing import MotoS3Server
    with MotoS3Server() as server:
        server.put_objects('bucket', {'obj.bin': DATA})
        args = server.backend_args(backoff=0.01)
        backend = NodeCacheBackend(str(tmp_path / 'cache'), '1MB',
                                   remote=args)
        url = 's3://bucket/obj.bin'
        _flip_first_body(backend.reader.remote(url))
        assert backend.get(url) == DATA
    assert backend.store.counters(NAMESPACE)['corrupt'] == 1


def test_s3_checksum_errors_are_corrupt_bodies():
    import botocore.exceptions as boto_errors

    from mmdata_plugin.remote.s3_backend import _classify
    error = _classify('s3://b/k', boto_errors.FlexibleChecksumError(
        error_msg='Expected checksum x did not match calculated checksum y'))
    assert isinstance(error, RemoteCorruptError) and 's3://b/k' in str(error)
