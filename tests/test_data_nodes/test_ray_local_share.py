"""RayDataNodesHook(local_workers=True): the train DataLoader's own workers
make a share of the batches and Ray actors the rest, on the loopback
cluster of conftest.py; the stream is bitwise the one of local workers
alone, in the batch sampler's order."""
import functools
import json
import os
import os.path as osp
import signal

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip(
    'ray', reason='Ray is not installed: pip install "mmdata_plugin[ray]" '
    '(the tests extra installs it)')

from monitor_helpers import (SleepyCollate, SleepyDataset,  # noqa: E402
                             SlowSample, sleepy_pipeline, train)
from ray_runs import CHECKPOINT_EVERY_4, ON_DATA_NODES  # noqa: E402
from ray_runs import alive, ray_hook_of  # noqa: E402
from test_ray_sizing import _Monitor  # noqa: E402

from mmdata_plugin.data_monitor import (build_report,  # noqa: E402
                                        format_report)
from mmdata_plugin.data_monitor.statistics import StatsBook  # noqa: E402
from mmdata_plugin.data_nodes import (ActorPool, LocalShare,  # noqa: E402
                                      RayBatchStream)
from mmdata_plugin.engine.hooks.ray_data_nodes_hook import \
    _AutoSize  # noqa: E402

EPOCHS = dict(type='FastResumeEpochBasedTrainLoop', max_epochs=2)
MIXED = dict(type='RayDataNodesHook', num_actors=1, local_workers=True,
             **ON_DATA_NODES)
MONITOR = dict(type='DataMonitorHook', warmup_iters=1, settle_iters=0,
               table_interval=0)
SLOW_SAMPLE = 5


def _train_epochs(work_dir, hooks=(), **kwargs):
    """Two epochs of 12 iterations (24 samples, DefaultSampler shuffled),
    two local workers (persistent unless told), a checkpoint every 4.

    One sample takes a second: the local worker making its batch finishes
    the other worker's later batches first, so the order of the local
    share's batches comes from its ``in_order=True`` alone."""
    pipeline = sleepy_pipeline((0.5, 0.5), 8)
    pipeline.insert(1, SlowSample(index=SLOW_SAMPLE, ms=1000))
    dataset = SleepyDataset(num=24, pipeline=pipeline)
    return train(work_dir, monitor=False, loop='epoch', train_cfg=EPOCHS,
                 dataset=dataset, custom_hooks=list(hooks),
                 default_hooks=CHECKPOINT_EVERY_4, **kwargs)


def test_local_workers_and_actors_give_the_local_stream_and_resume(
        cluster, tmp_path):
    local = _train_epochs(tmp_path / 'local').model.seen
    assert len(local) == 24
    runner = _train_epochs(tmp_path / 'mixed', [MONITOR, MIXED])
    # Sample indices, augmented pixels and labels, step by step.
    assert runner.model.seen == local
    with open(osp.join(runner.log_dir, 'data_monitor.json')) as f:
        report = json.load(f)
    nodes = report['context']['data_nodes']
    # 4 local batches in flight (2 workers x prefetch_factor 2) beside the
    # actor's 2: the local workers make 2 of 3 batches.
    assert nodes['local_workers'] == 2
    assert nodes['batches_made'] == dict(local=16, actors=8)
    # The monitor lists both: the local workers (0, 1), then the actor.
    workers = report['ranks'][0]['workers']
    actor_pids = [node.pid for node in ray_hook_of(runner).pool.nodes]
    assert [(w['worker'], 'nodes' in w) for w in workers] == [(0, False),
                                                              (1, False),
                                                              (2, True)]
    assert workers[2]['pids'] == actor_pids
    local_pids = workers[0]['pids'] + workers[1]['pids']
    assert not set(local_pids) & set(actor_pids)
    # The report's tables (and the plot) show both.
    text = format_report(report)
    assert 'Per worker (rank 0' in text and 'Per data actor' in text
    assert osp.getsize(osp.join(runner.log_dir, 'data_monitor.png')) > 0
    # after_run stopped the persistent local workers.
    assert not any(map(alive, local_pids))

    # Iteration 4 is mid-epoch 0; resumed with workers that are not
    # persistent (each epoch's end stops them), and block_collate's blocks
    # from both sides through DeviceFeedHook (the model sees the batches
    # of pseudo_collate).
    resumed = _train_epochs(tmp_path / 'mixed', [MIXED], persistent=False,
                            collate=dict(type='block_collate',
                                         stack_inputs=False),
                            feed=True, resume=True,
                            load_from=str(tmp_path / 'mixed' / 'iter_4.pth'))
    assert resumed.model.seen == local[4:]
    made = ray_hook_of(resumed)._nodes.made
    assert made['local'] > 0 and made['actors'] > 0


def test_a_stock_epoch_loop_keeps_its_order_and_random_stream(
        cluster, tmp_path):
    # mmengine's EpochBasedTrainLoop: no per-sample seeds (no random
    # crop), and iter(loader) draws the workers' base seed from the global
    # generator; the mixed stream's local iterator draws it (once: the
    # workers are persistent), not the hook as well.
    stock = dict(loop='epoch', crop=None, max_iters=12, monitor=False)
    expected = train(tmp_path / 'local', **stock).model.seen
    rng = torch.get_rng_state()
    runner = train(tmp_path / 'mixed', custom_hooks=[MIXED], **stock)
    assert runner.model.seen == expected
    assert torch.equal(torch.get_rng_state(), rng)


def test_local_workers_need_num_workers(tmp_path):
    with pytest.raises(ValueError, match=r'local_workers=True .* '
                       r'num_workers=0: set train_dataloader\.num_workers'):
        _train_epochs(tmp_path, [MIXED], num_workers=0)


def _record_pid(folder, worker_id: int) -> None:
    with open(osp.join(folder, f'{os.getpid()}'), 'w'):
        pass


def _batch(k: int) -> list:
    return [(4 * k + j) % 64 for j in range(4)]


def test_an_actor_dies_while_local_batches_are_outstanding(
        cluster, tmp_path):
    dataset = TensorDataset(torch.arange(64))
    # Only its settings count: the stream's batch sampler gives the order.
    loader = DataLoader(dataset, num_workers=2, collate_fn=SleepyCollate(30),
                        multiprocessing_context='fork',
                        worker_init_fn=functools.partial(
                            _record_pid, str(tmp_path)))
    pool = ActorPool(dataset, SleepyCollate(30), 1, ON_DATA_NODES, seed=0)
    local = LocalShare(loader)
    try:
        stream = RayBatchStream(map(_batch, range(20)), pool, None, False,
                                local=local)
        got = [next(stream) for _ in range(5)]
        killed = pool.nodes[0].pid
        os.kill(killed, signal.SIGKILL)
        got += list(stream)
        # The pool reports the replacement, not the dead actor.
        now = pool.nodes[0].pid
        assert now != killed and alive(now)
    finally:
        pool.close()
        local.close()
    assert [[int(i) for i in batch[0]] for batch in got] == [
        _batch(k) for k in range(20)
    ]
    assert pool.replaced == 1
    assert stream.made['local'] > 0 and stream.made['actors'] > 0
    # The workers ran the loader's worker_init_fn, and the end of the pass
    # stopped them (they are not persistent).
    pids = [int(name) for name in os.listdir(tmp_path)]
    assert len(pids) == 2 and not any(map(alive, pids))


def _wait_until_dead(actors, timeout=60.0):
    """Until Ray reports each of ``actors`` dead (a call on it fails), so
    that both deaths are known before the stream's next batch."""
    ray = pytest.importorskip('ray')
    for actor in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.report.remote(), timeout=timeout)


def test_actors_that_died_together_are_replaced_together(cluster):
    # Two actors killed at once (as a removed node takes its actors): the
    # first death found replaces both, whichever batch is due, so their
    # replacements start together, not one after the other.
    dataset = TensorDataset(torch.arange(64))
    pool = ActorPool(dataset, SleepyCollate(200), 2, ON_DATA_NODES, seed=0)
    try:
        stream = RayBatchStream(map(_batch, range(12)), pool, None, False)
        got = [next(stream)]
        for node in pool.nodes:
            os.kill(node.pid, signal.SIGKILL)
        _wait_until_dead(pool._actors)
        while not pool.replaced:
            got.append(next(stream))
        assert pool.replaced == 2
        got += list(stream)
    finally:
        pool.close()
    assert [[int(i) for i in batch[0]] for batch in got] == [
        _batch(k) for k in range(12)
    ]


def _mixed_report(local_workers: int) -> dict:
    """40 steps of batches made in 100 ms each, in turn by local workers
    0 and 1 and by an actor (worker 2) on one data node; 30 ms steps,
    each batch 45 ms late."""
    book, clock = StatsBook(), 0.0
    for step in range(40):
        worker = step % 3
        record = dict(pid=7 + worker, worker=worker, samples=32,
                      start=clock, end=clock + 0.1, cpu=0.05, timed=False)
        if worker == 2:
            record.update(node='n' * 56, ip='10.0.0.2', host='data-2',
                          bytes=1_000_000)
        requested = clock + 0.1 - 0.045
        book.add(0.048, 0.030, record, requested, requested + 0.048)
        clock = requested + 1.0
    summary = dict(book.summary(), rank=0, skipped=0, timeline=[],
                   pipelines=[], startup=dict(count=1, wait=book.wait
                                              .describe()))
    summary['context'] = dict(
        num_workers=2, cpus=2, dataset_type='SleepyDataset', batch_size=32,
        pin_memory=False, data_nodes=dict(
        num_actors=1, min_actors=None, max_actors=None, max_inflight=None,
        actors=1, local_workers=local_workers, resizes=[]))
    return build_report([summary])


def test_the_report_and_the_sizing_count_the_local_workers():
    report = _mixed_report(local_workers=2)
    rank = report['ranks'][0]
    assert [(w['worker'], 'nodes' in w) for w in rank['workers']] == [
        (0, False), (1, False), (2, True)]
    # Per data node: the actor's batches only.
    assert [n['batches'] for n in rank['nodes']] == [13]
    # ceil(100 / 30) = 4 producers keep up: 2 local workers and 2 actors.
    assert report['verdict']['actors_needed'] == 2
    advice = {a['topic']: a['text'] for a in report['advice']}
    assert advice['actors'].startswith(
        'Raise num_actors from 1 to 2: a batch takes 100.0 ms of one actor '
        'or local worker')
    text = format_report(report)
    assert 'Per worker (rank 0' in text and 'Per data actor' in text
    assert _mixed_report(local_workers=0)['verdict']['actors_needed'] == 4
    monitor = _Monitor()
    sizing = _AutoSize(monitor, 1, 6, 5, local_workers=2)
    for _ in range(5):
        monitor.total.add(0.02, 0.01, dict(
            pid=1, worker=0, samples=2, start=0.0, end=0.04, cpu=0.0,
            timed=False), 1.0, 1.0)
    # Waiting, ceil(40 / 10) = 4 producers needed, 2 of them local.
    assert sizing.wanted(1)[0] == 2
