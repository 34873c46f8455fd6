"""A data node removed from the Ray cluster while its actors have batches
in production (``Cluster.remove_node``): nothing lost, nothing repeated,
the batches of local workers, and each actor it took is replaced and
logged.

The test has its own cluster (conftest.py's ``own_cluster``): after the
removal it has one data node left, which no other test sees.
"""
import glob
import os.path as osp

import pytest

pytest.importorskip(
    'ray', reason='Ray is not installed: pip install "mmdata_plugin[ray]" '
    '(the tests extra installs it)')

from mmengine.hooks import Hook  # noqa: E402
from monitor_helpers import train  # noqa: E402
from ray_runs import ray_hook_of  # noqa: E402

FAST_RESUME = dict(type='FastResumeIterBasedTrainLoop', max_iters=10)
# Half a data node's CPUs: Ray puts the two actors on one node or on both,
# and the survivor has room for the replacements either way.
ONE_CPU_EACH = dict(num_cpus=1, resources=dict(data_node=1))


def _parent_pid(pid: int) -> int:
    with open(f'/proc/{pid}/stat') as f:
        # 'pid (comm) state ppid ...'; comm may hold spaces.
        return int(f.read().rsplit(')', 1)[1].split()[1])


def _raylet_pid(node) -> int:
    return node.all_processes['raylet'][0].process.pid


class RemoveNodeAt(Hook):
    """Removes the data node of the first data actor after iteration
    ``at`` and notes which actor slots lived on it.

    Ray places actors as it likes (often all on one node): the node to
    remove is found from the actor's process, whose parent is its node's
    raylet, so that the removal always takes actors with it.
    """
    priority = 'VERY_LOW'

    def __init__(self, cluster, at: int) -> None:
        self.cluster = cluster
        self.at = at
        self.slots_on_node = None

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        if runner.iter + 1 != self.at:
            return
        parents = [_parent_pid(n.pid) for n in ray_hook_of(runner).pool.nodes]
        node = next(n for n in self.cluster.worker_nodes
                    if _raylet_pid(n) == parents[0])
        self.slots_on_node = [
            slot for slot, parent in enumerate(parents)
            if parent == _raylet_pid(node)
        ]
        self.cluster.remove_node(node)


def test_a_removed_data_node_loses_no_batch(own_cluster, tmp_path):
    # Samples slow enough (30 ms of I/O) that the actors have batches in
    # production when their node goes after iteration 3 (4 in flight);
    # the 3 batches not yet sent go round-robin to every actor's slot, so
    # each dead actor is found even if its results had all come back.
    expected = train(tmp_path / 'local', monitor=False,
                     train_cfg=FAST_RESUME).model.seen
    removal = RemoveNodeAt(own_cluster, at=3)
    runner = train(tmp_path / 'ray', monitor=False, train_cfg=FAST_RESUME,
                   io_ms=30, custom_hooks=[
                       dict(type='RayDataNodesHook', num_actors=2,
                            **ONE_CPU_EACH), removal
                   ])
    assert len(own_cluster.worker_nodes) == 1
    assert runner.model.seen == expected
    assert removal.slots_on_node
    assert ray_hook_of(runner).pool.replaced == len(removal.slots_on_node)
    with open(glob.glob(osp.join(runner.log_dir, '*.log'))[0]) as f:
        log = f.read()
    for slot in removal.slots_on_node:
        assert f'data actor {slot} died' in log
