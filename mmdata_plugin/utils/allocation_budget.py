"""How much memory the safe loader's constructors may allocate per load.

The pickle memo lets a file name one object many times for a few bytes
each: a list of a million numbers handed a thousand times to a rebuild
function would make the loader build a thousand arrays from a file of a few
megabytes. Every allocation our allow-listed constructors make is charged
against a budget proportional to the file's size, which real checkpoints
(whose numbers and array bytes all sit in the file) stay well within.
"""
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, List, Optional

#: Bytes our constructors may allocate per byte of checkpoint file: a
#: pickled number takes at least two bytes and becomes at most eight.
BYTES_PER_FILE_BYTE = 8
#: Allowance on top, so tiny files still hold small arrays.
BASE_BYTES = 1 << 20

_left: ContextVar[Optional[List[int]]] = ContextVar(
    'mmdata_plugin_allocation_budget', default=None)


class AllocationBudgetExceeded(ValueError):
    """A checkpoint would make the loader allocate far more than its size."""


@contextmanager
def allocation_budget(file_size: int) -> Iterator[None]:
    """Put the budget for a file of ``file_size`` bytes in force."""
    budget = BASE_BYTES + BYTES_PER_FILE_BYTE * file_size
    token = _left.set([budget])
    try:
        yield
    finally:
        _left.reset(token)


def charge(nbytes: int, what: str) -> None:
    """Count ``nbytes`` about to be allocated for ``what`` against the
    budget in force (none outside a safe load: nothing is charged)."""
    left = _left.get()
    if left is None:
        return
    if nbytes > left[0]:
        raise AllocationBudgetExceeded(
            f'{what} would allocate {nbytes} bytes, more than the '
            f'{left[0]} bytes left of what a checkpoint of this size may '
            f'make the loader allocate ({BYTES_PER_FILE_BYTE}x its size plus '
            f'{BASE_BYTES}); the file names the same data many times')
    left[0] -= nbytes
