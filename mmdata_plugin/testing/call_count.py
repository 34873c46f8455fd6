"""Count the calls a piece of code makes into the files of one package.

Which code runs, and how often, is deterministic where its time is not: on
a shared machine a cost of a microsecond in a 300 us sample is below the
noise of any timing, but a count shows whether instrumentation runs once
per batch or once per sample (tests and tools/benchmark_monitor_overhead.py
use it on the data monitor).
"""
import sys
from collections import Counter
from typing import Any, Callable, Tuple


def count_calls(fn: Callable[[], Any], where: str) -> Tuple[Any, Counter]:
    """Run ``fn()`` in this thread, counting calls into code under ``where``.

    Args:
        fn (callable): What to run (no arguments).
        where (str): Part of a source file path (e.g.
            ``'mmdata_plugin/data_monitor/'``): Python functions defined in
            such files are counted, and so are the builtins they call
            (clock reads, ``dict.get``), under ``'caller>builtin'``.

    Returns:
        tuple: ``fn()``'s result and a Counter of calls by qualified name.
    """
    calls: Counter = Counter()

    def profile(frame, event, arg):
        code = frame.f_code
        if where not in code.co_filename:
            return
        if event == 'call':
            calls[code.co_qualname] += 1
        elif event == 'c_call':
            calls[f'{code.co_qualname}>{arg.__qualname__}'] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(previous)
    return result, calls
