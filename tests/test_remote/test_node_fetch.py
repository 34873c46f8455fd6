"""fetch_to_node: a remote file fetched once per node, size/ETag checked."""
import pytest

import mmdata_plugin  # noqa: F401  (registers the remote backends)
from mmdata_plugin.remote.node_fetch import fetch_to_node
from mmdata_plugin.testing import LoopbackHTTPServer


def test_fetched_once_then_refetched_when_changed(tmp_path):
    with LoopbackHTTPServer({'ann.txt': b'a 0\nb 1\n'}) as server:
        url, cache_dir = server.url('ann.txt'), str(tmp_path / 'files')
        path = fetch_to_node(url, cache_dir=cache_dir)
        assert open(path, 'rb').read() == b'a 0\nb 1\n'
        assert fetch_to_node(url, cache_dir=cache_dir) == path
        assert server.stats().downloads['ann.txt'] == 1
        server.put('ann.txt', b'a 0\nb 1\nc 2\n')
        changed = fetch_to_node(url, cache_dir=cache_dir)
        assert open(changed, 'rb').read() == b'a 0\nb 1\nc 2\n'


def test_a_file_larger_than_the_store_is_refused_before_download(tmp_path):
    with LoopbackHTTPServer({'big.txt': b'x' * 5000}) as server:
        url = server.url('big.txt')
        with pytest.raises(RuntimeError, match=r'big.txt \(5000 bytes\) is '
                           'larger than the node store'):
            fetch_to_node(url, cache_dir=str(tmp_path / 'f'),
                          cache_limit=1000)
        assert server.stats().get_requests == 0
