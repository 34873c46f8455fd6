"""A data node removed from the Ray cluster (``Cluster.remove_node``)
while its actors have batches in production, or made and waiting in its
object store: nothing lost, nothing repeated, the batches of local
workers, and each actor it took is replaced once and logged.

The test has its own cluster (conftest.py's ``own_cluster``): after the
removal it has one data node left, which no other test sees.
"""
import glob
import os.path as osp
import re
import time

import pytest

ray = pytest.importorskip(
    'ray', reason='Ray is not installed: pip install "mmdata_plugin[ray]" '
    '(the tests extra installs it)')

from mmcv.transforms import Resize  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402
from monitor_helpers import SleepyDataset, sleepy_pipeline  # noqa: E402
from monitor_helpers import train  # noqa: E402
from ray_runs import ray_hook_of  # noqa: E402

FAST_RESUME = dict(type='FastResumeIterBasedTrainLoop', max_iters=10)
# Half a data node's CPUs: Ray puts the two actors on one node or on both,
# and the survivor has room for the replacements either way.
ONE_CPU_EACH = dict(num_cpus=1, resources=dict(data_node=1))


def _node_ids(pids) -> list:
    """The Ray node id of each actor process of ``pids``, from the GCS's
    actor table (an actor's process is a fork of the warm interpreter,
    conftest.py: not a child of its node's raylet)."""
    node_of = {
        actor['Pid']: actor['Address']['NodeID']
        for actor in ray._private.state.actors().values()
        if actor['State'] == 'ALIVE'
    }
    return [node_of[pid] for pid in pids]


class RemoveNodeAt(Hook):
    """Removes the data node of the first data actor after iteration
    ``at`` (``pause`` seconds later) and notes which actor slots lived on
    it.

    Ray places actors as it likes (often all on one node): the node to
    remove is the one Ray reports for the actor, so that the removal
    always takes actors with it.
    """
    priority = 'VERY_LOW'

    def __init__(self, cluster, at: int, pause: float) -> None:
        self.cluster = cluster
        self.at = at
        self.pause = pause
        self.slots_on_node = None

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        if runner.iter + 1 != self.at:
            return
        time.sleep(self.pause)
        nodes = _node_ids(n.pid for n in ray_hook_of(runner).pool.nodes)
        node = next(n for n in self.cluster.worker_nodes
                    if n.node_id == nodes[0])
        self.slots_on_node = [
            slot for slot, node_id in enumerate(nodes)
            if node_id == node.node_id
        ]
        self.cluster.remove_node(node)


def _dataset(side):
    """The 24 samples of monitor_helpers.train, resized to ``side`` when
    given (a batch of two 160 x 160 images, 154 kB, is too big to come back
    inside Ray's reply: it waits in its node's object store)."""
    pipeline = sleepy_pipeline((0.5, 0.5), crop=None if side else 8)
    if side:
        pipeline.insert(-1, Resize(scale=(side, side)))
    return SleepyDataset(num=24, io_ms=30, pipeline=pipeline)


@pytest.mark.parametrize(
    'side,pause,lost',
    [
        # Removed while the actors produce (30 ms of I/O per sample, 4
        # batches in flight after iteration 3): their batches fail with
        # the actor's death.
        (None, 0.0, 'ActorDiedError'),
        # Removed once the batches in flight are made and wait in the
        # node's object store: they are lost with it.
        (160, 1.5, 'ObjectLostError'),
    ],
    ids=['producing', 'made'])
def test_a_removed_data_node_loses_no_batch(own_cluster, tmp_path, side,
                                            pause, lost):
    # The 3 batches not yet sent after iteration 3 go round-robin to every
    # actor's slot: each dead actor is found, whatever its batches' state.
    expected = train(tmp_path / 'local', monitor=False,
                     train_cfg=FAST_RESUME,
                     dataset=_dataset(side)).model.seen
    removal = RemoveNodeAt(own_cluster, at=3, pause=pause)
    runner = train(tmp_path / 'ray', monitor=False, train_cfg=FAST_RESUME,
                   dataset=_dataset(side), custom_hooks=[
                       dict(type='RayDataNodesHook', num_actors=2,
                            **ONE_CPU_EACH), removal
                   ])
    assert len(own_cluster.worker_nodes) == 1
    assert runner.model.seen == expected
    assert removal.slots_on_node
    assert ray_hook_of(runner).pool.replaced == len(removal.slots_on_node)
    with open(glob.glob(osp.join(runner.log_dir, '*.log'))[0]) as f:
        log = f.read()
    deaths = re.findall(r'data actor (\d+) died \((\w+)\)', log)
    assert sorted(int(slot) for slot, _ in deaths) == removal.slots_on_node
    # The first death found is that of a batch the node had (the window's
    # head may be the other actor's).
    assert issubclass(getattr(ray.exceptions, deaths[0][1]),
                      getattr(ray.exceptions, lost)), deaths
