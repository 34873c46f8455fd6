"""Test-only components for training subprocesses of the node-cache tests.

Imported through ``custom_imports`` by the configs of
test_node_cache_recovery.py (its folder is put on PYTHONPATH).

* ``CacheProbeHook``: one JSON line per iteration and rank -- the sample
  indices of the batch and digests of the augmented inputs -- in
  ``<work_dir>/probe_rank{r}.jsonl``.
* ``RecordLoadedImage``: placed right after ``LoadImageFromFile``, one JSON
  line per image a DataLoader worker decoded -- its path and a digest of the
  decoded pixels -- in ``<out_dir>/loaded_<pid>.jsonl``. A test decodes the
  source file the same way: a partial file served by the cache gives other
  pixels (or a decoding error).
"""
import hashlib
import json
import os
import os.path as osp
import time

from mmcv.transforms import BaseTransform
from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, TRANSFORMS


def pixels_digest(img) -> str:
    digest = hashlib.sha1(repr((img.shape, str(img.dtype))).encode())
    digest.update(img.tobytes())
    return digest.hexdigest()


@HOOKS.register_module()
class CacheProbeHook(Hook):
    """What each rank trained on, per iteration.

    Args:
        delay (float): Seconds to sleep per iteration, so that a test can
            act (kill a process) while the run trains.
    """

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        record = dict(
            iter=runner.iter,
            rank=get_rank(),
            world_size=get_world_size(),
            index=[int(s.sample_idx) for s in data_batch['data_samples']],
            digest=[
                hashlib.sha1(img.cpu().numpy().tobytes()).hexdigest()
                for img in data_batch['inputs']
            ])
        path = osp.join(runner.work_dir, f'probe_rank{get_rank()}.jsonl')
        with open(path, 'a') as file:
            file.write(json.dumps(record) + '\n')
        time.sleep(self.delay)


@TRANSFORMS.register_module()
class RecordLoadedImage(BaseTransform):
    """Record ``(img_path, digest of the decoded pixels)`` of each sample.

    Args:
        out_dir (str): Folder of the per-process record files.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def transform(self, results: dict) -> dict:
        os.makedirs(self.out_dir, exist_ok=True)
        line = json.dumps(
            dict(path=str(results['img_path']),
                 digest=pixels_digest(results['img']))) + '\n'
        # One short O_APPEND write per line: lines of processes never mix.
        with open(osp.join(self.out_dir, f'loaded_{os.getpid()}.jsonl'),
                  'a') as file:
            file.write(line)
        return results
