"""Remote backends inside DataLoader workers: a client per process."""
import pytest
from mmengine import fileio
from torch.utils.data import DataLoader, Dataset

import mmdata_plugin.remote  # noqa: F401  (registers the backends)
from mmdata_plugin.testing import LoopbackHTTPServer

OBJECTS = {f'w/{i}.bin': bytes([i]) * (500 + i) for i in range(24)}
ARGS = dict(backend='remote_http', backoff=0.01)


class RemoteBytes(Dataset):
    """Reads through mmengine's per-process backend singleton."""

    def __init__(self, base_url):
        self.base_url = base_url

    def __len__(self):
        return len(OBJECTS)

    def __getitem__(self, i):
        return fileio.get(f'{self.base_url}w/{i}.bin', backend_args=ARGS)


@pytest.mark.parametrize('context', ['fork', 'spawn'])
def test_workers_read_through_their_own_connections(context):
    with LoopbackHTTPServer(OBJECTS) as srv:
        dataset = RemoteBytes(srv.base_url)
        # The parent opens a pooled connection first; a forked worker
        # inherits the singleton and must not reuse that socket.
        assert dataset[0] == OBJECTS['w/0.bin']
        # One spawned worker is enough to show the pickled backend arrives
        # without sockets; each spawned process costs seconds of imports.
        workers = 2 if context == 'fork' else 1
        loader = DataLoader(
            dataset,
            batch_size=4,
            num_workers=workers,
            multiprocessing_context=context,
            collate_fn=list)
        got = [item for batch in loader for item in batch]
        assert got == [OBJECTS[f'w/{i}.bin'] for i in range(len(OBJECTS))]
        # parent + one pool per worker; never one connection per request
        assert 1 + workers <= srv.stats().connections <= 1 + 2 * workers
