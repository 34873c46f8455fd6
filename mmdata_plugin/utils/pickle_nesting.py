"""How deeply a checkpoint's pickle nests tuples, found without unpickling.

CPython hashes a tuple by hashing its items recursively in C, with no
recursion guard: a key or set member made of a million nested tuples (one
byte of pickle per level) overflows the C stack and the process dies with
SIGSEGV, inside torch's ``weights_only`` unpickler, before any of our code
could refuse it. Lists and dicts are unhashable, and no allow-listed callable
builds nested tuples, so every deep chain of hashable containers is a chain
of the pickle's own TUPLE opcodes. :func:`check_tuple_nesting` replays the
opcodes torch's unpickler accepts, tracking only how deep each tuple nests,
and refuses a pickle whose nesting exceeds :data:`MAX_TUPLE_NESTING`.

The replay reads exactly what torch's unpickler reads; where torch's
unpickler fails (unknown opcode, empty stack, missing memo entry, end of
data) the replay stops, since torch stops there too.
"""
import io
import pickle
from struct import unpack
from typing import BinaryIO, Union

import torch

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
    pickle.NONE[0], pickle.NEWFALSE[0], pickle.NEWTRUE[0],
    pickle.EMPTY_LIST[0], pickle.EMPTY_DICT[0], pickle.EMPTY_SET[0],
    *_OPERAND_BYTES
}


class TupleNestingTooDeep(ValueError):
    """A pickle nests tuples deeper than :data:`MAX_TUPLE_NESTING`."""


class _Stop(Exception):
    """Where torch's unpickler fails too."""


class _NestingReplay:
    """Replays one pickle; stack items are tuple nesting depths (0: other
    objects)."""

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
        depth = 1 + max(items, default=0)
        if depth > MAX_TUPLE_NESTING:
            raise TupleNestingTooDeep(
                f'the pickle nests tuples more than {MAX_TUPLE_NESTING} deep, '
                'which would crash the interpreter when they are hashed')
        self.stack.append(depth)

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

    def _step(self, op: int) -> bool:
        stack = self.stack
        if op in _PUSH_ONE:
            self._read_exactly(_OPERAND_BYTES.get(op, 0))
            if op != pickle.PROTO[0]:
                stack.append(0)
        elif op == pickle.STOP[0]:
            return False
        elif op == pickle.GLOBAL[0]:
            self.readline()
            self.readline()
            stack.append(0)
        elif op in (pickle.BINUNICODE[0], pickle.SHORT_BINSTRING[0],
                    pickle.LONG1[0]):
            if op == pickle.BINUNICODE[0]:
                size = unpack('<I', self._read_exactly(4))[0]
            else:
                size = self._read_exactly(1)[0]
            self._read_exactly(size)
            stack.append(0)
        elif op in (pickle.NEWOBJ[0], pickle.REDUCE[0]):
            self._pop()
            self._pop()
            stack = self.stack
            stack.append(0)
        elif op == pickle.BINPERSID[0]:
            self._pop()
            self.stack.append(0)
        elif op in (pickle.BUILD[0], pickle.APPEND[0]):
            self._pop()
            if not self.stack:
                raise _Stop
        elif op == pickle.SETITEM[0]:
            self._pop()
            self._pop()
            if not self.stack:
                raise _Stop
        elif op in (pickle.APPENDS[0], pickle.SETITEMS[0]):
            self._pop_mark()
            if not self.stack:
                raise _Stop
        elif op == pickle.MARK[0]:
            self.metastack.append(stack)
            self.stack = []
        elif op == pickle.TUPLE[0]:
            items = self._pop_mark()
            self._push_tuple(items)
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

    def _memo_index(self, short: bool) -> int:
        if short:
            return self._read_exactly(1)[0]
        return unpack('<I', self._read_exactly(4))[0]


def _check_pickles(file: BinaryIO, count: int) -> None:
    for _ in range(count):
        if not _NestingReplay(file).run():
            return


def check_tuple_nesting(source: Union[str, bytes]) -> None:
    """Raise TupleNestingTooDeep if any pickle torch would load from
    ``source`` (a path or the file's bytes) nests tuples too deeply."""
    opened = io.BytesIO(source) if isinstance(source, bytes) else open(
        source, 'rb')
    with opened:
        # torch.load's own test for its zip format (the file's first bytes).
        is_zip = opened.read(len(ZIP_MAGIC)) == ZIP_MAGIC
        opened.seek(0)
        if not is_zip:
            _check_pickles(opened, _LEGACY_PICKLES)
            return
        # torch.load's own reader, so the record checked is the one torch
        # unpickles (the archive's 'data.pkl', however the zip is built).
        reader = torch._C.PyTorchFileReader(opened)
        if reader.has_record('data.pkl'):
            _check_pickles(io.BytesIO(reader.get_record('data.pkl')), 1)
