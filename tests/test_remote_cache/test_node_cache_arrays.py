"""Raw arrays (.npy and headerless) read through the node cache."""
import io

import numpy as np

import mmdata_plugin  # noqa: F401  (registers the remote backends)
from mmdata_plugin.cache.node_store import NodeStore
from mmdata_plugin.remote_cache.node_cache_backend import NAMESPACE
from mmdata_plugin.testing import LoopbackHTTPServer
from mmdata_plugin.transforms import LoadNumpyFromFile


def npy_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def test_arrays_through_the_node_cache_are_exact_and_kept(tmp_path):
    volume = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    raw = (np.arange(12) * 5000).astype('>u2').reshape(3, 4)
    objects = {'volume.npy': npy_bytes(volume), 'raw.bin': raw.tobytes()}
    with LoopbackHTTPServer(objects) as server:
        server.faults.script('volume.npy', ['truncated', 'corrupt'])
        args = dict(backend='node_cache', cache_dir=str(tmp_path / 'cache'),
                    cache_limit='1MB', remote=dict(backend='remote_http',
                                                   backoff=0.01))
        npy = LoadNumpyFromFile(backend_args=args)
        headerless = LoadNumpyFromFile(dtype='>u2', shape=(3, -1),
                                       backend_args=args)
        for _ in range(2):
            out = npy(dict(img_path=server.url('volume.npy')))
            np.testing.assert_array_equal(out['img'].numpy(), volume)
            out = headerless(dict(img_path=server.url('raw.bin')))
            np.testing.assert_array_equal(out['img'].numpy(), raw)
        stats = server.stats()
    # The damaged bodies were downloaded again; the second reads were local.
    assert stats.downloads['raw.bin'] == 1
    assert stats.downloads['volume.npy'] == 2
    store = NodeStore(str(tmp_path / 'cache'), '1MB')
    assert store.counters(NAMESPACE)['corrupt'] == 1
