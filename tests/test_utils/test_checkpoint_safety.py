"""Checkpoints load with weights_only=True; malicious pickles are refused."""
import io
import os
import os.path as osp
import pickle
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch
from hostile_checkpoints import (ALLOCATING_ENTRIES, HOSTILE_PAYLOADS,
                                 RunsShellCommand, UsesGetattrGadget,
                                 history_buffers_sharing_one_list,
                                 nested_tuples, write_checkpoint_with_entry,
                                 write_edited_pickle_checkpoint,
                                 write_hostile_checkpoint)
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint

import mmdata_plugin  # noqa: F401  (installs the safe loaders)
from mmdata_plugin.utils import (TRUSTED_CHECKPOINTS_ENV,
                                 UnreadableCheckpointError,
                                 UnsafeCheckpointError, trust_checkpoint)
from mmdata_plugin.utils.checkpoint_safety import trusted_checkpoints
from mmdata_plugin.utils import torch_internals
from mmdata_plugin.utils.torch_internals import unsafe_globals_in_checkpoint


@pytest.fixture(
    autouse=True,
    params=['torch', 'own'] if torch_internals._TORCH_BINDS_NAMES else ['own'])
def unpickler(request, monkeypatch):
    """Each test with torch's weights-only unpickler and again with the one
    torch < 2.6 loads through, where torch has both."""
    monkeypatch.setattr(torch_internals, '_TORCH_BINDS_NAMES',
                        request.param == 'torch')


@pytest.fixture(autouse=True)
def no_trusted_files(monkeypatch):
    monkeypatch.delenv(TRUSTED_CHECKPOINTS_ENV, raising=False)


@pytest.mark.compat
def test_our_checkpoint_round_trips_message_hub(tmp_path):
    # One hub per run: the test runs once per unpickler.
    hub = MessageHub.get_instance(f'checkpoint_safety_test_{tmp_path.name}')
    hub.update_scalar('train/loss', 0.5)
    hub.update_scalar('train/loss', 0.25, count=2)
    hub.update_scalar('train/acc', 3)
    path = str(tmp_path / 'ckpt.pth')
    torch.save(
        dict(
            message_hub=hub.state_dict(),
            meta=dict(dataset_meta=dict(palette=np.arange(6).reshape(2, 3))),
            state_dict=dict(w=torch.ones(2))), path)
    # Nothing dangerous in the file: the weights-only rules alone say so.
    assert 'builtins.getattr' not in unsafe_globals_in_checkpoint(path, [])

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


@pytest.mark.compat
def test_malicious_checkpoint_is_refused(tmp_path):
    marker = tmp_path / 'pwned'
    path = str(tmp_path / 'evil.pth')
    torch.save(
        dict(
            state_dict=dict(w=torch.ones(1)),
            meta=RunsShellCommand(f'touch {marker}')), path)
    with pytest.raises(UnsafeCheckpointError) as error:
        CheckpointLoader.load_checkpoint(path, map_location='cpu')
    assert 'system' in str(error.value)
    assert not marker.exists()


@pytest.mark.compat
def test_getattr_gadget_is_refused(tmp_path):
    path = str(tmp_path / 'gadget.pth')
    torch.save(dict(meta=UsesGetattrGadget()), path)
    assert unsafe_globals_in_checkpoint(path, []) == ['builtins.getattr']
    with pytest.raises(UnsafeCheckpointError) as error:
        CheckpointLoader.load_checkpoint(path)
    assert "outside the safe allow-list: ['builtins.getattr']" in str(
        error.value)


def test_trusting_another_file_does_not_trust_this_one(tmp_path):
    path = str(tmp_path / 'gadget.pth')
    torch.save(dict(meta=UsesGetattrGadget()), path)
    trust_checkpoint(str(tmp_path / 'other.pth'))
    with pytest.raises(UnsafeCheckpointError):
        CheckpointLoader.load_checkpoint(path)


def test_explicitly_trusted_file_loads(tmp_path):
    path = str(tmp_path / 'gadget.pth')
    torch.save(dict(meta=UsesGetattrGadget()), path)
    trust_checkpoint(path)
    assert CheckpointLoader.load_checkpoint(path)['meta'] == (
        OrderedDict.fromkeys)


def test_missing_file_error(tmp_path):
    with pytest.raises(FileNotFoundError, match='missing.pth'):
        CheckpointLoader.load_checkpoint(str(tmp_path / 'missing.pth'))


@pytest.mark.parametrize(
    'edit',
    [
        # A 4-byte int cut after one byte (struct.error in torch's reader).
        lambda pickled: pickled[:-1] + b'J\x01',
        # Protocol 4 framing, which torch's reader does not know.
        lambda pickled: b'\x80\x04\x95' + pickled[2:],
    ],
    ids=['cut_int', 'unknown_opcode'])
def test_malformed_pickle_is_unreadable_naming_the_file(edit, tmp_path):
    path = write_edited_pickle_checkpoint(str(tmp_path / 'bad.pth'), edit)
    with pytest.raises(UnreadableCheckpointError, match='bad.pth'):
        CheckpointLoader.load_checkpoint(path)


def test_plain_weights_still_load(tmp_path):
    path = osp.join(tmp_path, 'weights.pth')
    torch.save(dict(state_dict=dict(w=torch.arange(3.))), path)
    loaded = CheckpointLoader.load_checkpoint(path)
    assert torch.equal(loaded['state_dict']['w'], torch.arange(3.))


def _load_in_forked_child(path):
    """Load ``path`` and read every value in a forked child (a SIGSEGV kills
    the child, not pytest); its exit status and output."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        code = 0
        try:
            text = 'LOADED ' + repr(CheckpointLoader.load_checkpoint(path))
        except UnsafeCheckpointError as error:
            text, code = f'REFUSED {error}', 3
        except BaseException as error:
            text, code = f'{type(error).__name__}: {error}', 4
        os.write(write_end, text.encode())
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, 'rb') as output:
        text = output.read().decode()
    _, status = os.waitpid(pid, 0)
    return status, text


@pytest.mark.compat
@pytest.mark.parametrize('payload', sorted(HOSTILE_PAYLOADS))
def test_forged_numpy_data_is_refused_without_crashing(payload, tmp_path):
    path = write_hostile_checkpoint(payload, str(tmp_path / 'hostile.pth'))
    status, output = _load_in_forked_child(path)
    assert not os.WIFSIGNALED(status), (
        f'the load killed the process with signal {os.WTERMSIG(status)}')
    assert os.WEXITSTATUS(status) == 3, output
    assert f'Refusing to load checkpoint "{path}"' in output
    assert 'numpy data numpy itself never writes' in output


@pytest.mark.compat
@pytest.mark.parametrize('as_set_member', [False, True])
def test_deeply_nested_tuples_are_refused_without_crashing(
        as_set_member, tmp_path):
    # Hashing a million nested tuples overflows CPython's C stack.
    path = write_checkpoint_with_entry(
        str(tmp_path / 'nested.pth'), nested_tuples(10**6, as_set_member))
    status, output = _load_in_forked_child(path)
    assert not os.WIFSIGNALED(status), (
        f'the load killed the process with signal {os.WTERMSIG(status)}')
    assert output.startswith('UnreadableCheckpointError'), output
    assert path in output and 'nests tuples more than 100 deep' in output


def test_tuples_nested_within_the_limit_load(tmp_path):
    path = write_checkpoint_with_entry(
        str(tmp_path / 'nested.pth'), nested_tuples(100))
    loaded = CheckpointLoader.load_checkpoint(path)
    assert loaded.pop('w') == torch.ones(1)
    (key, value), = loaded.items()
    assert value == 1 and len(key) == 1
    path = write_checkpoint_with_entry(
        str(tmp_path / 'deeper.pth'), nested_tuples(101))
    with pytest.raises(UnreadableCheckpointError, match='more than 100 deep'):
        CheckpointLoader.load_checkpoint(path)


@pytest.mark.parametrize(
    'nested, error, match',
    [(False, UnreadableCheckpointError, 'would allocate'),
     (True, UnsafeCheckpointError, 'flat list of numbers')],
    ids=['flat', 'nested'])
def test_small_file_cannot_make_the_loader_allocate_far_more(
        nested, error, match, tmp_path):
    # 1000 rebuilds of one 16384-item list: a ~40 KB file, 256 MiB of arrays.
    path = str(tmp_path / 'amplifying.pth')
    torch.save(
        dict(message_hub=dict(log_scalars=history_buffers_sharing_one_list(
            1000, 2**14, nested))), path)
    assert osp.getsize(path) < 64 * 1024
    with pytest.raises(error, match=match):
        CheckpointLoader.load_checkpoint(path)


@pytest.mark.parametrize('entry', sorted(ALLOCATING_ENTRIES))
def test_torch_defaults_cannot_allocate_far_more_than_the_file(
        entry, tmp_path):
    path = write_checkpoint_with_entry(
        str(tmp_path / 'amplifying.pth'), ALLOCATING_ENTRIES[entry])
    assert osp.getsize(path) < 128 * 1024
    with pytest.raises(UnreadableCheckpointError,
                       match=r'UnexpectedAllocation|would allocate'):
        CheckpointLoader.load_checkpoint(path)


def test_bytes_and_bytearrays_as_pickle_writes_them_load(tmp_path):
    path = str(tmp_path / 'bytes.pth')
    content = [b'ab', b'ab', bytearray(b'xy'), bytearray(), b'']
    torch.save(dict(meta=content), path)
    assert CheckpointLoader.load_checkpoint(path)['meta'] == content


@pytest.mark.compat
def test_plain_numpy_content_round_trips_as_plain_numpy(tmp_path):
    big_endian = np.arange(4, dtype='>i2').reshape(2, 2)
    shared = np.linspace(0, 1, 5, dtype=np.float32)
    content = dict(
        arrays=[
            np.zeros((0, 3), np.uint8), big_endian,
            np.asfortranarray(np.arange(6.).reshape(2, 3)),
            np.array(True), np.arange(3, dtype=np.complex64), shared, shared
        ],
        scalars=(np.float64(0.5), np.int8(-3), np.bool_(True)),
        dtypes={np.dtype('f4'), np.dtype('>u8')},
        ordered=OrderedDict(a=np.uint16(7)))
    path = str(tmp_path / 'numpy.pth')
    torch.save(dict(meta=content), path)
    loaded = CheckpointLoader.load_checkpoint(path)['meta']
    for got, want in zip(loaded['arrays'], content['arrays']):
        assert type(got) is np.ndarray
        # What numpy's own unpickling gives (it makes byte order native).
        assert got.dtype == pickle.loads(pickle.dumps(want)).dtype
        np.testing.assert_array_equal(got, want)
    assert loaded['arrays'][2].flags.f_contiguous
    assert loaded['arrays'][5] is loaded['arrays'][6]
    assert loaded['scalars'] == content['scalars']
    assert [type(v) for v in loaded['scalars']] == [
        np.float64, np.int8, np.bool_
    ]
    assert loaded['dtypes'] == content['dtypes']
    assert all(isinstance(d, np.dtype) for d in loaded['dtypes'])
    assert isinstance(loaded['ordered'], OrderedDict)
    assert type(loaded['ordered']['a']) is np.uint16


def test_non_numeric_numpy_data_is_refused_unless_trusted(tmp_path):
    path = str(tmp_path / 'strings.pth')
    torch.save(dict(meta=dict(classes=np.array(['cat', 'dog']))), path)
    with pytest.raises(UnsafeCheckpointError, match="dtype 'U3'"):
        CheckpointLoader.load_checkpoint(path)
    trust_checkpoint(path)
    loaded = CheckpointLoader.load_checkpoint(path)
    assert list(loaded['meta']['classes']) == ['cat', 'dog']


@pytest.mark.skipif(
    not hasattr(torch.serialization, 'get_safe_globals'),
    reason='torch < 2.4 has no safe-globals list of the user\'s')
def test_users_safe_globals_survive_a_load(tmp_path):
    path = str(tmp_path / 'numpy.pth')
    torch.save(dict(meta=np.arange(3)), path)
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([np.dtype, np.ndarray])
    try:
        CheckpointLoader.load_checkpoint(path)
        with pytest.raises(UnsafeCheckpointError):
            CheckpointLoader.load_checkpoint(
                write_hostile_checkpoint('object_array_in_meta',
                                         str(tmp_path / 'hostile.pth')))
        after = torch.serialization.get_safe_globals()
        assert set(after) == set(before) | {np.dtype, np.ndarray}
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


def test_trusted_list_keeps_urls_whole(tmp_path, monkeypatch):
    local = str(tmp_path / 'a.pth')
    urls = ['http://127.0.0.1:8000/x.pth', 'open-mmlab:s3://bucket/k.pth']
    monkeypatch.setenv(TRUSTED_CHECKPOINTS_ENV,
                       ':'.join([local, urls[0], '/b/c.pth', urls[1]]))
    assert trusted_checkpoints() == [local, urls[0], '/b/c.pth', urls[1]]
    trust_checkpoint('mmcls://net')
    assert trusted_checkpoints()[-1] == 'mmcls://net'


@pytest.mark.compat
def test_a_compressed_record_is_refused(tmp_path):
    # torch's reader inflates a deflated data.pkl to the size its header
    # says: here 8 MB of padding after STOP, from a file of ~10 KB.
    saved = io.BytesIO()
    torch.save(dict(state_dict=dict(w=torch.ones(2))), saved)
    path = str(tmp_path / 'deflated.pth')
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(path, 'w') as out:
        for name in source.namelist():
            data = source.read(name)
            if name.endswith('/data.pkl'):
                out.writestr(name, data + bytes(8 << 20),
                             compress_type=zipfile.ZIP_DEFLATED)
            else:
                out.writestr(name, data)
    assert osp.getsize(path) < 64 * 1024
    with pytest.raises(UnreadableCheckpointError,
                       match='compresses .*data.pkl'):
        CheckpointLoader.load_checkpoint(path)
