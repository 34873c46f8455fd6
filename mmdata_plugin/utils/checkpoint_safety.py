"""Safe checkpoint loading for mmengine 0.10.x on torch >= 2.6.

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
* Loading: :func:`load_from_local_safely` replaces mmengine's local-file
  checkpoint loader. It keeps ``weights_only=True`` and allows, only for the
  duration of the call, a short list of data-only constructors
  (:func:`rebuild_history_buffer` and numpy's array/scalar/dtype
  reconstructors). Anything else is refused with an error that lists the
  offending globals and how to opt in for one trusted file.
"""
import copyreg
import os
import os.path as osp
import pickle
from typing import Callable, List

import numpy as np
import torch
from mmengine.logging import HistoryBuffer, print_log
from mmengine.runner.checkpoint import (CheckpointLoader, load_from_ceph,
                                        load_from_http, load_from_openmmlab,
                                        load_from_torchvision)

#: Environment variable listing checkpoint files (``os.pathsep`` separated)
#: the user explicitly trusts to be unpickled without restrictions.
TRUSTED_CHECKPOINTS_ENV = 'MMDATA_TRUSTED_CHECKPOINTS'


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint references globals outside the safe allow-list."""


def rebuild_history_buffer(log_history: list, count_history: list,
                           max_length: int, log_dtype: str,
                           count_dtype: str) -> HistoryBuffer:
    """Rebuild a ``HistoryBuffer`` from plain numbers (the pickle target)."""
    buffer = HistoryBuffer(max_length=max_length)
    buffer._log_history = np.asarray(log_history, dtype=log_dtype)
    buffer._count_history = np.asarray(count_history, dtype=count_dtype)
    return buffer


def _reduce_history_buffer(buffer: HistoryBuffer):
    log_history, count_history = buffer.data
    return rebuild_history_buffer, (log_history.tolist(),
                                    count_history.tolist(), buffer.max_length,
                                    log_history.dtype.str,
                                    count_history.dtype.str)


def register_safe_history_buffer_pickling() -> None:
    """Make every ``HistoryBuffer`` pickle without ``builtins.getattr``."""
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)


def _numpy_globals() -> List[Callable]:
    # numpy 2 moved the reconstructors to ``numpy._core``; the pickles name
    # whichever module the writing numpy had, so allow the one present.
    multiarray = getattr(np, '_core', np.core).multiarray
    dtype_classes = [
        cls for cls in vars(np.dtypes).values()
        if isinstance(cls, type) and issubclass(cls, np.dtype)
    ] if hasattr(np, 'dtypes') else []
    return [multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype
            ] + dtype_classes


def safe_globals() -> List[Callable]:
    """The data-only constructors our checkpoints may reference."""
    return [rebuild_history_buffer] + _numpy_globals()


def _global_name(obj) -> str:
    return f'{obj.__module__}.{obj.__qualname__}'


def trusted_checkpoints() -> List[str]:
    """Real paths of the checkpoints the user opted in for."""
    paths = os.environ.get(TRUSTED_CHECKPOINTS_ENV, '')
    return [osp.realpath(p) for p in paths.split(os.pathsep) if p]


def trust_checkpoint(filename: str) -> None:
    """Opt in for one checkpoint file, for this process and its children."""
    trusted = trusted_checkpoints() + [osp.realpath(filename)]
    os.environ[TRUSTED_CHECKPOINTS_ENV] = os.pathsep.join(trusted)


def _unsafe_globals_of(filename: str) -> List[str]:
    allowed = {_global_name(g) for g in safe_globals()}
    found = torch.serialization.get_unsafe_globals_in_checkpoint(filename)
    return sorted(g for g in found if g not in allowed)


def _refusal(filename: str, unsafe: List[str]) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f'Refusing to load checkpoint "{filename}": it references globals '
        f'outside the safe allow-list: {unsafe}. Checkpoints written by '
        'stock mmengine 0.10.x pickle HistoryBuffer methods through '
        '`builtins.getattr`, which can run arbitrary code. If you trust this '
        'file, opt in for it explicitly: pass `--trust-checkpoint '
        f'{filename}` to tools/train.py, or set '
        f'{TRUSTED_CHECKPOINTS_ENV}={filename}. Checkpoints saved while '
        'mmdata_plugin is imported load without this step.')


def load_from_local_safely(filename: str, map_location=None):
    """Load a local checkpoint with ``weights_only=True``.

    Args:
        filename (str): Local checkpoint path.
        map_location: Same as :func:`torch.load`.

    Returns:
        dict: The loaded checkpoint.

    Raises:
        FileNotFoundError: If ``filename`` does not exist.
        UnsafeCheckpointError: If the file needs globals outside
            :func:`safe_globals` and the user did not trust it.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    with torch.serialization.safe_globals(safe_globals()):
        try:
            return torch.load(
                filename, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError:
            unsafe = _unsafe_globals_of(filename)
            if not unsafe:
                raise
    if osp.realpath(filename) not in trusted_checkpoints():
        raise _refusal(filename, unsafe)
    print_log(
        f'Loading "{filename}" without weights_only restrictions because '
        f'the user trusted it explicitly ({TRUSTED_CHECKPOINTS_ENV}); it '
        f'references {unsafe}.',
        logger='current')
    return torch.load(filename, map_location=map_location, weights_only=False)


def _with_safe_globals(loader: Callable) -> Callable:
    """Run one of mmengine's remote loaders under our allow-list."""

    def load(filename: str, map_location=None):
        with torch.serialization.safe_globals(safe_globals()):
            try:
                return loader(filename, map_location)
            except pickle.UnpicklingError as error:
                raise UnsafeCheckpointError(
                    f'Refusing to load checkpoint "{filename}" with '
                    f'weights_only=True ({error}). If you trust it, copy it '
                    'to a local file and pass `--trust-checkpoint PATH` to '
                    f'tools/train.py (or set {TRUSTED_CHECKPOINTS_ENV}).'
                ) from error

    load.__name__ = loader.__name__
    return load


# mmengine's own schemes, re-registered with the allow-list in force. The
# prefixes are those mmengine 0.10.x registers for these functions.
_REMOTE_LOADERS = ((('http://', 'https://'), load_from_http),
                   (r'(\S+\:)?s3://', load_from_ceph),
                   (('modelzoo://', 'torchvision://'), load_from_torchvision),
                   (('open-mmlab://', 'openmmlab://'), load_from_openmmlab))


def install_safe_checkpoint_loading() -> bool:
    """Route mmengine's checkpoint loading through the safe loaders.

    Uses mmengine's public ``CheckpointLoader.register_scheme`` extension
    point. Torch builds older than 2.5 lack scoped allow-lists; there the
    stock loaders are kept.

    Returns:
        bool: Whether the safe loaders were installed.
    """
    register_safe_history_buffer_pickling()
    if not hasattr(torch.serialization, 'safe_globals'):
        return False
    CheckpointLoader.register_scheme('', load_from_local_safely, force=True)
    for prefixes, loader in _REMOTE_LOADERS:
        CheckpointLoader.register_scheme(
            prefixes, _with_safe_globals(loader), force=True)
    return True
