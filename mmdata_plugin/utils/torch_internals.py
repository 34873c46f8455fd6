"""Every private torch and mmengine name the package uses, and only here.

A private name can change in any release without notice; kept in this one
module, each has a named function, a note of the releases it was checked
on and how they differ, and a test of the compatibility selection
(``pytest -m compat``) that runs it on every torch/mmengine of the matrix.
``tests/test_utils/test_torch_internals_confined.py`` fails on a private
torch/mmengine name anywhere else in the package.

"Checked on" means the source of these releases was read and the
selection passed on them: torch 2.1.2, 2.4.1, 2.13.0, 2.14.1; mmengine
0.10.3, 0.10.7 and onedl-mmengine 0.10.12.
"""
import codecs
import pickle
import pickletools
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from collections import Counter, OrderedDict
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Callable, Iterator, List, Optional, Set, Tuple

import torch
import torch._weights_only_unpickler as weights_only_unpickler
from mmengine.utils import digit_version
from torch.utils.data import DataLoader
from torch.utils.data._utils import pin_memory as torch_pin_memory
from torch.utils.data._utils import worker as torch_worker
from torch.utils.data.dataloader import _BaseDataLoaderIter

# -------------------------------------------------------------- imports

#: What torch imports lazily at a training run's first optimizer step (the
#: optimizers ask ``torch._dynamo`` whether they are compiled; 2.1-2.14):
#: an interpreter forked for many runs imports it once, before it forks.
LAZY_TRAINING_MODULES: Tuple[str, ...] = ('torch._dynamo', )

# ----------------------------------------------------------- DataLoader


def started_iterator(loader: DataLoader):
    """The iterator a DataLoader keeps for its persistent workers, or None.

    ``DataLoader._iterator`` (set by ``_get_iterator`` when
    ``persistent_workers``; None before) is the same on every release
    checked.
    """
    return getattr(loader, '_iterator', None)


def forget_started_iterator(loader: DataLoader) -> None:
    """Make the next ``iter(loader)`` start new workers (same releases as
    :func:`started_iterator`)."""
    loader._iterator = None


def is_dataloader_iterator(obj: Any) -> bool:
    """Whether ``obj`` is an iterator a DataLoader made.

    ``_BaseDataLoaderIter`` is the base of the single- and multi-process
    iterators on every release checked (torch has no public name for it).
    """
    return isinstance(obj, _BaseDataLoaderIter)


def shutdown_workers(iterator) -> None:
    """Stop a DataLoader iterator's workers, if it has any.

    torch's multi-process iterator stops them in ``_shutdown_workers``
    (every release checked; the single-process one has none). The package's
    own streams (``RayBatchStream``) take the public ``shutdown_workers``.
    """
    stop = getattr(iterator, '_shutdown_workers', None) or getattr(
        iterator, 'shutdown_workers', None)
    if stop is not None:
        stop()


def pin_memory(batch, *args, **kwargs):
    """torch's recursive pinning of a batch, as ``pin_memory=True`` does.

    ``torch.utils.data._utils.pin_memory.pin_memory(data, device=None)``
    on every release checked (2.1's ``device`` is ignored on CPU-only
    builds as later ones ignore it).
    """
    return torch_pin_memory.pin_memory(batch, *args, **kwargs)


def act_as_worker(dataset: Any, seed: int) -> None:
    """Make ``get_worker_info()`` of this process answer as in worker 0 of 1.

    ``get_worker_info()`` returns the module global ``_worker_info`` of
    ``torch.utils.data._utils.worker``, a ``WorkerInfo(**kwargs)``, on
    every release checked.
    """
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=0, num_workers=1, seed=seed, dataset=dataset)


# -------------------------------------------------------------- storages


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    """A storage of ``nbytes`` born in shared memory (no copy).

    The public ``share_memory_()`` copies an existing storage; the
    DataLoader's collate allocates with ``UntypedStorage._new_shared`` on
    every release checked.
    """
    return torch.UntypedStorage._new_shared(nbytes)


def storage_of_segment(fd: int, nbytes: int) -> torch.UntypedStorage:
    """A storage over the shared-memory segment of ``fd`` (``nbytes``).

    torch's public API cannot wrap an existing segment; the DataLoader's
    receiving side (``rebuild_storage_fd``) uses
    ``UntypedStorage._new_shared_fd_cpu(fd, size)`` on every release
    checked.
    """
    return torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)


# ------------------------------------------------------------ checkpoints


def tensor_and_storage_classes() -> Set[type]:
    """torch's legacy tensor and storage classes (``torch.FloatTensor``,
    ``torch.FloatStorage``...): ``torch._tensor_classes`` and
    ``torch._storage_classes`` on every release checked."""
    return set(torch._tensor_classes) | set(torch._storage_classes)


def archive_record(opened, name: str) -> Optional[bytes]:
    """Record ``name`` of a torch zip checkpoint read by torch.load's own
    reader (``torch._C.PyTorchFileReader``, the same on every release
    checked), or None where the archive has none."""
    reader = torch._C.PyTorchFileReader(opened)
    if not reader.has_record(name):
        return None
    return reader.get_record(name)


def read_global_instruction(readline: Callable) -> Tuple[str, str]:
    """Module and name of a pickle GLOBAL, as the weights-only load resolves
    it: Python 2 names mapped to Python 3's (``__builtin__.bytes`` is
    ``builtins.bytes``).

    torch >= 2.6 has ``_read_global_instruction``; torch 2.1 and 2.4 read
    the two lines unmapped, but there :func:`weights_only_load` unpickles
    with :class:`_WeightsOnlyUnpickler`, which maps them as 2.6 does.
    """
    read = getattr(weights_only_unpickler, '_read_global_instruction', None)
    if read is not None:
        return read(readline)
    module = readline()[:-1].decode('utf-8')
    name = readline()[:-1].decode('utf-8')
    if (module, name) in NAME_MAPPING:
        return NAME_MAPPING[(module, name)]
    return IMPORT_MAPPING.get(module, module), name


#: torch >= 2.6 takes ``(callable, "module.name")`` entries in
#: ``add_safe_globals`` and BUILDs objects of allow-listed types; its
#: weights-only unpickler does the rest. torch 2.1 BUILDs only tensors,
#: parameters and OrderedDicts, 2.4 takes no such entries.
_TORCH_BINDS_NAMES = digit_version(torch.__version__) >= digit_version('2.6.0')
#: What torch 2.13's weights-only unpickler allows by default beyond 2.1's
#: list (pickle writes bytes, bytearrays, sets and complex numbers so).
_NEWER_DEFAULTS = {
    '_codecs.encode': codecs.encode,
    'builtins.bytearray': bytearray,
    'builtins.set': set,
    'builtins.complex': complex,
    'collections.Counter': Counter,
}


def _entry_name(entry) -> str:
    if isinstance(entry, tuple):
        return entry[1]
    return f'{entry.__module__}.{entry.__qualname__}'


@contextmanager
def _torch_safe_globals(entries: List[Tuple[Callable, str]]) -> Iterator[None]:
    """``entries`` in torch's allow-list (>= 2.6) for the block.

    The user's own ``add_safe_globals`` entries stay in force except those
    under the names ``entries`` take, and torch's list is exactly as it was
    afterwards.
    """
    saved = torch.serialization.get_safe_globals()
    names = {name for _, name in entries}
    kept = [entry for entry in saved if _entry_name(entry) not in names]
    torch.serialization.clear_safe_globals()
    torch.serialization.add_safe_globals(kept + entries)
    try:
        yield
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(saved)


def _allowed_globals(entries: List[Tuple[Callable, str]]) -> dict:
    """Name -> object the fallback unpickler allows: torch's defaults, 2.13's
    additions, the user's ``add_safe_globals`` (2.4), then ``entries``."""
    allowed = dict(weights_only_unpickler._get_allowed_globals())
    allowed.update(_NEWER_DEFAULTS)
    user = getattr(weights_only_unpickler, '_get_user_allowed_globals', None)
    if user is not None:
        allowed.update(user())
    allowed.update({name: obj for obj, name in entries})
    return allowed


class _WeightsOnlyUnpickler(pickle._Unpickler):
    """torch 2.13's weights-only unpickling rules, for torch 2.1 and 2.4.

    Python's own unpickler, limited to the opcodes torch's weights-only
    unpickler reads and, like it, calling, building and naming only what
    the allow-list holds; containers are extended only if they are lists
    and dicts. Any other opcode is an ``UnpicklingError``.
    """

    def __init__(self, file, allowed: dict, **kwargs):
        super().__init__(file, **kwargs)
        self.allowed = allowed
        self.allowed_objects = list(allowed.values())

    def _is_allowed(self, obj) -> bool:
        return any(obj is allowed for allowed in self.allowed_objects)

    def load_global(self):
        module, name = read_global_instruction(self.readline)
        full_path = f'{module}.{name}'
        if full_path not in self.allowed:
            raise pickle.UnpicklingError(
                f'Unsupported global: GLOBAL {full_path} was not an allowed '
                'global')
        self.append(self.allowed[full_path])

    def load_newobj(self):
        args = self.stack.pop()
        cls = self.stack.pop()
        if cls is torch.nn.Parameter:
            self.append(torch.nn.Parameter(*args))
        elif self._is_allowed(cls):
            self.append(cls.__new__(cls, *args))
        else:
            raise pickle.UnpicklingError(
                f'Can only create new object for allowed classes, got {cls}')

    def load_reduce(self):
        args = self.stack.pop()
        func = self.stack[-1]
        if not self._is_allowed(func):
            raise pickle.UnpicklingError(
                f'Trying to call reduce for unrecognized function {func}')
        self.stack[-1] = func(*args)

    def load_build(self):
        inst = self.stack[-2]
        if type(inst) is torch.Tensor:
            inst.set_(*self.stack.pop())
        elif type(inst) is torch.nn.Parameter:
            inst.__setstate__(self.stack.pop())
        elif type(inst) is OrderedDict:
            inst.__dict__.update(self.stack.pop())
        elif self._is_allowed(type(inst)):
            super().load_build()
        else:
            raise pickle.UnpicklingError(
                'Can only build Tensor, Parameter, OrderedDict or allowed '
                f'types, but got {type(inst)}')

    def load_append(self):
        if type(self.stack[-2]) is not list:
            raise pickle.UnpicklingError('Can only APPEND to lists')
        super().load_append()

    def load_appends(self):
        if type(self.metastack[-1][-1]) is not list:
            raise pickle.UnpicklingError('Can only APPENDS to lists')
        super().load_appends()

    def load_setitem(self):
        if type(self.stack[-3]) not in (dict, OrderedDict, Counter):
            raise pickle.UnpicklingError('Can only SETITEM in dicts')
        super().load_setitem()

    def load_setitems(self):
        if type(self.metastack[-1][-1]) not in (dict, OrderedDict, Counter):
            raise pickle.UnpicklingError('Can only SETITEMS in dicts')
        super().load_setitems()

    def load_binpersid(self):
        pid = self.stack[-1]
        if type(pid) is not int and not (
                type(pid) is tuple and pid and
                torch.serialization._maybe_decode_ascii(pid[0]) == 'storage'):
            raise pickle.UnpicklingError(
                'Only persistent_load of storage is allowed')
        super().load_binpersid()


class _Refusing(dict):
    """A dispatch table that refuses the opcodes it lacks."""

    def __missing__(self, opcode: int):
        raise pickle.UnpicklingError(f'Unsupported operand {opcode}')


# The opcodes the weights-only unpickler of torch 2.1 and 2.13 reads (the
# same set), each to this class's method.
_WeightsOnlyUnpickler.dispatch = _Refusing(
    (opcode[0],
     getattr(_WeightsOnlyUnpickler,
             pickle._Unpickler.dispatch[opcode[0]].__name__))
    for opcode in (pickle.GLOBAL, pickle.NEWOBJ, pickle.REDUCE, pickle.BUILD,
                   pickle.APPEND, pickle.APPENDS, pickle.SETITEM,
                   pickle.SETITEMS, pickle.MARK, pickle.TUPLE, pickle.TUPLE1,
                   pickle.TUPLE2, pickle.TUPLE3, pickle.NONE, pickle.NEWFALSE,
                   pickle.NEWTRUE, pickle.EMPTY_TUPLE, pickle.EMPTY_LIST,
                   pickle.EMPTY_DICT, pickle.EMPTY_SET, pickle.BININT,
                   pickle.BININT1, pickle.BININT2, pickle.BINFLOAT,
                   pickle.BINUNICODE, pickle.SHORT_BINSTRING,
                   pickle.BINPERSID, pickle.BINGET, pickle.LONG_BINGET,
                   pickle.BINPUT, pickle.LONG_BINPUT, pickle.LONG1,
                   pickle.PROTO, pickle.STOP))


def _fallback_pickle_module(entries: List[Tuple[Callable, str]]):
    """A ``pickle_module`` for ``torch.load`` that unpickles with
    :class:`_WeightsOnlyUnpickler` (torch.load calls ``Unpickler`` and, for
    the legacy format's header pickles, ``load``)."""
    allowed = _allowed_globals(entries)

    class Unpickler(_WeightsOnlyUnpickler):

        def __init__(self, file, **kwargs):
            super().__init__(file, allowed, **kwargs)

    def load(file, **kwargs):
        return Unpickler(file, **kwargs).load()

    # torch.load names the module in its messages (``__name__``).
    module = ModuleType(f'{__name__}.weights_only_pickle')
    module.Unpickler, module.load = Unpickler, load
    return module


def weights_only_load(file, map_location,
                      entries: List[Tuple[Callable, str]]):
    """``torch.load`` with weights-only rules and ``entries`` (``(callable,
    "module.name")``: the callable stands for that name) allowed.

    torch >= 2.6: ``weights_only=True`` with ``entries`` put in torch's
    allow-list for the call. torch 2.1 and 2.4: the same rules through
    :class:`_WeightsOnlyUnpickler` as ``pickle_module`` (``weights_only``
    would refuse a ``pickle_module``); torch's reader, persistent loads of
    storages and ``map_location`` are torch.load's own either way.
    """
    if _TORCH_BINDS_NAMES:
        with _torch_safe_globals(entries):
            return torch.load(
                file, map_location=map_location, weights_only=True)
    return torch.load(
        file, map_location=map_location, weights_only=False,
        pickle_module=_fallback_pickle_module(entries))


def unsafe_globals_in_checkpoint(file,
                                 entries: List[Tuple[Callable, str]]
                                 ) -> List[str]:
    """The globals of a zip checkpoint that :func:`weights_only_load` with
    ``entries`` would refuse (sorted).

    torch >= 2.6: ``get_unsafe_globals_in_checkpoint`` with ``entries`` in
    force; 2.1 and 2.4 lack it: the GLOBALs of ``data.pkl`` are listed
    (resolved as :func:`read_global_instruction` does) against the fallback
    unpickler's allow-list.

    Raises:
        Exception: Whatever torch's reader raises where ``file`` is no zip
            checkpoint.
    """
    if _TORCH_BINDS_NAMES:
        with _torch_safe_globals(entries):
            return sorted(
                torch.serialization.get_unsafe_globals_in_checkpoint(file))
    allowed = _allowed_globals(entries)
    found = set()
    for opcode, arg, _ in pickletools.genops(archive_record(file,
                                                            'data.pkl')):
        if opcode.name == 'GLOBAL':
            lines = iter(f'{part}\n'.encode() for part in arg.split(' ', 1))
            module, name = read_global_instruction(lambda: next(lines))
            found.add(f'{module}.{name}')
    return sorted(found - set(allowed))


# ------------------------------------------------------------- mmengine


def held_iterator(holder) -> Any:
    """The DataLoader iterator inside mmengine's
    ``_InfiniteDataloaderIterator`` (``_iterator``: made in ``__init__`` on
    0.10.3 and 0.10.7, lazily at the first ``next()`` on onedl 0.10.12,
    None until then), or None for any other object."""
    return getattr(holder, '_iterator', None)


def set_held_iterator(holder, iterator) -> None:
    """Replace the iterator :func:`held_iterator` returns."""
    holder._iterator = iterator


def diff_rank_seed(runner) -> bool:
    """Whether the runner adds the rank to its seed: ``randomness``'s
    ``diff_rank_seed``, kept only as ``Runner._randomness_cfg`` (0.10.3,
    0.10.7, onedl 0.10.12)."""
    return bool(runner._randomness_cfg.get('diff_rank_seed', False))


def rewind_infinite_sampler(sampler) -> None:
    """Restart an ``InfiniteSampler``'s index stream from its seed.

    It yields from one generator made in ``__init__`` by
    ``_indices_of_rank()`` (0.10.3, 0.10.7, onedl 0.10.12, whose ``skip``
    makes it the same way).
    """
    sampler.indices = sampler._indices_of_rank()


def set_loop_counters(loop, **counters: int) -> None:
    """Set mmengine train-loop counters (``epoch``, ``iter``,
    ``max_epochs``, ``max_iters``): public read-only properties over
    ``_epoch``, ``_iter``, ``_max_epochs``, ``_max_iters`` (0.10.3, 0.10.7,
    onedl 0.10.12)."""
    for name, value in counters.items():
        if name not in ('epoch', 'iter', 'max_epochs', 'max_iters'):
            raise AttributeError(f'a train loop has no counter {name!r}')
        setattr(loop, f'_{name}', value)


def decide_val_interval(loop) -> None:
    """The train loop's switch of validation interval at the dynamic
    milestones (``_decide_current_val_interval``, 0.10.3, 0.10.7, onedl
    0.10.12)."""
    loop._decide_current_val_interval()


def dataset_metainfo(dataset) -> dict:
    """A ``BaseDataset``'s meta information itself, to read or extend
    (``_metainfo``; the public ``metainfo`` is a deep copy), 0.10.3,
    0.10.7, onedl 0.10.12."""
    return dataset._metainfo


def dataset_initialized(dataset) -> bool:
    """Whether ``full_init`` has run (``_fully_initialized``, same
    releases)."""
    return dataset._fully_initialized


def mark_dataset_initialized(dataset) -> None:
    """What a ``full_init`` override sets when done (same releases)."""
    dataset._fully_initialized = True


def dataset_indices(dataset):
    """The ``indices`` argument of a ``BaseDataset`` (``_indices``, same
    releases)."""
    return dataset._indices


def copy_without_annotation(dataset) -> Any:
    """A ``BaseDataset`` copy sharing nothing but its annotations left out
    (``_copy_without_annotation()``, what ``get_subset`` uses; same
    releases)."""
    return dataset._copy_without_annotation()


def fill_history_buffer(buffer, log_history,
                        count_history) -> None:
    """Set a ``HistoryBuffer``'s arrays (``_log_history``,
    ``_count_history``; 0.10.3, 0.10.7, onedl 0.10.12)."""
    buffer._log_history = log_history
    buffer._count_history = count_history


def set_only_value(buffer, value: float) -> None:
    """Write ``value`` over the one value of a ``HistoryBuffer`` made with
    one (``_log_history[0]``; same releases), in place: no array made."""
    buffer._log_history[0] = value


def mmengine_home() -> str:
    """``MMENGINE_HOME`` as mmengine resolves it for its model tables
    (``mmengine.runner.checkpoint._get_mmengine_home``; same releases)."""
    from mmengine.runner import checkpoint
    return checkpoint._get_mmengine_home()


def process_mmcls_checkpoint(checkpoint: dict) -> dict:
    """mmengine's conversion of an mmcls checkpoint (``backbone.*`` keys
    kept): ``mmengine.runner.checkpoint._process_mmcls_checkpoint``, same
    releases."""
    from mmengine.runner import checkpoint as mmengine_checkpoint
    return mmengine_checkpoint._process_mmcls_checkpoint(checkpoint)


def package_and_cfg_path(path: str) -> Tuple[str, str]:
    """The package and config path of ``'package::relative/path.py'``
    (``mmengine.config.utils._get_package_and_cfg_path``, same releases)."""
    from mmengine.config.utils import _get_package_and_cfg_path
    return _get_package_and_cfg_path(path)
