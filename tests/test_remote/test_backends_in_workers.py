"""Remote backends inside DataLoader workers: a client per process."""
import pytest
from mmengine import fileio
from torch.utils.data import DataLoader, Dataset

import mmdata_plugin.remote  # noqa: F401  (registers the backends)
from mmdata_plugin.testing import LoopbackHTTPServer, MotoS3Server

OBJECTS = {f'w/{i}.bin': bytes([i]) * (500 + i) for i in range(24)}


class RemoteBytes(Dataset):
    """Reads through mmengine's per-process backend singleton."""

    def __init__(self, base_url, backend_args):
        self.base_url = base_url
        self.backend_args = backend_args

    def __len__(self):
        return len(OBJECTS)

    def __getitem__(self, i):
        return fileio.get(
            f'{self.base_url}w/{i}.bin', backend_args=self.backend_args)


def read_all_in_workers(dataset, context, workers):
    # The parent reads first: a forked worker inherits the backend singleton
    # with its pooled connection, and must not reuse that socket.
    assert dataset[0] == OBJECTS['w/0.bin']
    loader = DataLoader(
        dataset,
        batch_size=4,
        num_workers=workers,
        multiprocessing_context=context,
        collate_fn=list)
    got = [item for batch in loader for item in batch]
    assert got == [OBJECTS[f'w/{i}.bin'] for i in range(len(OBJECTS))]


@pytest.mark.parametrize('context', ['fork', 'spawn'])
def test_http_workers_read_through_their_own_connections(context):
    # One spawned worker is enough to show the pickled backend arrives
    # without sockets; each spawned process costs seconds of imports.
    workers = 2 if context == 'fork' else 1
    with LoopbackHTTPServer(OBJECTS) as srv:
        dataset = RemoteBytes(
            srv.base_url, dict(backend='remote_http', backoff=0.01))
        read_all_in_workers(dataset, context, workers)
        # parent + one pool per worker; never one connection per request
        assert 1 + workers <= srv.stats().connections <= 1 + 2 * workers


def test_s3_forked_workers_build_their_own_clients():
    with MotoS3Server() as s3:
        s3.put_objects('bucket', OBJECTS)
        read_all_in_workers(
            RemoteBytes('s3://bucket/', s3.backend_args(backoff=0.01)),
            'fork', 2)
