"""NodeCacheBackend reads: what a missing object costs and says."""
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
