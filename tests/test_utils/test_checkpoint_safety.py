"""Checkpoints load with weights_only=True; malicious pickles are refused."""
import os
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint

import mmdata_plugin  # noqa: F401  (installs the safe loaders)
from mmdata_plugin.utils import (TRUSTED_CHECKPOINTS_ENV,
                                 UnsafeCheckpointError, trust_checkpoint)


class _RunsShellCommand:
    """A pickle payload that runs a command when unpickled."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command, )


class _UsesGetattrGadget:
    """The `builtins.getattr` gadget attackers chain to reach any callable.

    Harmless here (it resolves ``str.upper``), but it is exactly what stock
    mmengine checkpoints contain.
    """

    def __reduce__(self):
        return getattr, (str, 'upper')


@pytest.fixture(autouse=True)
def no_trusted_files(monkeypatch):
    monkeypatch.delenv(TRUSTED_CHECKPOINTS_ENV, raising=False)


def test_our_checkpoint_round_trips_message_hub(tmp_path):
    hub = MessageHub.get_instance('checkpoint_safety_test')
    hub.update_scalar('train/loss', 0.5)
    hub.update_scalar('train/loss', 0.25, count=2)
    hub.update_scalar('train/acc', 3)
    path = str(tmp_path / 'ckpt.pth')
    torch.save(
        dict(
            message_hub=hub.state_dict(),
            meta=dict(dataset_meta=dict(palette=np.arange(6).reshape(2, 3))),
            state_dict=dict(w=torch.ones(2))), path)
    # Nothing dangerous in the file: plain torch.load can check it alone.
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    assert 'builtins.getattr' not in unsafe

    loaded = _load_checkpoint(path, map_location='cpu')
    loss = loaded['message_hub']['log_scalars']['train/loss']
    assert isinstance(loss, HistoryBuffer)
    np.testing.assert_array_equal(loss.data[0], [0.5, 0.25])
    np.testing.assert_array_equal(loss.data[1], [1, 2])
    assert loss.mean() == hub.get_scalar('train/loss').mean()
    acc = loaded['message_hub']['log_scalars']['train/acc']
    assert acc.data[0].dtype == hub.get_scalar('train/acc').data[0].dtype
    np.testing.assert_array_equal(loaded['meta']['dataset_meta']['palette'],
                                  np.arange(6).reshape(2, 3))


def test_malicious_checkpoint_is_refused(tmp_path):
    marker = tmp_path / 'pwned'
    path = str(tmp_path / 'evil.pth')
    torch.save(
        dict(
            state_dict=dict(w=torch.ones(1)),
            meta=_RunsShellCommand(f'touch {marker}')), path)
    with pytest.raises(UnsafeCheckpointError) as error:
        CheckpointLoader.load_checkpoint(path, map_location='cpu')
    assert 'system' in str(error.value)
    assert not marker.exists()


def test_getattr_gadget_is_refused(tmp_path):
    path = str(tmp_path / 'gadget.pth')
    torch.save(dict(meta=_UsesGetattrGadget()), path)
    with pytest.raises(UnsafeCheckpointError, match='builtins.getattr'):
        CheckpointLoader.load_checkpoint(path)


def test_trusting_another_file_does_not_trust_this_one(tmp_path):
    path = str(tmp_path / 'gadget.pth')
    torch.save(dict(meta=_UsesGetattrGadget()), path)
    trust_checkpoint(str(tmp_path / 'other.pth'))
    with pytest.raises(UnsafeCheckpointError):
        CheckpointLoader.load_checkpoint(path)


def test_explicitly_trusted_file_loads(tmp_path):
    path = str(tmp_path / 'gadget.pth')
    torch.save(dict(meta=_UsesGetattrGadget()), path)
    trust_checkpoint(path)
    assert CheckpointLoader.load_checkpoint(path)['meta'] == str.upper


def test_missing_file_error(tmp_path):
    with pytest.raises(FileNotFoundError, match='missing.pth'):
        CheckpointLoader.load_checkpoint(str(tmp_path / 'missing.pth'))


def test_plain_weights_still_load(tmp_path):
    path = osp.join(tmp_path, 'weights.pth')
    torch.save(dict(state_dict=dict(w=torch.arange(3.))), path)
    loaded = CheckpointLoader.load_checkpoint(path)
    assert torch.equal(loaded['state_dict']['w'], torch.arange(3.))
