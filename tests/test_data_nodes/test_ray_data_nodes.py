"""RayDataNodesHook on a real Ray cluster of three nodes on loopback.

One cluster (a head and two data nodes with a ``data_node`` resource,
``ray.cluster_utils.Cluster``, conftest.py) serves the modules of this
folder and is torn down at their end. The runs are those of
:func:`monitor_helpers.train` with the fast-resume loop (per-sample seeds,
a random crop): their batches, made by Ray actors, must equal bitwise
those of local DataLoader workers.
"""
import glob
import json
import os
import os.path as osp
import signal
import time

import pytest
import torch

pytest.importorskip(
    'ray', reason='Ray is not installed: pip install "mmdata_plugin[ray]" '
    '(the tests extra installs it)')

from mmengine.hooks import Hook  # noqa: E402
from monitor_helpers import train  # noqa: E402
from ray_runs import alive  # noqa: E402

from mmdata_plugin.data_nodes import NodeReport, check_node  # noqa: E402
from mmdata_plugin.engine import RayDataNodesHook  # noqa: E402

FAST_RESUME = dict(type='FastResumeIterBasedTrainLoop', max_iters=10)
CHECKPOINT_AT_5 = dict(
    checkpoint=dict(type='CheckpointHook', interval=5, by_epoch=False))
ON_DATA_NODES = dict(num_cpus=0.5, resources=dict(data_node=0.5))


def _train(work_dir, hook=None, more_hooks=(), **kwargs):
    hooks = ([dict(type='RayDataNodesHook', **hook)] if hook else [])
    return train(work_dir, monitor=False, train_cfg=FAST_RESUME,
                 custom_hooks=hooks + list(more_hooks), **kwargs)


@pytest.fixture(scope='module')
def local_batches(tmp_path_factory):
    """The batches of the run with two local DataLoader workers."""
    return _train(tmp_path_factory.mktemp('local')).model.seen


def _ray_hook(runner) -> RayDataNodesHook:
    return next(h for h in runner.hooks if isinstance(h, RayDataNodesHook))


@pytest.mark.compat
def test_one_actor_gives_the_batches_of_local_workers(
        cluster, local_batches, tmp_path):
    # block_collate's blocks reach DeviceFeedHook as blocks; the model sees
    # the batches of pseudo_collate (tests/test_engine/
    # test_device_feed_hook.py shows the two equal with local workers).
    runner = _train(tmp_path, dict(num_actors=1, **ON_DATA_NODES),
                    more_hooks=[dict(type='DeviceFeedHook')],
                    collate=dict(type='block_collate', stack_inputs=False))
    assert runner.model.seen == local_batches
    nodes = _ray_hook(runner).pool.nodes
    assert len(nodes) == 1 and nodes[0].pid != os.getpid()


def test_two_actors_and_a_resume_with_one_give_the_same_stream(
        cluster, local_batches, tmp_path):
    runner = _train(tmp_path, dict(num_actors=2, max_inflight=3,
                                   **ON_DATA_NODES),
                    default_hooks=CHECKPOINT_AT_5)
    assert runner.model.seen == local_batches
    # Changing the number of actors between runs changes nothing.
    resumed = _train(tmp_path, dict(num_actors=1, **ON_DATA_NODES),
                     default_hooks=CHECKPOINT_AT_5, resume=True,
                     load_from=str(tmp_path / 'iter_5.pth'))
    assert resumed.model.seen == local_batches[5:]


def test_a_stock_loop_keeps_the_order_its_early_iterator_had(
        cluster, tmp_path):
    # IterBasedTrainLoop starts its iterator (and workers, which prefetch
    # from the InfiniteSampler's one generator) before any hook: the Ray
    # stream must start the same pass. No random crop: stock loops do not
    # seed samples.
    stock = dict(loop='iter', crop=None, max_iters=4, monitor=False)
    expected = train(tmp_path / 'local', num_workers=0, **stock).model.seen
    runner = train(tmp_path / 'ray', custom_hooks=[
        dict(type='RayDataNodesHook', num_actors=1, **ON_DATA_NODES)
    ], **stock)
    assert runner.model.seen == expected


@pytest.mark.parametrize('local_workers', [False, True])
def test_the_monitor_sees_a_stream_the_stock_loop_started_early(
        cluster, tmp_path, local_workers):
    # IterBasedTrainLoop starts its iterator before any hook; this hook
    # restarts it as a Ray stream, then DataMonitorHook (after it) must
    # restart that stream too, or it never sees a batch (and a local
    # share's workers would run the untimed pipeline).
    runner = train(tmp_path, loop='iter', crop=None, max_iters=8,
                   hook=dict(warmup_iters=0, settle_iters=0),
                   custom_hooks=[dict(type='RayDataNodesHook', num_actors=1,
                                      local_workers=local_workers,
                                      **ON_DATA_NODES)])
    with open(osp.join(runner.log_dir, 'data_monitor.json')) as f:
        workers = json.load(f)['ranks'][0]['workers']
    actors = [w for w in workers if 'nodes' in w]
    assert len(actors) == 1 and actors[0]['batches'] > 0
    local = [w for w in workers if 'nodes' not in w]
    assert len(local) == (2 if local_workers else 0)
    for worker in local:
        assert worker['batches'] > 0 and worker['stages'], worker


@pytest.mark.parametrize('persistent', [True, False])
def test_a_stock_epoch_loop_keeps_the_random_stream_of_local_workers(
        cluster, tmp_path, persistent):
    # iter(loader) draws the workers' base seed from the global generator:
    # at each epoch, or only at the first with persistent workers. The Ray
    # stream draws as that loader would, so the training process's random
    # stream (dropout, batch augmentations) is that of local workers.
    stock = dict(loop='epoch', crop=None, max_iters=24, monitor=False,
                 persistent=persistent)
    expected = train(tmp_path / 'local', **stock).model.seen
    after_local = torch.get_rng_state()
    runner = train(tmp_path / 'ray', custom_hooks=[
        dict(type='RayDataNodesHook', num_actors=1, **ON_DATA_NODES)
    ], **stock)
    assert runner.train_loop.epoch == 2
    assert runner.model.seen == expected
    assert torch.equal(torch.get_rng_state(), after_local)


class KillActorAt(Hook):
    """kill -9 the first data actor's process after iteration ``at``."""
    priority = 'VERY_LOW'

    def __init__(self, at: int) -> None:
        self.at = at

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        if runner.iter + 1 == self.at:
            os.kill(_ray_hook(runner).pool.nodes[0].pid, signal.SIGKILL)


def test_a_killed_actor_loses_no_batch(cluster, local_batches, tmp_path):
    # Samples slow enough (30 ms of I/O) that the killed actor has batches
    # in production.
    runner = _train(tmp_path, dict(num_actors=2, **ON_DATA_NODES),
                    more_hooks=[KillActorAt(3)], io_ms=30)
    assert runner.model.seen == local_batches
    assert _ray_hook(runner).pool.replaced >= 1
    with open(glob.glob(osp.join(runner.log_dir, '*.log'))[0]) as f:
        assert 'data actor 0 died' in f.read()


def test_a_dataset_missing_on_the_data_nodes_is_named(cluster, tmp_path):
    with open(tmp_path / 'train.txt', 'w') as f:
        f.write('images/0.png 0\nimages/1.png 1\n')
    dataset = dict(
        type='ImageListDataset', data_root=str(tmp_path),
        ann_file='train.txt',
        pipeline=[dict(type='LoadImageFromFile'),
                  dict(type='PackImageLabelInputs')])
    with pytest.raises(RuntimeError) as error:
        _train(tmp_path, dict(num_actors=1, **ON_DATA_NODES),
               dataset=dataset)
    message = str(error.value)
    assert 'data node' in message and '(127.0.0.1)' in message
    assert 'cannot load sample 0' in message
    assert str(tmp_path / 'images' / '0.png') in message


def test_a_version_mismatch_is_named():
    report = NodeReport('data-7', '10.0.0.7', 4242, '0.0.1', None)
    with pytest.raises(RuntimeError,
                       match=r'data node data-7 \(10\.0\.0\.7\) runs '
                       r'mmdata_plugin 0\.0\.1'):
        check_node(report)


def test_an_unreachable_cluster_is_named(tmp_path):
    with pytest.raises(ConnectionError, match=r"address='127\.0\.0\.1:1'"):
        _train(tmp_path, dict(address='127.0.0.1:1'))


class RaiseAt(Hook):
    """Training raises after iteration ``at``; the data actors' pids are
    kept in ``pids`` first."""
    priority = 'VERY_LOW'

    def __init__(self, at: int, pids: list) -> None:
        self.at, self.pids = at, pids

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        if runner.iter + 1 == self.at:
            self.pids.extend(node.pid for node in _ray_hook(runner).pool.nodes)
            raise RuntimeError('the model diverged')


def test_the_next_run_closes_the_actors_a_raising_run_left(
        cluster, local_batches, tmp_path):
    # mmengine calls no hook when training raises: the first run's actors
    # live on while its runner is referenced (here by the exception info,
    # as by a notebook's last traceback).
    pids = []
    with pytest.raises(RuntimeError, match='the model diverged') as raised:
        _train(tmp_path / 'raised', dict(num_actors=2, **ON_DATA_NODES),
               more_hooks=[RaiseAt(3, pids)])
    assert len(pids) == 2 and all(map(alive, pids))
    runner = _train(tmp_path / 'next', dict(num_actors=1, **ON_DATA_NODES))
    assert runner.model.seen == local_batches
    deadline = time.monotonic() + 30
    while any(map(alive, pids)):
        assert time.monotonic() < deadline, 'the raised run\'s actors live'
        time.sleep(0.1)
    with open(glob.glob(osp.join(runner.log_dir, '*.log'))[0]) as f:
        assert 'closing the 2 data actor(s) a run in this process left' in (
            f.read())
    del raised
