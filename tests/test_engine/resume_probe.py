"""Test-only hook for training subprocesses: what each rank trained on.

Imported through ``custom_imports`` by the configs of
test_fast_resume_training.py (its folder is put on PYTHONPATH).
"""
import hashlib
import json
import os.path as osp
import time

from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class ResumeProbeHook(Hook):
    """Appends one JSON line per iteration to ``probe_rank{r}.jsonl``.

    Args:
        delay (float): Seconds to sleep per iteration, so that a run can be
            killed while it is still training.
    """

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        samples = data_batch['data_samples']
        record = dict(
            iter=runner.iter,
            rank=get_rank(),
            world_size=get_world_size(),
            index=[int(s.sample_idx) for s in samples],
            digest=[
                hashlib.sha1(img.numpy().tobytes()).hexdigest()
                for img in data_batch['inputs']
            ],
            loss=outputs['loss'].item())
        path = osp.join(runner.work_dir, f'probe_rank{get_rank()}.jsonl')
        with open(path, 'a') as f:
            f.write(json.dumps(record) + '\n')
        time.sleep(self.delay)


def records(work_dir, rank=0):
    """``{iteration: record}`` the probe wrote for one rank."""
    with open(osp.join(work_dir, f'probe_rank{rank}.jsonl')) as f:
        return {r['iter']: r for r in map(json.loads, f)}


def samples_by_position(work_dir, world_size, batch_size, first_iter=0,
                        start=0):
    """``{global position: [index, digest]}`` in mmengine's rank layout
    (rank r of W trains positions r, r + W, ...; the run's first recorded
    iteration, ``first_iter``, starts at position ``start``)."""
    out = {}
    for rank in range(world_size):
        for it, record in records(work_dir, rank).items():
            for slot, sample in enumerate(
                    zip(record['index'], record['digest'])):
                local = (it - first_iter) * batch_size + slot
                out[start + local * world_size + rank] = list(sample)
    return out
