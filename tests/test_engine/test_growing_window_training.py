"""GrowingWindowSampler in the fast-resume loops: in-process epoch-based
runs, and through tools/train.py 2 ranks (torchrun) with workers, an exact
resume mid-epoch, and a world-size change 2 -> 1.

The demo config with the sampler swapped: windows of 16, 24, 32, 32 ...
samples of the 64 demo images, so the checkpoint at iteration 4 (2 ranks,
batch 4) lies in the middle of epoch 1.
"""
import json
import os.path as osp

import numpy as np
import pytest
from fast_resume_toys import make_runner, recorder_of
from helpers import DEMO_CONFIG, REPO_ROOT, TRAIN_SCRIPT

from mmdata_plugin.sample_order import GrowingWindow
from mmdata_plugin.testing import python_path, run_ranks, run_script
from mmdata_plugin.utils.checkpoint_safety import load_from_local_safely

BATCH = 4
WINDOW = dict(initial=16, growth=8, capacity=32)
NUM_TRAIN = 64  # the demo set of tests/conftest.py


@pytest.mark.parametrize('checkpoint', ['iter_4.pth', 'iter_8.pth'])
def test_epoch_loop_resumes_mid_epoch_of_varying_length(tmp_path,
                                                        checkpoint):
    # 23 toy samples, windows of 6, 10, 14, 15: 2, 3, 4, 4 batches of 4, so
    # iter_4 is batch 2 of epoch 1 and iter_8 batch 3 of epoch 2.
    cfg = dict(type='FastResumeEpochBasedTrainLoop', max_epochs=4)
    sampler = dict(
        type='GrowingWindowSampler', initial=6, growth=4, capacity=15)

    def train(name, resume_from=None):
        work_dir = tmp_path / name
        work_dir.mkdir()
        runner = make_runner(
            work_dir, cfg, sampler=sampler, num_workers=2,
            resume_from=resume_from)
        runner.train()
        return recorder_of(runner), work_dir

    full, work_dir = train('full')
    assert len(full.iterations) == 2 + 3 + 4 + 4
    resumed, _ = train('resumed', str(work_dir / checkpoint))
    assert resumed.iterations == full.iterations[int(checkpoint[5:-4]):]


@pytest.fixture(scope='module')
def probe_env(train_env):
    here = osp.dirname(osp.abspath(__file__))
    return dict(train_env, PYTHONPATH=python_path(REPO_ROOT, here))


def write_config(path, max_iters, **dataloader):
    dataloader = dict(
        dict(
            batch_size=BATCH,
            num_workers=2,
            persistent_workers=True,
            sampler=dict(type='GrowingWindowSampler', **WINDOW)),
        **dataloader)
    path.write_text(f"""
_base_ = [{DEMO_CONFIG!r}]
custom_imports = dict(
    imports=['mmdata_plugin', 'resume_probe'], allow_failed_imports=False)
custom_hooks = [dict(type='ResumeProbeHook')]
train_cfg = dict(max_iters={max_iters}, val_begin=10**6)
default_hooks = dict(checkpoint=dict(interval=4), logger=dict(interval=1))
train_dataloader = dict(**{dataloader!r})
randomness = dict(seed=None, diff_rank_seed=True)
""")
    return str(path)


def records(work_dir, rank):
    with open(osp.join(work_dir, f'probe_rank{rank}.jsonl')) as f:
        return {r['iter']: r for r in map(json.loads, f)}


def stream_positions(window, world_size, rank, epoch, start):
    """(epoch, position) of each sample rank ``rank`` trains on, batch by
    batch, from global position ``start`` of ``epoch`` on."""
    while True:
        size = window.window_size(epoch)
        total = -(-size // world_size) * world_size
        positions = list(range(start + rank, total, world_size))
        for first in range(0, len(positions), BATCH):
            yield [(epoch, p) for p in positions[first:first + BATCH]]
        epoch, start = epoch + 1, 0


def trained(work_dir, window, world_size, first_iter, epoch, start):
    """``{(epoch, position): (index, digest)}`` over all ranks of a run,
    checking each index against the window's arithmetic."""
    out = {}
    for rank in range(world_size):
        runs = records(work_dir, rank)
        layout = stream_positions(window, world_size, rank, epoch, start)
        for it in range(first_iter, max(runs) + 1):
            record, places = runs[it], next(layout)
            expected = [
                int(window.ids(e, np.array([p % window.window_size(e)]))[0])
                for e, p in places
            ]
            assert record['index'] == expected, f'rank {rank} iter {it}'
            out.update(zip(places, zip(record['index'], record['digest'])))
    return out


def checkpoint_seed(path):
    meta = load_from_local_safely(str(path))['meta']
    return meta['data_position']['seed']


@pytest.fixture(scope='module')
def full_run(tmp_path_factory, probe_env):
    tmp = tmp_path_factory.mktemp('growing_window')
    config = write_config(tmp / 'cfg.py', max_iters=8, num_workers=1)
    work_dir = tmp / 'work'
    run_ranks(
        TRAIN_SCRIPT,
        [config, '--work-dir', str(work_dir), '--launcher', 'pytorch'],
        env=probe_env)
    window = GrowingWindow(NUM_TRAIN, seed=checkpoint_seed(
        work_dir / 'iter_4.pth'), **WINDOW)
    return tmp, work_dir, trained(work_dir, window, 2, 0, 0, 0), window


def test_two_ranks_train_on_the_growing_window(full_run):
    _, _, reference, window = full_run
    # Epochs 0 and 1 (2 + 3 batches of 2 x 4), 3 of epoch 2's 4 batches.
    assert len(reference) == 8 * 2 * BATCH
    for epoch in range(2):
        assert {p for e, p in reference if e == epoch} == set(
            range(window.window_size(epoch)))
        assert {index for (e, _), (index, _) in reference.items()
                if e == epoch} == set(window.window_ids(epoch).tolist())


def test_two_ranks_resume_mid_epoch_exactly(full_run, probe_env):
    tmp, full, reference, window = full_run
    config = write_config(
        tmp / 'resume.py', max_iters=8, persistent_workers=False)
    work_dir = tmp / 'resumed'
    out = run_ranks(
        TRAIN_SCRIPT,
        [config, '--work-dir', str(work_dir), '--launcher', 'pytorch',
         '--resume', str(full / 'iter_4.pth')],
        env=probe_env).stdout
    assert ('skipped 4 batches (32 samples on all ranks) without loading '
            'any sample') in out
    assert 'epoch 1, batch 2 of the epoch, global sample 16' in out
    resumed = trained(work_dir, window, 2, 4, 1, 16)
    # Same samples, same augmented pixels, at every position.
    assert resumed == {p: reference[p] for p in resumed}
    assert len(resumed) == 4 * 2 * BATCH


def test_world_size_2_to_1_continues_the_window_stream(full_run, probe_env):
    tmp, full, reference, window = full_run
    config = write_config(tmp / 'one.py', max_iters=8)
    work_dir = tmp / 'one_rank'
    out = run_script(TRAIN_SCRIPT, [
        config, '--work-dir',
        str(work_dir), '--resume',
        str(full / 'iter_4.pth')
    ],
                      env=probe_env).stdout
    assert 'world_size x batch_size changed from 2 x 4 to 1 x 4' in out
    resumed = trained(work_dir, window, 1, 4, 1, 16)
    # The rest of epoch 1 (8 samples), then epoch 2 from its start: no
    # position of the window lost or repeated, each with its sample and
    # its augmented pixels.
    assert sorted(p for e, p in resumed if e == 1) == list(range(16, 24))
    assert sorted(p for e, p in resumed if e == 2) == list(range(8))
    assert resumed == {p: reference[p] for p in resumed}
