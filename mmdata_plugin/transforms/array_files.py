"""Read ``.npy`` and raw array files straight into (shared-memory) tensors.

``np.load`` of a pickle, or returning a numpy array from a DataLoader
worker, makes Python serialise the bytes twice (pickle in the worker,
unpickle in the training process, both holding the GIL). Here the file is
copied by the kernel (``sendfile``) into a shared-memory segment that
becomes the tensor's storage (elsewhere: one ``readinto`` into a tensor
allocated in shared memory): the worker hands the training process a
handle, and the bytes are never copied by Python or pickled.

Only the ``.npy`` header (a short dict literal, parsed by numpy's
``format`` module with ``ast.literal_eval``) is interpreted; object arrays,
which need pickle, are refused.
"""
import os
from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from numpy.lib import format as npy_format

from ..utils.shared_bytes import new_shared_bytes, storage_bytes
from ..utils.torch_internals import storage_of_segment


class ArrayFileError(ValueError):
    """An array file is truncated, malformed or not what the config says."""


class ArrayLayout(NamedTuple):
    """Where an array's data lies in its file, and how it is laid out."""
    dtype: np.dtype
    shape: Tuple[int, ...]
    fortran_order: bool
    offset: int  # bytes before the data (the .npy header)


def _check_dtype(dtype: np.dtype, path: str) -> None:
    if dtype.hasobject:
        raise ArrayFileError(
            f'{path}: the array holds Python objects (dtype {dtype}), which '
            'only pickle can load; pickled arrays are refused '
            '(allow_pickle=False). Store a numeric dtype.')
    try:
        torch.from_numpy(np.empty(0, dtype.newbyteorder('=')))
    except TypeError as error:
        raise ArrayFileError(
            f'{path}: dtype {dtype} has no torch equivalent ({error})') from None


def npy_layout(file, path: str) -> ArrayLayout:
    """The layout an ``.npy`` header declares (``file`` at its start)."""
    try:
        version = npy_format.read_magic(file)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(file)
        elif version == (2, 0):
            shape, fortran, dtype = npy_format.read_array_header_2_0(file)
        else:
            raise ValueError(f'.npy format version {version} is not '
                             'supported (1.0 and 2.0 are)')
    except ValueError as error:
        raise ArrayFileError(f'{path}: not a valid .npy file: {error}') \
            from None
    _check_dtype(dtype, path)
    return ArrayLayout(dtype, tuple(shape), fortran, file.tell())


def raw_layout(size: int, dtype, shape: Optional[Sequence[int]],
               path: str) -> ArrayLayout:
    """The layout of a headerless file of ``size`` bytes, from the config.

    ``shape`` may hold one ``-1`` (inferred from the size) or be None (1-D).
    """
    if dtype is None:
        raise ArrayFileError(
            f'{path}: a raw array file (no .npy header) needs dtype (and '
            'shape) in the config')
    dtype = np.dtype(dtype)
    _check_dtype(dtype, path)
    shape = (-1, ) if shape is None else tuple(int(s) for s in shape)
    known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        raise ArrayFileError(f'{path}: shape {shape} may hold one -1 and '
                             'no other negative size')
    if shape.count(-1):
        whole, rest = divmod(size, max(known * dtype.itemsize, 1))
        if rest or known == 0:
            raise ArrayFileError(
                f'{path}: {size} bytes is not a whole number of {dtype} '
                f'arrays of shape {shape}')
        shape = tuple(whole if s == -1 else s for s in shape)
    return ArrayLayout(dtype, shape, False, 0)


def check_declared(layout: ArrayLayout, dtype, shape, path: str) -> None:
    """Refuse an ``.npy`` file whose header contradicts the config."""
    if dtype is not None and np.dtype(dtype) != layout.dtype:
        raise ArrayFileError(
            f'{path}: the file holds {layout.dtype} but the config says '
            f'dtype={np.dtype(dtype)}')
    if shape is not None and not _shape_matches(layout.shape, shape):
        raise ArrayFileError(
            f'{path}: the file holds shape {layout.shape} but the config '
            f'says shape={tuple(shape)}')


def _shape_matches(actual: Tuple[int, ...], declared: Sequence[int]) -> bool:
    return len(actual) == len(declared) and all(
        d == -1 or d == a for a, d in zip(actual, declared))


def _kernel_copied_shared(file, offset: int, nbytes: int,
                          shown: str) -> Optional[torch.UntypedStorage]:
    """``nbytes`` of ``file`` from ``offset`` in a new shared segment, copied
    by the kernel (``sendfile`` into a memfd): no zeroing of the segment
    and no pass over the bytes in user space. None where the platform or
    the file system cannot (then :func:`_read_into_shared`)."""
    if not hasattr(os, 'memfd_create'):
        return None
    segment = os.memfd_create('mmdata_array', os.MFD_CLOEXEC)
    try:
        os.ftruncate(segment, nbytes)
        done = 0
        while done < nbytes:
            try:
                count = os.sendfile(segment, file.fileno(), offset + done,
                                    nbytes - done)
            except OSError:
                return None  # e.g. a file system without splice support
            if not count:
                raise _changed_while_read(shown, done, nbytes)
            done += count
        # The storage keeps its fd, so a worker hands it on by fd, without
        # the copy ``share_memory_()`` would make.
        return storage_of_segment(segment, nbytes)
    finally:
        os.close(segment)


def _read_into_shared(file, offset: int, nbytes: int,
                      shown: str) -> torch.UntypedStorage:
    """The portable path: ``readinto`` a segment torch allocates shared."""
    block = new_shared_bytes(nbytes)
    file.seek(offset)
    _read_fully(file, memoryview(block.numpy()), shown)
    return block.untyped_storage()


def read_array(path: str,
               dtype=None,
               shape: Optional[Sequence[int]] = None,
               shared: bool = False,
               name: Optional[str] = None) -> torch.Tensor:
    """The array in ``path`` (``.npy`` or raw bytes) as a tensor.

    Args:
        path (str): A local file. A file starting with the ``.npy`` magic is
            read by its header; any other file as raw bytes of ``dtype`` and
            ``shape``.
        dtype (optional): numpy dtype (raw files: required; ``.npy``: the
            header must agree).
        shape (Sequence[int], optional): Shape (raw files: one entry may be
            -1; ``.npy``: the header must agree, -1 matching any size).
        shared (bool): Read into shared memory, so that a DataLoader worker
            hands the tensor over without copying it.
        name (str, optional): How errors name the file (e.g. its URL and
            sample index); defaults to ``path``.

    Raises:
        ArrayFileError: The file is truncated, too long for a raw array,
            malformed, holds objects or contradicts ``dtype``/``shape``.
    """
    shown = path if name is None else name
    with open(path, 'rb', buffering=0) as file:
        size = os.fstat(file.fileno()).st_size
        if file.read(6) == npy_format.MAGIC_PREFIX:
            file.seek(0)
            layout = npy_layout(file, shown)
            check_declared(layout, dtype, shape, shown)
        else:
            layout = raw_layout(size, dtype, shape, shown)
        nbytes = int(np.prod(layout.shape, dtype=np.int64)) * \
            layout.dtype.itemsize
        available = size - layout.offset
        if available < nbytes or (layout.offset == 0 and available > nbytes):
            raise ArrayFileError(
                f'{shown}: {available} bytes of data for a {layout.dtype} '
                f'array of shape {layout.shape}, which takes {nbytes} '
                f'bytes ({"truncated" if available < nbytes else "too long"})'
            )
        if shared and nbytes:
            storage = _kernel_copied_shared(
                file, layout.offset, nbytes, shown) or _read_into_shared(
                    file, layout.offset, nbytes, shown)
        else:
            storage = torch.UntypedStorage(nbytes)
            file.seek(layout.offset)
            _read_fully(file, memoryview(storage_bytes(storage).numpy()),
                        shown)
    return _as_tensor(storage, layout)


def _read_fully(file, buffer: memoryview, shown: str) -> None:
    done = 0
    while done < len(buffer):
        count = file.readinto(buffer[done:])
        if not count:
            raise _changed_while_read(shown, done, len(buffer))
        done += count


def _changed_while_read(shown: str, done: int, nbytes: int) -> ArrayFileError:
    return ArrayFileError(
        f'{shown}: the file ended after {done} of {nbytes} data bytes (it '
        'changed while being read)')


def _as_tensor(storage: torch.UntypedStorage,
               layout: ArrayLayout) -> torch.Tensor:
    native = layout.dtype.newbyteorder('=')
    torch_dtype = torch.from_numpy(np.empty(0, native)).dtype
    shape = layout.shape[::-1] if layout.fortran_order else layout.shape
    tensor = torch.tensor([], dtype=torch_dtype).set_(storage).view(shape)
    if not layout.dtype.isnative:
        tensor.numpy().byteswap(inplace=True)
    if layout.fortran_order:
        tensor = tensor.permute(*reversed(range(tensor.dim())))
    return tensor
