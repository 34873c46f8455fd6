"""One "rank" of the concurrent-fill test: a DataLoader with 2 workers runs
every image through a CachedPipelineHead and writes what came out.

With ``kill_on_write=N``, a worker making the N-th entry write of its process
writes half of it and SIGKILLs itself (a crash mid-write).
"""
import hashlib
import json
import os
import signal

import torch
from mmengine.registry import TRANSFORMS
from torch.utils.data import DataLoader, Dataset

import mmdata_plugin  # noqa: F401
from mmdata_plugin.cache import node_store
from mmdata_plugin.utils.torch_internals import shutdown_workers

HEAD = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(96, 4096), keep_ratio=True),
]


def digest(results):
    return [
        hashlib.sha256(results['img'].tobytes()).hexdigest(),
        list(results['img_shape']),
        list(results['scale_factor'])
    ]


class Images(Dataset):

    def __init__(self, cache_dir, paths):
        self.paths = paths
        self.head = TRANSFORMS.build(
            dict(type='CachedPipelineHead', transforms=HEAD,
                 cache_dir=cache_dir, cache_limit='50MB'))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        return index, digest(
            self.head(dict(img_path=self.paths[index], sample_idx=index)))


def kill_on_nth_write(n):
    real_write = node_store._ReservedWriter.write
    calls = [0]

    def write(self, data):
        calls[0] += 1
        if calls[0] == n:
            real_write(self, bytes(data)[:len(data) // 2])
            self._file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real_write(self, data)

    node_store._ReservedWriter.write = write


def run_rank(cache_dir, out_path, paths, kill_on_write=None):
    """Run in a forked process (a rank); its workers fork from it."""
    if kill_on_write:
        kill_on_nth_write(kill_on_write)
    torch.manual_seed(0)
    loader = DataLoader(Images(cache_dir, paths), batch_size=None,
                        num_workers=2, shuffle=True,
                        multiprocessing_context='fork')
    batches = iter(loader)
    try:
        out = {int(index): value for index, value in batches}
    finally:
        # Stopped here, the other worker ends after the sample it is on
        # (torch's shutdown). Left to the exit of this process, it would be
        # terminated at any point, between publishing an entry and
        # counting it too.
        shutdown_workers(batches)
    with open(out_path, 'w') as file:
        json.dump(out, file)
