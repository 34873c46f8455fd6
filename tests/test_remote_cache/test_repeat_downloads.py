"""A file is downloaded once per plan decision, whatever its size hint."""
import threading

import numpy as np

import mmdata_plugin  # noqa: F401  (registers the remote backends)
from mmdata_plugin.cache.node_store import NodeStore
from mmdata_plugin.remote_cache.node_cache_backend import (NAMESPACE,
                                                           NodeCacheBackend,
                                                           RemoteReader)
from mmdata_plugin.testing import LoopbackHTTPServer


def test_a_download_that_outgrows_its_hint_waits_for_room(tmp_path):
    # The reproduction: the budget is full of files nobody may
    # evict (the policy yields nothing) until a timer frees one.
    data = np.random.default_rng(0).bytes(45_000)
    with LoopbackHTTPServer({'obj.jpg': data}) as server:
        cache_dir = str(tmp_path / 'cache')
        store = NodeStore(cache_dir, 100_000, eviction_policy=lambda n: ())
        store.publish_bytes(NAMESPACE, 'other', b'x' * 60_000)
        timer = threading.Timer(0.3, store.evict, (NAMESPACE, 'other'))
        timer.start()
        reader = RemoteReader(store, dict(backend='remote_http'))
        with reader.fetch(server.url('obj.jpg'), 30_000) as entry:
            assert entry.admitted
        timer.join()
        backend = NodeCacheBackend(cache_dir, 100_000,
                                   remote=dict(backend='remote_http'))
        assert backend.get(server.url('obj.jpg')) == data
        assert server.stats().requests_per_path['obj.jpg'] == 1

