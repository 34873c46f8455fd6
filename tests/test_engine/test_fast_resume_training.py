"""tools/train.py end to end: SIGKILL, 2 ranks, world-size changes.

The demo config (real JPEGs, random resize/crop/flip in 2 workers) with
``randomness.seed=None`` and ``diff_rank_seed=True``, the settings stock
mmengine cannot resume onto the same order.
"""
import os.path as osp

import pytest
from helpers import DEMO_CONFIG, REPO_ROOT, TRAIN_SCRIPT
from resume_probe import records, samples_by_position

from mmdata_plugin.testing import (kill_after_checkpoint, python_path,
                                   run_ranks, run_script, start_script)

BATCH = 4


@pytest.fixture(scope='module')
def probe_env(train_env):
    here = osp.dirname(osp.abspath(__file__))
    return dict(train_env, PYTHONPATH=python_path(REPO_ROOT, here))


def write_config(path, max_iters, interval=4, delay=0.0, **dataloader):
    dataloader = dict(
        dict(batch_size=BATCH, num_workers=2, persistent_workers=True),
        **dataloader)
    path.write_text(f"""
_base_ = [{DEMO_CONFIG!r}]
custom_imports = dict(
    imports=['mmdata_plugin', 'resume_probe'], allow_failed_imports=False)
custom_hooks = [dict(type='ResumeProbeHook', delay={delay})]
train_cfg = dict(max_iters={max_iters}, val_begin=10**6)
default_hooks = dict(
    checkpoint=dict(interval={interval}), logger=dict(interval=1))
train_dataloader = dict(**{dataloader!r})
randomness = dict(seed=None, diff_rank_seed=True)
""")
    return str(path)


def train_args(config, work_dir, *extra):
    return [config, '--work-dir', str(work_dir), *extra]


def same_iterations(resumed, reference):
    common = sorted(set(resumed) & set(reference))
    for it in common:
        assert resumed[it] == reference[it], f'iteration {it} differs'
    return common


@pytest.fixture(scope='module')
def killed_run(tmp_path_factory, probe_env):
    """One rank, killed (SIGKILL) while training after iter_8.pth."""
    tmp = tmp_path_factory.mktemp('killed')
    config = write_config(tmp / 'cfg.py', max_iters=40, interval=8,
                          delay=0.05)
    work_dir = tmp / 'work'
    with open(tmp / 'out.log', 'w') as out:
        code = kill_after_checkpoint(
            start_script(TRAIN_SCRIPT, train_args(config, work_dir),
                         out.name, env=probe_env, new_session=True),
            str(work_dir),
            'iter_8.pth',
            extra_delay=0.8)
    assert code == -9, (tmp / 'out.log').read_text()[-3000:]
    return tmp, work_dir


def test_sigkill_then_resume_replays_the_stream(killed_run, probe_env):
    tmp, killed = killed_run
    config = write_config(
        tmp / 'resume.py', max_iters=20, interval=8, num_workers=1,
        persistent_workers=False)
    work_dir = tmp / 'resumed'
    out = run_script(TRAIN_SCRIPT, [
        *train_args(config, work_dir, '--resume',
                    str(killed / 'iter_8.pth'))
    ],
                      env=probe_env).stdout
    assert ('Fast resume: skipped 8 batches (32 samples on all ranks) '
            'without loading any sample') in out
    resumed = records(work_dir)
    assert sorted(resumed) == list(range(8, 20))
    # The killed run trained past its checkpoint: those iterations are the
    # uninterrupted stream, augmented pixels and losses included.
    assert len(same_iterations(resumed, records(killed))) >= 1


@pytest.fixture(scope='module')
def two_rank_run(tmp_path_factory, probe_env):
    tmp = tmp_path_factory.mktemp('two_ranks')
    config = write_config(tmp / 'cfg.py', max_iters=12, num_workers=1)
    work_dir = tmp / 'work'
    run_ranks(
        TRAIN_SCRIPT,
        train_args(config, work_dir, '--launcher', 'pytorch'),
        env=probe_env)
    return tmp, work_dir


def test_two_ranks_resume_exactly(two_rank_run, probe_env):
    tmp, full = two_rank_run
    config = write_config(
        tmp / 'resume.py', max_iters=12, persistent_workers=False)
    work_dir = tmp / 'resumed'
    out = run_ranks(
        TRAIN_SCRIPT,
        train_args(config, work_dir, '--launcher', 'pytorch', '--resume',
                   str(full / 'iter_4.pth')),
        env=probe_env).stdout
    assert 'skipped 4 batches (32 samples on all ranks)' in out
    for rank in (0, 1):
        assert same_iterations(records(work_dir, rank),
                               records(full, rank)) == list(range(4, 12))


def test_world_size_2_to_1_continues_the_global_stream(
        two_rank_run, probe_env):
    tmp, full = two_rank_run
    config = write_config(tmp / 'one.py', max_iters=12)
    work_dir = tmp / 'one_rank'
    out = run_script(TRAIN_SCRIPT, [
        *train_args(config, work_dir, '--resume', str(full / 'iter_4.pth'))
    ],
                      env=probe_env).stdout
    assert 'world_size x batch_size changed from 2 x 4 to 1 x 4' in out
    reference = samples_by_position(full, 2, BATCH)
    before = {p: s for p, s in reference.items() if p < 32}
    after = samples_by_position(work_dir, 1, BATCH, first_iter=4, start=32)
    # No position lost or repeated, and each has the sample -- and the
    # augmented pixels -- the 2-rank run had there.
    assert sorted(before) + sorted(after) == list(range(64))
    assert after == {p: reference[p] for p in after}


def test_world_size_1_to_2_continues_the_global_stream(
        killed_run, probe_env):
    tmp, killed = killed_run
    config = write_config(tmp / 'two.py', max_iters=12, interval=8)
    work_dir = tmp / 'two_ranks'
    run_ranks(
        TRAIN_SCRIPT,
        train_args(config, work_dir, '--launcher', 'pytorch', '--resume',
                   str(killed / 'iter_8.pth')),
        env=probe_env)
    reference = samples_by_position(killed, 1, BATCH)
    after = samples_by_position(work_dir, 2, BATCH, first_iter=8, start=32)
    assert sorted(after) == list(range(32, 64))
    common = set(after) & set(reference)
    assert len(common) >= BATCH
    assert all(after[p] == reference[p] for p in common)
