"""NodeCacheBackend reads: what a missing object costs and says."""
import subprocess
import sys

import pytest

import mmdata_plugin  # noqa: F401  (registers the remote backends)
from mmdata_plugin.remote.errors import RemoteNotFoundError
from mmdata_plugin.remote_cache.node_cache_backend import NodeCacheBackend
from mmdata_plugin.testing import LoopbackHTTPServer


def test_a_missing_object_is_asked_for_once(tmp_path):
    with LoopbackHTTPServer({'a.bin': b'abc'}) as server:
        backend = NodeCacheBackend(str(tmp_path / 'cache'), '1MB',
                                   remote=dict(backend='remote_http'))
        url = server.url('missing.bin')
        with pytest.raises(RemoteNotFoundError, match=url):
            backend.get(url)
        # A 404 is the remote's answer, not a file evicted under the read.
        assert server.stats().requests_per_path['missing.bin'] == 1
        assert backend.get(server.url('a.bin')) == b'abc'


def test_a_copy_evicted_while_read_or_before_it_opens(tmp_path):
    from mmdata_plugin.remote_cache.node_cache_backend import NAMESPACE
    data = bytes(range(256)) * 40
    with LoopbackHTTPServer({'a.npy': data}) as server:
        backend = NodeCacheBackend(str(tmp_path / 'cache'), '1MB',
                                   remote=dict(backend='remote_http'))
        store, url = backend.store, server.url('a.npy')
        assert backend.get(url) == data
        # Evicted by another process while a transform reads it in place
        # (LoadNumpyFromFile memory-maps the local copy).
        with backend.get_local_path(url) as path:
            store.evict(NAMESPACE, url)
            with open(path, 'rb') as file:
                assert file.read() == data
            # a subprocess handed the path (an external decoder) reads it
            out = subprocess.run([sys.executable, '-c',
                                  f'print(len(open({path!r}, "rb").read()))'],
                                 stdout=subprocess.PIPE, text=True, check=True)
            assert out.stdout.strip() == str(len(data))
        # Evicted between the lookup and the open: downloaded again.
        lookup = store.lookup

        def evicted_after_lookup(namespace, key):
            found = lookup(namespace, key)
            store.evict(namespace, key)
            return found

        assert backend.get(url) == data  # on disk again
        store.lookup = evicted_after_lookup
        assert backend.get(url) == data
        assert server.stats().downloads['a.npy'] == 3
