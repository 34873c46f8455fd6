"""Safe checkpoint loading for mmengine 0.10.x, on every torch from 2.1.

torch >= 2.6 loads with ``weights_only=True`` by default. mmengine 0.10.7
checkpoints cannot be loaded that way: the message hub's ``HistoryBuffer``
objects pickle their statistics methods as ``builtins.getattr(HistoryBuffer,
'min')`` calls, and ``builtins.getattr`` is exactly the kind of global an
attacker uses to reach arbitrary code. Allow-listing it would make every
checkpoint a potential exploit, so we do two things instead:

* Saving: :func:`register_safe_history_buffer_pickling` registers a
  ``copyreg`` reducer for ``HistoryBuffer`` that stores only its numbers and
  rebuilds it through :func:`rebuild_history_buffer`. ``copyreg`` is the
  standard-library hook for pickling types one does not own, so mmengine's
  own code stays untouched.
* Loading: :func:`load_checkpoint_safely` loads with the weights-only rules
  (torch's own from 2.6, the same rules through
  :func:`~.torch_internals.weights_only_load` before) and allows, only for
  the duration of the call, a short list of data-only
  constructors: :func:`rebuild_history_buffer` and validating stand-ins for
  numpy's array/scalar/dtype constructors (:mod:`.numpy_unpickling`), so no
  file can crash the process or make numpy read memory it does not own.
  Anything else is refused with an error that lists the offending globals
  and how to opt in for one trusted file. Every checkpoint scheme mmengine
  knows is routed here by :mod:`.checkpoint_schemes`.
"""
import copyreg
import io
import os
import os.path as osp
import pickle
import re
from typing import Callable, List, Optional, Tuple, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer, print_log

from .allocation_budget import allocation_budget, charge
from .numpy_unpickling import (ForgedNumpyData, numpy_allow_list, plain_dtype,
                               plain_numpy_objects)
from .pickle_preflight import check_pickles
from .torch_internals import (fill_history_buffer,
                              unsafe_globals_in_checkpoint, weights_only_load)

#: Environment variable listing checkpoints (``os.pathsep`` separated files
#: or URLs) the user explicitly trusts to be unpickled without restrictions.
TRUSTED_CHECKPOINTS_ENV = 'MMDATA_TRUSTED_CHECKPOINTS'

# ``scheme://`` or ``scheme:scheme://`` (mmengine's ``open-mmlab:s3://``).
_URL = re.compile(r'[A-Za-z][\w.+-]*:(?:[A-Za-z][\w.+-]*:)?//')


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds what the safe loader refuses to unpickle."""


class UnreadableCheckpointError(RuntimeError):
    """A checkpoint file cannot be read (truncated, corrupt, wrong format)."""


def _history_dtype(spec) -> np.dtype:
    if type(spec) is str and spec[:1] in ('<', '>', '|', '='):
        return plain_dtype(spec[1:], spec[0])
    return plain_dtype(spec)


def rebuild_history_buffer(log_history: list, count_history: list,
                           max_length: int, log_dtype: str,
                           count_dtype: str) -> HistoryBuffer:
    """Rebuild a ``HistoryBuffer`` from plain numbers (the pickle target)."""
    if type(max_length) is not int:
        raise ForgedNumpyData(f'HistoryBuffer max_length {max_length!r}')
    buffer = HistoryBuffer(max_length=max_length)
    fill_history_buffer(buffer, _history_array(log_history, log_dtype),
                        _history_array(count_history, count_dtype))
    return buffer


def _history_array(values: list, spec: str) -> np.ndarray:
    dtype = _history_dtype(spec)
    # Flat: a nested list would allocate more than its length says.
    if type(values) is not list or not all(
            type(value) in (bool, int, float, complex) for value in values):
        raise ForgedNumpyData('HistoryBuffer values must be a flat list of '
                              'numbers')
    charge(len(values) * dtype.itemsize, 'a HistoryBuffer')
    return np.asarray(values, dtype=dtype)


def _reduce_history_buffer(buffer: HistoryBuffer):
    log_history, count_history = buffer.data
    return rebuild_history_buffer, (log_history.tolist(),
                                    count_history.tolist(), buffer.max_length,
                                    log_history.dtype.str,
                                    count_history.dtype.str)


def register_safe_history_buffer_pickling() -> None:
    """Make every ``HistoryBuffer`` pickle without ``builtins.getattr``."""
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)


def safe_allow_list() -> List[Tuple[Callable, str]]:
    """torch allow-list entries for the constructors checkpoints may name."""
    history = (rebuild_history_buffer,
               f'{__name__}.{rebuild_history_buffer.__qualname__}')
    return [history] + numpy_allow_list()


def is_url(name: str) -> bool:
    """Whether ``name`` is a URL-like checkpoint name (``scheme://...``)."""
    return _URL.match(name) is not None


def _trust_key(name: str) -> str:
    return name if is_url(name) else osp.realpath(osp.expanduser(name))


def _split_trusted(value: str) -> List[str]:
    if os.pathsep != ':':
        return [entry for entry in value.split(os.pathsep) if entry]
    # ':' separates entries but also occurs in URLs (scheme, port): an entry
    # is a URL up to the next ':' that starts neither '//' nor a port.
    entries = re.findall(
        r'(?:[A-Za-z][\w.+-]*:(?:[A-Za-z][\w.+-]*:)?//[^:/]*(?::\d+)?'
        r'[^:]*|[^:]+)', value)
    return [entry for entry in entries if entry]


def trusted_checkpoints() -> List[str]:
    """Real paths / URLs of the checkpoints the user opted in for."""
    value = os.environ.get(TRUSTED_CHECKPOINTS_ENV, '')
    return [_trust_key(entry) for entry in _split_trusted(value)]


def trust_checkpoint(name: str) -> None:
    """Opt in for one checkpoint file or URL, for this process and children.
    """
    trusted = trusted_checkpoints() + [_trust_key(name)]
    os.environ[TRUSTED_CHECKPOINTS_ENV] = os.pathsep.join(trusted)


def _is_trusted(*names: str) -> bool:
    trusted = trusted_checkpoints()
    return any(_trust_key(name) in trusted for name in names)


def _refusal(name: str, reason: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f'Refusing to load checkpoint "{name}": {reason}. If you trust this '
        f'file, opt in for it explicitly: pass `--trust-checkpoint {name}` '
        f'to tools/train.py, or set {TRUSTED_CHECKPOINTS_ENV}={name}. '
        'Checkpoints saved while mmdata_plugin is imported load without '
        'this step.')


def _unsafe_globals_reason(source) -> str:
    unsafe = unsafe_globals_in_checkpoint(source, safe_allow_list())
    return (f'it references globals outside the safe allow-list: {unsafe}. '
            'Checkpoints written by stock mmengine 0.10.x pickle '
            'HistoryBuffer methods through `builtins.getattr`, which can run '
            'arbitrary code') if unsafe else ''


def _unreadable(name: str, error: Exception) -> UnreadableCheckpointError:
    return UnreadableCheckpointError(
        f'Cannot read checkpoint "{name}": {type(error).__name__}: {error}')


def _opened(source: Union[str, bytes]):
    return io.BytesIO(source) if isinstance(source, bytes) else source


def _load_restricted(source, map_location):
    file_size = len(source) if isinstance(source,
                                          bytes) else osp.getsize(source)
    with allocation_budget(file_size):
        check_pickles(source)
        return plain_numpy_objects(
            weights_only_load(_opened(source), map_location,
                              safe_allow_list()))


def _try_restricted_load(source, map_location,
                         name: str) -> Tuple[Optional[str], object]:
    """(None, checkpoint), or (why the restricted load refuses, None)."""
    try:
        return None, _load_restricted(source, map_location)
    except ForgedNumpyData as error:
        return (f'it holds numpy data numpy itself never writes ({error}); '
                'only plain numeric and bool arrays, scalars and dtypes '
                'are accepted'), None
    except pickle.UnpicklingError as error:
        try:
            reason = _unsafe_globals_reason(_opened(source))
        except Exception:  # the scan fails where the load did
            reason = ''
        if not reason:
            raise _unreadable(name, error) from error
        return reason, None
    except Exception as error:
        # Whatever a malformed file makes torch's reader (truncated zip,
        # cut operand: struct.error), a stand-in or a rebuild function raise.
        raise _unreadable(name, error) from error


def load_checkpoint_safely(source: Union[str, bytes],
                           map_location=None,
                           name: Optional[str] = None):
    """Load a checkpoint with ``weights_only=True`` and our allow-list.

    Args:
        source (str | bytes): Local file path, or the file's bytes.
        map_location: Same as :func:`torch.load`.
        name (str, optional): What the user called the checkpoint (a URL
            for downloaded files); used in messages and matched against the
            trusted checkpoints. Defaults to ``source`` (a path).

    Returns:
        dict: The loaded checkpoint, numpy content as plain numpy objects.

    Raises:
        UnsafeCheckpointError: If the file needs globals outside the
            allow-list or holds numpy data numpy never writes, and the user
            did not trust it.
        UnreadableCheckpointError: If the file cannot be read at all.
    """
    name = name or source
    reason, checkpoint = _try_restricted_load(source, map_location, name)
    if reason is None:
        return checkpoint
    local = [source] if isinstance(source, str) else []
    if not _is_trusted(name, *local):
        raise _refusal(name, reason)
    print_log(
        f'Loading "{name}" without weights_only restrictions because the '
        f'user trusted it explicitly ({TRUSTED_CHECKPOINTS_ENV}): {reason}.',
        logger='current')
    return torch.load(
        _opened(source), map_location=map_location, weights_only=False)


def load_from_local_safely(filename: str, map_location=None):
    """mmengine's local-file scheme (``''``), loaded safely.

    Args:
        filename (str): Local checkpoint path.
        map_location: Same as :func:`torch.load`.

    Returns:
        dict: The loaded checkpoint.

    Raises:
        FileNotFoundError: If ``filename`` does not exist.
        UnsafeCheckpointError: See :func:`load_checkpoint_safely`.
        UnreadableCheckpointError: See :func:`load_checkpoint_safely`.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return load_checkpoint_safely(filename, map_location)
