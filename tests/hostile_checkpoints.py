"""Hand-crafted hostile checkpoints for the safe loader's tests.

Two code gadgets, then payloads that name only globals the safe loader
accepts by name (numpy's ``dtype``, ``_reconstruct``, ``scalar``, our
HistoryBuffer rebuilder), with a forged state: the attacks numpy itself
never writes.
"""
import copyreg
import functools
import importlib
import io
import os
import zipfile
from collections import OrderedDict

import numpy as np
import torch

from mmdata_plugin.utils.checkpoint_safety import rebuild_history_buffer

# numpy 1.26 has a numpy._core too, without multiarray: ask by version.
_multiarray = importlib.import_module(
    'numpy._core.multiarray' if int(np.__version__.split('.')[0]) >= 2 else
    'numpy.core.multiarray')
_RECONSTRUCT = _multiarray._reconstruct
_SCALAR = _multiarray.scalar
# numpy's own object dtype state has flags 63 (it holds references); 0 makes
# numpy treat the raw bytes of the file as object pointers.
_NO_REFERENCE_FLAGS = 0


class RunsShellCommand:
    """A pickle payload that runs a command when unpickled."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command, )


class UsesGetattrGadget:
    """The `builtins.getattr` gadget attackers chain to reach any callable.

    Harmless here (it resolves ``OrderedDict.fromkeys``), but it is exactly
    what stock mmengine checkpoints contain. ``OrderedDict`` is allowed by
    torch itself, so ``builtins.getattr`` is the only global the safe loader
    can refuse it for.
    """

    def __reduce__(self):
        return getattr, (OrderedDict, 'fromkeys')


class ForgedDtype:
    """Pickles as ``numpy.dtype(spec)`` followed by a BUILD of ``state``."""

    def __init__(self, spec, state):
        self.spec, self.state = spec, state

    def __reduce__(self):
        return np.dtype, (self.spec, False, True), self.state


class DtypeWithoutSpec:
    """Pickles as NEWOBJ ``numpy.dtype`` (no constructor call), then BUILD
    of an object dtype's state."""

    # pickle checks that NEWOBJ's class is the object's __class__.
    __class__ = property(lambda self: np.dtype)

    def __reduce__(self):
        return copyreg.__newobj__, (np.dtype, ), (3, '|', None, None, None,
                                                  -1, -1, 0)


class ForgedArray:
    """Pickles as numpy's ``_reconstruct`` + BUILD with a chosen state."""

    def __init__(self, shape, dtype, data):
        self.state = (1, shape, dtype, False, data)

    def __reduce__(self):
        return _RECONSTRUCT, (np.ndarray, (0, ), b'b'), self.state


class ForgedScalar:
    """Pickles as numpy's ``scalar(dtype, data)``."""

    def __init__(self, dtype, data):
        self.args = (dtype, data)

    def __reduce__(self):
        return _SCALAR, self.args


class ForgedHistoryBuffer:
    """Our HistoryBuffer rebuilder fed a hostile array."""

    def __init__(self, log_history):
        self.log_history = log_history

    def __reduce__(self):
        return rebuild_history_buffer, (self.log_history, [1], 20, '<f8',
                                        '<i8')


class HistoryBufferSharingItsList:
    """Our HistoryBuffer rebuilder handed one (memoised) list: each copy in
    the file costs a few bytes and makes the loader build two arrays."""

    def __init__(self, values):
        self.values = values

    def __reduce__(self):
        return rebuild_history_buffer, (self.values, self.values, 20, '<f8',
                                        '<i8')


def history_buffers_sharing_one_list(copies, length, nested=False):
    values = [[0] * length] if nested else [0] * length
    return [HistoryBufferSharingItsList(values) for _ in range(copies)]


def forged_object_dtype():
    """Object dtype whose flags claim it holds no references."""
    return ForgedDtype('O8', (3, '|', None, None, None, -1, -1,
                              _NO_REFERENCE_FLAGS))


def forged_object_array(items=2):
    """An object array whose 'pointers' are bytes of the file."""
    return ForgedArray((items, ), forged_object_dtype(), b'\x41' * 8 * items)


def record_with_object_field():
    dtype = ForgedDtype('V8', (3, '|', None, ('a', ), {
        'a': (forged_object_dtype(), 0)
    }, 8, 1, _NO_REFERENCE_FLAGS))
    return ForgedArray((2, ), dtype, b'\x41' * 16)


def record_with_field_outside_item():
    """A record whose only field lies 64 KiB past its 8-byte item."""
    dtype = ForgedDtype('V8', (3, '|', None, ('a', ), {
        'a': (np.dtype('<f8'), 65536)
    }, 8, 1, 16))
    return ForgedArray((2, ), dtype, b'\x00' * 16)


def array_with_short_buffer():
    """Shape promises 1000 float64 values, the data holds 8 bytes."""
    return ForgedArray((1000, ), np.dtype('<f8'), b'\x00' * 8)


#: name -> the object stored in the hostile checkpoint.
HOSTILE_PAYLOADS = {
    'object_array_in_meta': lambda: dict(meta=dict(x=forged_object_array())),
    'object_array_in_history_buffer': lambda: dict(message_hub=dict(
        log_scalars={'loss': ForgedHistoryBuffer(forged_object_array())})),
    'object_scalar_in_set': lambda: dict(meta=dict(x={
        ForgedScalar(forged_object_dtype(), b'\x41' * 8)
    })),
    'dtype_built_without_its_spec': lambda: dict(meta=dict(x=ForgedArray(
        (2, ), DtypeWithoutSpec(), b'\x41' * 16))),
    'float_dtype_claiming_references': lambda: dict(meta=dict(x=ForgedArray(
        (2, ), ForgedDtype('f8', (3, '<', None, None, None, -1, -1, 63)),
        b'\x41' * 16))),
    'float_dtype_with_far_field': lambda: dict(meta=dict(x=ForgedArray(
        (2, ), ForgedDtype('f8', (3, '<', None, ('a', ), {
            'a': (np.dtype('<f8'), 65536)
        }, 8, 1, 16)), b'\x41' * 16))),
    'record_with_object_field': lambda: dict(
        meta=dict(x=record_with_object_field())),
    'record_field_outside_item': lambda: dict(
        meta=dict(x=record_with_field_outside_item())),
    'array_with_short_buffer': lambda: dict(
        meta=dict(x=array_with_short_buffer())),
}


def write_hostile_checkpoint(name, path, **extra):
    """Write payload ``name`` (plus ``extra`` entries) to ``path``."""
    checkpoint = dict(HOSTILE_PAYLOADS[name](), **extra)
    torch.save(checkpoint, path)
    return path




def write_edited_pickle_checkpoint(path, edit):
    """``{'w': tensor}`` saved by torch, its data.pkl replaced by
    ``edit(data.pkl)``."""
    buffer = io.BytesIO()
    torch.save({'w': torch.ones(1)}, buffer)
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(path, 'w') as out:
        for member in source.namelist():
            data = source.read(member)
            if member.endswith('/data.pkl'):
                data = edit(data)
            out.writestr(member, data)
    return path



def write_checkpoint_with_entry(path, key_and_value):
    """``{'w': tensor}`` plus one more entry: ``key_and_value`` is raw
    pickle opcodes pushing a key and a value (torch.save cannot write
    what an attacker can)."""
    # Before STOP the dict is on top of the stack: SETITEM adds the entry.
    return write_edited_pickle_checkpoint(
        path, lambda pickled: pickled[:-1] + key_and_value + b's.')


def _text(text):
    return b'X' + len(text).to_bytes(4, 'little') + text


def nested_tuples(depth, as_set_member=False):
    """A key (or, under key 'x', a set member) of ``depth`` nested tuples:
    one TUPLE1 opcode per level, so a megabyte nests a million deep."""
    nested = b')' + b'\x85' * (depth - 1)
    if as_set_member:
        return _text(b'x') + b'cbuiltins\nset\n]' + nested + b'a\x85R'
    return nested + b'K\x01'


def _encode(pickled_text, encoding=b'latin1'):
    return b'c_codecs\nencode\n' + pickled_text + _text(encoding) + b'\x86R'


#: name -> raw opcodes of a key and value that make torch's unpickler (with
#: only its default globals) allocate far more than the file holds.
ALLOCATING_ENTRIES = {
    # bytearray(64 MiB) from 25 bytes.
    'bytearray_of_a_size': _text(b'x') + b'cbuiltins\nbytearray\nJ' +
    (1 << 26).to_bytes(4, 'little') + b'\x85R',
    # Each hex encoding doubles: 4 KiB from 12 nested calls.
    'hex_encoding_chain': _text(b'x') + functools.reduce(
        lambda inner, _: b'c_codecs\nencode\n' + inner + _text(b'hex') +
        b'\x86R', range(12), _encode(_text(b'a'))),
    # One memoised 64 KiB string encoded 200 times: 12.8 MB from 66 KB.
    'memoised_string_encoded_again': _text(b'x') + b'](' + _text(
        b'a' * 65536) + b'r\xa0\x86\x01\x00' + _encode(
            b'j\xa0\x86\x01\x00') * 200 + b'e',
    # 256 MiB of uninitialised floats from 37 bytes.
    'tensor_class_called_with_a_size': _text(b'x') +
    b'ctorch\nFloatTensor\nJ' + (1 << 26).to_bytes(4, 'little') + b'\x85R',
    # One memoised list of 10000 ints made a set 100 times: 50 MB from 50 KB.
    'memoised_list_copied_again': _text(b'x') + b'](](' + b''.join(
        b'J' + i.to_bytes(4, 'little') for i in range(10000)) +
    b'er\xa0\x86\x01\x00' + b'cbuiltins\nset\nj\xa0\x86\x01\x00\x85R' * 100 +
    b'e',
    # 2 GiB of storage from 40 bytes (a storage class is a default global).
    'storage_class_called_with_a_size': _text(b'x') +
    b'ctorch.storage\nUntypedStorage\nJ' + (2**31 - 1).to_bytes(4, 'little')
    + b'\x85R',
    # One memoised tuple of 10000 ints made a torch.Size 2000 times.
    'memoised_tuple_copied_again': _text(b'x') + b']ctorch\nSize\nq\x02(' +
    b''.join(b'J' + i.to_bytes(4, 'little') for i in range(10000)) +
    b'tq\x01\x85Ra' + b'h\x02h\x01\x85Ra' * 2000,
    # One memoised dict of 10000 items built into an OrderedDict 2000 times
    # (BUILD copies the state into the object).
    'memoised_dict_built_again': _text(b'x') +
    b']ccollections\nOrderedDict\nq\x02)R}q\x01(' + b''.join(
        b'J' + i.to_bytes(4, 'little') + b'N' for i in range(10000)) +
    b'uba' + b'h\x02)Rh\x01ba' * 2000,
}
