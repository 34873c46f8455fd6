"""Validating stand-ins for numpy's pickle constructors.

A numpy array pickles as ``_reconstruct(ndarray, (0,), b'b')`` followed by a
BUILD that hands ``ndarray.__setstate__`` a dtype and the raw bytes; a dtype
pickles as ``dtype(spec)`` followed by a BUILD of its flags, fields and
sizes. Handed to torch's ``weights_only`` unpickler as they are, these
constructors trust the file completely: an object dtype whose flags claim it
holds no references turns bytes of the file into object pointers, a record
field offset beyond the item reads memory outside the buffer.

So the safe loader never registers numpy's own constructors. It registers
(through torch's ``(callable, "module.name")`` allow-list entries) the
stand-ins below under numpy's names. They accept exactly what numpy writes
for plain numeric and bool data: a dtype must be ``b``/``i``/``u``/``f``/``c``
with the byte order and state numpy itself produces for it (no fields, no
subarray, no object, no metadata); an array's data must be exactly
``prod(shape) * itemsize`` bytes; a scalar's exactly ``itemsize``. Anything
else raises :class:`ForgedNumpyData`. :func:`plain_numpy_objects` turns the
stand-ins left in the loaded checkpoint into ordinary numpy objects.
"""
import math
import re
from typing import Any, Callable, List, Tuple

import numpy as np

from .allocation_budget import charge

#: numpy kinds whose items are plain bytes: bool, ints, floats, complex.
PLAIN_KINDS = 'biufc'

# How numpy names a plain built-in dtype in its pickles: kind + item size.
_PLAIN_SPEC = re.compile(r'[biufc][0-9]{1,2}')
_BYTE_ORDERS = ('<', '>', '|')


class ForgedNumpyData(ValueError):
    """A checkpoint holds numpy data numpy itself never writes."""


def plain_dtype(spec: Any, byte_order: str = '|') -> np.dtype:
    """The plain numeric/bool dtype named ``spec``, or ForgedNumpyData."""
    if type(spec) is not str or not _PLAIN_SPEC.fullmatch(spec):
        raise ForgedNumpyData(
            f'dtype {spec!r} is not a plain numeric or bool dtype (only '
            f'kinds {PLAIN_KINDS!r} are accepted)')
    try:
        dtype = np.dtype(spec)
    except TypeError as error:
        raise ForgedNumpyData(f'unknown dtype {spec!r}') from error
    if byte_order != '|':
        dtype = dtype.newbyteorder(byte_order)
    return dtype


class PendingDtype:
    """``numpy.dtype`` as the safe loader sees it: checked, then resolved.

    The pickle calls ``numpy.dtype(spec, align, copy)`` and then BUILDs the
    dtype's state; a real dtype would take that state unchecked.
    """
    # Also what an instance made without __init__ (pickle NEWOBJ) holds.
    spec = None
    resolved = None

    def __init__(self, spec: Any, align: Any = False, copy: Any = True):
        plain_dtype(spec)
        if align is not False or type(copy) is not bool:
            raise ForgedNumpyData(
                f'dtype({spec!r}, align={align!r}, copy={copy!r}) is not '
                'how numpy pickles a plain dtype')
        self.spec = spec
        self.resolved = None

    def __setstate__(self, state: Any) -> None:
        if self.resolved is not None:
            raise ForgedNumpyData(f'dtype {self.spec!r} is built twice')
        self.resolved = self._checked_dtype(state)

    def _checked_dtype(self, state: Any) -> np.dtype:
        if (type(state) is not tuple or len(state) < 2
                or state[1] not in _BYTE_ORDERS):
            raise ForgedNumpyData(
                f'dtype {self.spec!r} has a malformed state {state!r}')
        dtype = plain_dtype(self.spec, state[1])
        expected = dtype.__reduce__()[2]
        plain_values = all(type(v) in (int, str, type(None)) for v in state)
        if not plain_values or state != expected:
            raise ForgedNumpyData(
                f'dtype {self.spec!r} has the state {state!r}; numpy writes '
                f'{expected!r} (fields, subarrays, objects and forged flags '
                'are refused)')
        return dtype


def resolved_dtype(dtype: Any) -> np.dtype:
    if type(dtype) is not PendingDtype or dtype.resolved is None:
        raise ForgedNumpyData(
            f'expected a numpy dtype from the checkpoint, got {dtype!r}')
    return dtype.resolved


def _nbytes(shape: Any, dtype: np.dtype) -> int:
    if type(shape) is not tuple or not all(
            type(n) is int and n >= 0 for n in shape):
        raise ForgedNumpyData(f'array shape {shape!r} is not a tuple of '
                              'non-negative ints')
    return math.prod(shape) * dtype.itemsize


class ValidatedArray(np.ndarray):
    """The array a checkpoint's ``_reconstruct`` builds, data checked.

    Only :func:`reconstruct_array` creates these; the pickle may not call the
    class itself.
    """

    def __new__(cls, *args, **kwargs):
        raise ForgedNumpyData('arrays are only rebuilt through _reconstruct')

    def __setstate__(self, state: Any) -> None:
        if getattr(self, '_built', False):
            # A second BUILD would free data that views may still point to.
            raise ForgedNumpyData('an array is built twice')
        self._built = True
        if type(state) is not tuple or len(state) != 5 or state[0] != 1:
            raise ForgedNumpyData('malformed array state')
        _, shape, dtype, is_fortran, data = state
        dtype = resolved_dtype(dtype)
        nbytes = _nbytes(shape, dtype)
        if type(is_fortran) is not bool or type(data) not in (bytes,
                                                             bytearray):
            raise ForgedNumpyData('malformed array state')
        if len(data) != nbytes:
            raise ForgedNumpyData(
                f'array of shape {shape} and dtype {dtype} needs {nbytes} '
                f'bytes, the checkpoint holds {len(data)}')
        if type(data) is bytearray:
            # Copied; a memoised bytearray could be copied for every array.
            charge(nbytes, f'a {dtype} array of shape {shape}')
            data = bytes(data)
        np.ndarray.__setstate__(self, (1, shape, dtype, is_fortran, data))


def refuse_ndarray_call(*args, **kwargs):
    """Stands for ``numpy.ndarray``: only :func:`reconstruct_array` uses it."""
    raise ForgedNumpyData('numpy.ndarray may only be named as the class '
                          'argument of _reconstruct')


def reconstruct_array(cls: Any, shape: Any, typecode: Any) -> ValidatedArray:
    """Stands for numpy's ``_reconstruct``: an empty array BUILD fills."""
    if cls is not refuse_ndarray_call or shape != (0, ) or typecode != b'b':
        raise ForgedNumpyData(
            '_reconstruct is only accepted as numpy pickles plain ndarrays')
    return np.ndarray.__new__(ValidatedArray, (0, ), np.uint8)


def rebuild_scalar(dtype: Any, data: Any) -> np.generic:
    """Stands for numpy's ``scalar(dtype, bytes)``."""
    dtype = resolved_dtype(dtype)
    if type(data) is not bytes or len(data) != dtype.itemsize:
        raise ForgedNumpyData(
            f'a {dtype} scalar needs {dtype.itemsize} bytes of data')
    return np.frombuffer(data, dtype)[0]


def empty_bytes() -> bytes:
    """Stands for ``builtins.bytes``, which protocol 2 pickles name only to
    write ``b''`` (the data of an empty array)."""
    return b''


def numpy_allow_list() -> List[Tuple[Callable, str]]:
    """torch allow-list entries: numpy's names bound to the stand-ins.

    Pickles name whichever module the writing numpy had (``numpy.core``
    before 2.0, ``numpy._core`` since), so both are bound.
    """
    entries = [(PendingDtype, 'numpy.dtype'),
               (empty_bytes, 'builtins.bytes'),
               (refuse_ndarray_call, 'numpy.ndarray'),
               # Named so torch lets BUILD reach its checked __setstate__;
               # no pickle can construct it by this name (__new__ refuses).
               (ValidatedArray, f'{__name__}.ValidatedArray')]
    for module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        entries += [(reconstruct_array, f'{module}._reconstruct'),
                    (rebuild_scalar, f'{module}.scalar')]
    return entries


def plain_numpy_objects(obj: Any) -> Any:
    """``obj`` with every stand-in replaced by a plain numpy object.

    Walks the containers torch's unpickler builds (dict and its subclasses,
    list, tuple, set) in place, keeping shared objects shared.
    """
    converted = {}

    def convert(item):
        key = id(item)
        if key in converted:
            return converted[key]
        if type(item) is ValidatedArray:
            converted[key] = item.view(np.ndarray)
        elif type(item) is PendingDtype:
            converted[key] = resolved_dtype(item)
        elif isinstance(item, dict):
            converted[key] = item
            pairs = [(convert(k), convert(v)) for k, v in item.items()]
            item.clear()
            item.update(pairs)
        elif type(item) is list:
            converted[key] = item
            item[:] = [convert(v) for v in item]
        elif type(item) is set:
            converted[key] = item
            members = [convert(v) for v in item]
            item.clear()
            item.update(members)
        elif type(item) is tuple:
            converted[key] = tuple(convert(v) for v in item)
        else:
            converted[key] = item
        return converted[key]

    return convert(obj)
