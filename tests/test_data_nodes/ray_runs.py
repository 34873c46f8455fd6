"""Training runs of the data-node tests: :func:`monitor_helpers.train`
with the fast-resume loops, ``ResumeProbeHook`` recording what each rank
trained on (sample index and pixel digest per position), and optionally
``RayDataNodesHook``. :func:`train_ranks` is the body of each gloo rank.
"""
import json
import os
import os.path as osp
import sys

from monitor_helpers import train

# ResumeProbeHook lives with the fast-resume tests.
sys.path.append(osp.join(osp.dirname(osp.dirname(__file__)), 'test_engine'))
from resume_probe import ResumeProbeHook  # noqa: E402

from mmdata_plugin.engine import RayDataNodesHook  # noqa: E402

#: Actors on the data nodes only (the head has no ``data_node``).
ON_DATA_NODES = dict(num_cpus=0.5, resources=dict(data_node=0.5))
CHECKPOINT_EVERY_4 = dict(
    checkpoint=dict(type='CheckpointHook', interval=4, by_epoch=False))


def train_probed(work_dir, ray_hook=None, **kwargs):
    """A run recording ``probe_rank{r}.jsonl``, its batches made by Ray
    actors when ``ray_hook`` (RayDataNodesHook arguments) is given."""
    hooks = [dict(type=ResumeProbeHook)]
    if ray_hook is not None:
        hooks.append(dict(type='RayDataNodesHook', **ray_hook))
    return train(work_dir, monitor=False, custom_hooks=hooks,
                 default_hooks=CHECKPOINT_EVERY_4, **kwargs)


def alive(pid: int) -> bool:
    """Whether process ``pid`` (an actor's, a worker's) still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def ray_hook_of(runner) -> RayDataNodesHook:
    return next(h for h in runner.hooks if isinstance(h, RayDataNodesHook))


def train_ranks(rank, world_size, runs):
    """Each ``(work_dir, ray_hook, kwargs)`` of ``runs`` in turn, as one
    rank of a gloo group; a Ray-fed run also writes the pids of the actors
    that fed this rank to ``actors_rank{rank}.json``."""
    for work_dir, ray_hook, kwargs in runs:
        runner = train_probed(
            work_dir, ray_hook, launcher='pytorch',
            # CPU ranks: DDP without device ids.
            cfg=dict(model_wrapper_cfg=dict(
                type='MMDistributedDataParallel', device_ids=None)),
            **kwargs)
        if ray_hook is not None:
            with open(osp.join(work_dir, f'actors_rank{rank}.json'),
                      'w') as f:
                json.dump(dict(rank_pid=os.getpid(), actor_pids=[
                    node.pid for node in ray_hook_of(runner).pool.nodes
                ]), f)
