"""tools/train.py end to end on CPU: train, resume, AMP, 2 ranks."""
import copyreg
import glob
import os.path as osp
import shutil

import pytest
import torch
from helpers import DEMO_CONFIG, TRAIN_SCRIPT, quick_cfg_options
from hostile_checkpoints import write_hostile_checkpoint
from mmengine.logging import HistoryBuffer

from mmdata_plugin.testing import ProcessFailed, run_script, run_torchrun
from mmdata_plugin.utils import load_from_local_safely


def _train_args(work_dir, *extra, max_iters=6):
    return [
        DEMO_CONFIG, '--work-dir',
        str(work_dir), *extra, *quick_cfg_options(max_iters=max_iters)
    ]


def _train(work_dir, env, *extra, max_iters=6):
    return run_script(TRAIN_SCRIPT,
                      _train_args(work_dir, *extra, max_iters=max_iters),
                      env=env).stdout


@pytest.fixture(scope='module')
def trained_work_dir(tmp_path_factory, train_env):
    work_dir = tmp_path_factory.mktemp('train')
    out = _train(work_dir, train_env)
    assert 'Saving checkpoint at 6 iterations' in out
    return work_dir


def test_resume_latest_checkpoint(trained_work_dir, train_env):
    out = _train(trained_work_dir, train_env, '--resume', max_iters=9)
    assert 'Loads checkpoint by local_safely backend' in out
    assert 'resumed epoch: 0, iter: 6' in out
    assert osp.isfile(osp.join(trained_work_dir, 'iter_9.pth'))


def test_resume_given_checkpoint(trained_work_dir, train_env, tmp_path):
    ckpt = osp.join(trained_work_dir, 'iter_3.pth')
    out = _train(tmp_path, train_env, '--resume', ckpt)
    assert 'resumed epoch: 0, iter: 3' in out
    assert osp.isfile(osp.join(tmp_path, 'iter_6.pth'))


def _write_stock_checkpoint(ours, path):
    """Re-save a checkpoint the way stock mmengine pickles HistoryBuffer."""
    checkpoint = load_from_local_safely(ours, 'cpu')
    reducer = copyreg.dispatch_table.pop(HistoryBuffer)
    try:
        torch.save(checkpoint, path)
    finally:
        copyreg.dispatch_table[HistoryBuffer] = reducer


def test_stock_checkpoint_refused_unless_trusted(trained_work_dir, train_env,
                                                 tmp_path):
    stock = str(tmp_path / 'stock_iter_6.pth')
    _write_stock_checkpoint(osp.join(trained_work_dir, 'iter_6.pth'), stock)
    with pytest.raises(ProcessFailed) as refused:
        _train(tmp_path / 'refused', train_env, '--resume', stock,
               max_iters=7)
    message = str(refused.value)
    assert f'Refusing to load checkpoint "{stock}"' in message
    assert 'builtins.getattr' in message
    assert f'--trust-checkpoint {stock}' in message

    out = _train(tmp_path / 'trusted', train_env, '--resume', stock,
                 '--trust-checkpoint', stock, max_iters=7)
    assert 'resumed epoch: 0, iter: 6' in out


def test_resume_from_forged_numpy_data_is_refused(train_env, tmp_path):
    hostile = write_hostile_checkpoint('object_array_in_history_buffer',
                                       str(tmp_path / 'hostile.pth'))
    with pytest.raises(ProcessFailed) as refused:
        _train(tmp_path / 'work', train_env, '--resume', hostile,
               max_iters=2)
    message = str(refused.value)
    # Exit code 1 (the refusal), not -11 (SIGSEGV).
    assert 'failed with exit code 1:' in message
    assert f'Refusing to load checkpoint "{hostile}"' in message
    assert 'numpy data numpy itself never writes' in message


def _work_dir_with_truncated_latest(trained_work_dir, work_dir):
    work_dir.mkdir()
    for name in ('iter_3.pth', 'iter_6.pth'):
        shutil.copy(osp.join(trained_work_dir, name), work_dir / name)
    latest = work_dir / 'iter_6.pth'
    content = latest.read_bytes()
    latest.write_bytes(content[:len(content) // 2])
    (work_dir / 'last_checkpoint').write_text(str(latest))
    return str(latest)


def _log_file_text(work_dir):
    (log_file, ) = glob.glob(osp.join(work_dir, '*', '*.log'))
    with open(log_file) as f:
        return f.read()


def test_truncated_checkpoint_error_names_the_file(trained_work_dir,
                                                   train_env, tmp_path):
    truncated = _work_dir_with_truncated_latest(trained_work_dir,
                                                tmp_path / 'work')
    with pytest.raises(ProcessFailed) as failed:
        _train(tmp_path / 'other', train_env, '--resume', truncated,
               max_iters=7)
    assert f'Cannot read checkpoint "{truncated}"' in str(failed.value)


def test_auto_resume_falls_back_to_the_newest_readable_checkpoint(
        trained_work_dir, train_env, tmp_path):
    work_dir = tmp_path / 'work'
    truncated = _work_dir_with_truncated_latest(trained_work_dir, work_dir)
    out = _train(work_dir, train_env, '--resume', max_iters=7)
    warning = f'--resume: skipping unreadable checkpoint {truncated}'
    assert warning in out
    assert warning in _log_file_text(work_dir)
    assert (f'--resume: resuming from {work_dir / "iter_3.pth"}, the newest '
            'readable checkpoint.') in out
    assert 'resumed epoch: 0, iter: 3' in out


def test_auto_resume_without_checkpoint_and_amp_on_cpu(train_env, tmp_path):
    # Two flags that do not interact, on one run (a run costs ~10 s).
    out = _train(tmp_path, train_env, '--resume', '--amp', max_iters=2)
    message = (f'--resume: no readable checkpoint in {tmp_path}; training '
               'starts from scratch.')
    assert message in out
    assert message in _log_file_text(tmp_path)
    assert 'Saving checkpoint at 2 iterations' in out
    assert "type='CPUAutocastOptimWrapper'" in out
    assert osp.isfile(osp.join(tmp_path, 'iter_2.pth'))


def test_two_rank_torchrun_gloo(train_env, tmp_path):
    out = run_torchrun(
        TRAIN_SCRIPT,
        _train_args(tmp_path, '--launcher', 'pytorch', max_iters=4),
        env=train_env).stdout
    assert 'Distributed training: True' in out
    assert "backend='gloo'" in out
    assert 'Iter(train) [4/4]' in out
    assert osp.isfile(osp.join(tmp_path, 'iter_4.pth'))
