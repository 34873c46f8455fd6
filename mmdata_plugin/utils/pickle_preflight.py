"""What a checkpoint's pickle would do, checked before torch unpickles it.

Two things torch's ``weights_only`` unpickler lets a file do with only the
globals it allows by default, before any of our code could refuse it:

* crash the process: CPython hashes a tuple by hashing its items
  recursively in C, with no recursion guard, so a dict key or set member of
  a million nested tuples (one byte of pickle per level) overflows the C
  stack (SIGSEGV). Lists and dicts are unhashable and no allowed callable
  builds nested tuples, so every such chain is made of the pickle's own
  TUPLE opcodes; deeper than :data:`MAX_TUPLE_NESTING` is refused.
* exhaust memory: ``bytearray(N)`` allocates N bytes, ``_codecs.encode``
  with the ``hex`` codec doubles its input (35 calls: 32 GiB from 2 KB),
  the memo lets one string be encoded, or one list copied into a set, again
  and again, and ``torch.FloatTensor(N)`` allocates N floats. Tensor
  classes may not be called at all; only the calls pickle itself writes for
  bytes (``encode(str, 'latin1')``) and bytearrays
  (``bytearray(encode(...))``, ``bytearray()``) are accepted; their output,
  and every list or dict handed to a callable, is charged against the
  load's allocation budget.

:func:`check_pickles` replays the opcodes torch's unpickler accepts,
reading exactly what it reads and tracking only tuple depths and the few
literal values these checks need. Where torch's unpickler fails (unknown
opcode, empty stack, missing memo entry, end of data) the replay stops,
since torch stops there too.
"""
import io
import pickle
import zipfile
from struct import unpack
from typing import BinaryIO, Union

from .allocation_budget import charge
# The weights-only load's own name resolution for GLOBAL (its protocol-2
# name mappings), so the names checked are the names it looks up.
from .torch_internals import (archive_record, read_global_instruction,
                              tensor_and_storage_classes)

#: Deeper than any real checkpoint nests tuples; far below a C stack (and
#: below the Python recursion limit that walking the result meets).
MAX_TUPLE_NESTING = 100

# torch's legacy format: magic number, protocol, sys info, the checkpoint,
# storage keys, each its own pickle, then raw storage bytes.
_LEGACY_PICKLES = 5
#: How every zip archive starts (torch.load's own test for its format).
ZIP_MAGIC = b'PK\x03\x04'

_OPERAND_BYTES = {
    pickle.BININT[0]: 4,
    pickle.BININT1[0]: 1,
    pickle.BININT2[0]: 2,
    pickle.BINFLOAT[0]: 8,
    pickle.PROTO[0]: 1,
}
_PUSH_ONE = {
    pickle.NONE[0], pickle.NEWFALSE[0], pickle.NEWTRUE[0], *_OPERAND_BYTES
}
_EMPTY_CONTAINERS = {
    pickle.EMPTY_LIST[0], pickle.EMPTY_DICT[0], pickle.EMPTY_SET[0]
}
# torch's tensor and storage classes, which torch's unpickler lets a
# pickle call: torch.FloatTensor(N) allocates N uninitialised floats,
# torch.storage.UntypedStorage(N) N bytes. torch.save never calls them
# (tensors come from storages through torch's _rebuild_* functions, storages
# from the archive's records through persistent ids).
_TENSOR_CLASSES = {
    'torch.Tensor', 'torch.storage.UntypedStorage',
    'torch.storage.TypedStorage'
} | {
    f'{cls.__module__}.{cls.__name__}'
    for cls in tensor_and_storage_classes()
}

#: What a callable handed a container is charged per item (a pointer: real
#: copies cost more; the charge only has to grow with every reuse).
BYTES_PER_ITEM = 8


class TupleNestingTooDeep(ValueError):
    """A pickle nests tuples deeper than :data:`MAX_TUPLE_NESTING`."""


class UnexpectedAllocation(ValueError):
    """A pickle calls an allocating callable as pickle itself never does."""


class _Stop(Exception):
    """Where torch's unpickler fails too."""


_OTHER = (0, None)
# Pickle's own spelling of the codec it writes bytes with.
_LATIN1 = ('str', b'latin1')


class _Replay:
    """Replays one pickle. Stack items are ``(tuple depth, value)``; value
    is ``('global', name)``, ``('str', bytes)``, ``('bytes', size)``,
    ``('tuple', values)``, ``('container', [item count])`` (a list or dict,
    counted as it grows) or None (anything else)."""

    def __init__(self, file: BinaryIO):
        self.read = file.read
        self.readline = file.readline
        self.stack = []
        self.metastack = []
        self.memo = {}

    def _pop(self):
        if not self.stack:
            raise _Stop
        return self.stack.pop()

    def _pop_mark(self):
        if not self.metastack:
            raise _Stop
        items, self.stack = self.stack, self.metastack.pop()
        return items

    def _push_tuple(self, items):
        depth = 1 + max((item[0] for item in items), default=0)
        if depth > MAX_TUPLE_NESTING:
            raise TupleNestingTooDeep(
                f'the pickle nests tuples more than {MAX_TUPLE_NESTING} deep, '
                'which would crash the interpreter when they are hashed')
        self.stack.append((depth, ('tuple', [item[1] for item in items])))

    def _read_exactly(self, size: int) -> bytes:
        data = self.read(size)
        if len(data) < size:
            raise _Stop
        return data

    def run(self) -> bool:
        """Replay up to STOP; False where torch's unpickler fails."""
        try:
            while self._step(self._read_exactly(1)[0]):
                pass
        except _Stop:
            return False
        return True

    def _call(self, func, args) -> tuple:
        """The item a REDUCE of ``func`` on ``args`` leaves."""
        name = func[1] if func and func[0] == 'global' else None
        args = args[1] if args and args[0] == 'tuple' else None
        # set(L), Counter(L), torch.Size(T)... copy L or T: a memoised one
        # handed over again and again must not multiply memory for free.
        for arg in args or ():
            _charge_copy(arg, f'{name or "a callable"} copying a container')
        if name in _TENSOR_CLASSES:
            raise UnexpectedAllocation(
                f'the pickle calls {name} (torch.save never does; it would '
                'allocate a tensor or storage of any size the file names)')
        if name == '_codecs.encode':
            if (args is None or len(args) != 2 or args[1] != _LATIN1
                    or not args[0] or args[0][0] != 'str'):
                raise UnexpectedAllocation(
                    'the pickle calls _codecs.encode other than as '
                    "encode(string, 'latin1'), the only way pickle writes "
                    'bytes (other codecs multiply the size of their input)')
            size = len(args[0][1])
            charge(size, 'bytes encoded by the pickle')
            return (0, ('bytes', size))
        if name == 'builtins.bytearray':
            if args is None or len(args) > 1 or (
                    args and (not args[0] or args[0][0] != 'bytes')):
                raise UnexpectedAllocation(
                    'the pickle calls bytearray other than as bytearray() '
                    'or bytearray(bytes), the ways pickle writes one '
                    '(bytearray(N) allocates N bytes)')
            if args:
                charge(args[0][1], 'a bytearray copied by the pickle')
        return _OTHER

    def _step(self, op: int) -> bool:
        stack = self.stack
        if op in _PUSH_ONE:
            self._read_exactly(_OPERAND_BYTES.get(op, 0))
            if op != pickle.PROTO[0]:
                stack.append(_OTHER)
        elif op in _EMPTY_CONTAINERS:
            stack.append((0, ('container', [0])))
        elif op == pickle.STOP[0]:
            return False
        elif op == pickle.GLOBAL[0]:
            module, name = read_global_instruction(self.readline)
            stack.append((0, ('global', f'{module}.{name}')))
        elif op in (pickle.BINUNICODE[0], pickle.SHORT_BINSTRING[0],
                    pickle.LONG1[0]):
            if op == pickle.BINUNICODE[0]:
                size = unpack('<I', self._read_exactly(4))[0]
            else:
                size = self._read_exactly(1)[0]
            data = self._read_exactly(size)
            stack.append((0, ('str', data)) if op != pickle.LONG1[0] else
                         _OTHER)
        elif op in (pickle.NEWOBJ[0], pickle.REDUCE[0]):
            args = self._pop()[1]
            func = self._pop()[1]
            self.stack.append(self._call(func, args))
        elif op == pickle.BINPERSID[0]:
            self._pop()
            self.stack.append(_OTHER)
        elif op == pickle.BUILD[0]:
            # The state is copied into the object (__dict__.update).
            _charge_copy(self._pop()[1], 'an object built from a container')
            self._grow(0)
        elif op == pickle.APPEND[0]:
            self._pop()
            self._grow(1)
        elif op == pickle.SETITEM[0]:
            self._pop()
            self._pop()
            self._grow(1)
        elif op in (pickle.APPENDS[0], pickle.SETITEMS[0]):
            items = len(self._pop_mark())
            self._grow(items if op == pickle.APPENDS[0] else items // 2)
        elif op == pickle.MARK[0]:
            self.metastack.append(stack)
            self.stack = []
        elif op == pickle.TUPLE[0]:
            self._push_tuple(self._pop_mark())
        elif op in (pickle.TUPLE1[0], pickle.TUPLE2[0], pickle.TUPLE3[0]):
            size = 1 + (pickle.TUPLE1[0], pickle.TUPLE2[0],
                        pickle.TUPLE3[0]).index(op)
            if len(stack) < size:
                raise _Stop
            items = stack[-size:]
            del stack[-size:]
            self._push_tuple(items)
        elif op == pickle.EMPTY_TUPLE[0]:
            self._push_tuple([])
        elif op in (pickle.BINGET[0], pickle.LONG_BINGET[0]):
            index = self._memo_index(op == pickle.BINGET[0])
            if index not in self.memo:
                raise _Stop
            stack.append(self.memo[index])
        elif op in (pickle.BINPUT[0], pickle.LONG_BINPUT[0]):
            index = self._memo_index(op == pickle.BINPUT[0])
            if not stack:
                raise _Stop
            self.memo[index] = stack[-1]
        else:
            raise _Stop
        return True

    def _grow(self, items: int) -> None:
        """Count ``items`` added to the container on top of the stack."""
        if not self.stack:
            raise _Stop
        value = self.stack[-1][1]
        if value and value[0] == 'container':
            value[1][0] += items

    def _memo_index(self, short: bool) -> int:
        if short:
            return self._read_exactly(1)[0]
        return unpack('<I', self._read_exactly(4))[0]


def _charge_copy(value, what: str) -> None:
    """Charge a copy of a list, dict or tuple of the replay."""
    if value and value[0] == 'container':
        charge(value[1][0] * BYTES_PER_ITEM, what)
    elif value and value[0] == 'tuple':
        charge(len(value[1]) * BYTES_PER_ITEM, what)


def _check_pickles(file: BinaryIO, count: int) -> None:
    for _ in range(count):
        if not _Replay(file).run():
            return


def _check_stored(archive: BinaryIO) -> None:
    """Refuse an archive with a compressed record: torch.save stores every
    record as is, and torch's reader inflates one to whatever size it says
    (a 200 KB file held 200 MB of pickle)."""
    try:
        with zipfile.ZipFile(archive) as listing:
            records = listing.infolist()
    except (zipfile.BadZipFile, ValueError) as error:
        raise UnexpectedAllocation(
            f'not an archive torch.save writes ({error})') from error
    finally:
        archive.seek(0)
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED:
            raise UnexpectedAllocation(
                f'the archive compresses {record.filename} (torch.save '
                'never does; it would inflate to '
                f'{record.file_size} bytes from {record.compress_size})')


def check_pickles(source: Union[str, bytes]) -> None:
    """Check every pickle torch would load from ``source`` (a path or the
    file's bytes); allocations are charged to the budget in force.

    Raises:
        TupleNestingTooDeep: If tuples nest too deeply.
        UnexpectedAllocation: If an allocating callable is called other than
            as pickle calls it.
        AllocationBudgetExceeded: If the pickle's bytes would exceed the
            allocation budget.
    """
    opened = io.BytesIO(source) if isinstance(source, bytes) else open(
        source, 'rb')
    with opened:
        # torch.load's own test for its zip format (the file's first bytes).
        is_zip = opened.read(len(ZIP_MAGIC)) == ZIP_MAGIC
        opened.seek(0)
        if not is_zip:
            _check_pickles(opened, _LEGACY_PICKLES)
            return
        _check_stored(opened)
        # torch.load's own reader, so the record checked is the one torch
        # unpickles (the archive's 'data.pkl', however the zip is built).
        pickled = archive_record(opened, 'data.pkl')
        if pickled is not None:
            _check_pickles(io.BytesIO(pickled), 1)
