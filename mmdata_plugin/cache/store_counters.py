"""Per-namespace event counters of a node store, summed over processes.

Each process counts into its own small file in ``<cache_dir>/stats``, mapped
into memory (``MAP_SHARED``): an increment is one store into a page, with
no system call and no lock, and any process (the DataMonitorHook in the main
process) reads every worker's current counts by summing the files. Counts of
processes that have exited are folded into the ledger by
:meth:`StoreCounters.retire`, so the files do not pile up.
"""
import json
import os
import threading
import uuid
from typing import Callable, Dict, Iterable, Tuple

import numpy as np

from .process_owner import current_owner, owner_file_name

COUNTER_NAMES = ('hits', 'misses', 'produced', 'waited', 'bypassed',
                 'evicted_entries', 'evicted_bytes', 'produced_bytes',
                 'wait_us', 'corrupt')
MAX_NAMESPACES = 32
_SUFFIX = '.counters'

Counts = Dict[str, Dict[str, int]]


class StoreCounters:
    """Counters of one store directory.

    Args:
        stats_dir (str): ``<cache_dir>/stats``.
    """

    def __init__(self, stats_dir: str):
        self.stats_dir = stats_dir
        self._pid = None
        self._array = None
        self._namespaces: Dict[str, int] = {}
        self._lock = threading.Lock()

    def __getstate__(self):
        return {'stats_dir': self.stats_dir}

    def __setstate__(self, state):
        self.__init__(state['stats_dir'])

    def add(self, namespace: str, name: str, value: int = 1) -> None:
        """Add ``value`` to counter ``name`` of ``namespace``."""
        with self._lock:
            if self._pid != os.getpid():
                self._open_own_file()
            row = self._namespaces.get(namespace)
            if row is None:
                row = self._register(namespace)
            self._array[row, COUNTER_NAMES.index(name)] += value

    def _open_own_file(self) -> None:
        # after a fork the child must not count into its parent's file
        self._pid = os.getpid()
        self._array = None
        self._namespaces = {}
        self._base = os.path.join(
            self.stats_dir, owner_file_name(current_owner(), uuid.uuid4().hex))

    def _register(self, namespace: str) -> int:
        if len(self._namespaces) >= MAX_NAMESPACES:
            raise ValueError(
                f'a node store counts at most {MAX_NAMESPACES} namespaces; '
                f'{namespace!r} is one too many')
        self._namespaces[namespace] = len(self._namespaces)
        names = self._base + '.names'
        with open(names + '.tmp', 'w') as file:
            json.dump(list(self._namespaces), file)
        os.replace(names + '.tmp', names)
        if self._array is None:
            self._array = np.memmap(
                self._base + _SUFFIX, dtype=np.int64, mode='w+',
                shape=(MAX_NAMESPACES, len(COUNTER_NAMES)))
        return self._namespaces[namespace]

    def files(self) -> Iterable[Tuple[str, str]]:
        """``(owner file name, base path)`` of every process's counter file."""
        try:
            names = os.listdir(self.stats_dir)
        except FileNotFoundError:
            return []
        return [(name, os.path.join(self.stats_dir, name[:-len(_SUFFIX)]))
                for name in names if name.endswith(_SUFFIX)]

    @staticmethod
    def read_file(base: str) -> Counts:
        """The counts in one process's counter file (empty if unreadable)."""
        try:
            with open(base + '.names') as file:
                namespaces = json.load(file)
            array = np.fromfile(base + _SUFFIX, dtype=np.int64)
        except (OSError, ValueError):
            return {}
        if array.size != MAX_NAMESPACES * len(COUNTER_NAMES):
            return {}  # written by another version of this layout
        array = array.reshape(MAX_NAMESPACES, len(COUNTER_NAMES))
        return {
            namespace: dict(zip(COUNTER_NAMES, map(int, array[row])))
            for row, namespace in enumerate(namespaces) if row < len(array)
        }

    def live_counts(self) -> Counts:
        """Sum of the counter files now in the stats directory."""
        total: Counts = {}
        for _, base in self.files():
            merge_counts(total, self.read_file(base))
        return total

    def retire(self, is_dead: Callable[[str], bool]) -> Counts:
        """Remove the files of processes for which ``is_dead(file name)``.

        Returns their summed counts, which the caller keeps (the ledger).
        """
        retired: Counts = {}
        for name, base in self.files():
            if not is_dead(name):
                continue
            merge_counts(retired, self.read_file(base))
            for suffix in (_SUFFIX, '.names', '.names.tmp'):
                try:
                    os.unlink(base + suffix)
                except FileNotFoundError:
                    pass
        return retired


def merge_counts(total: Counts, more: Counts) -> Counts:
    """Add ``more`` into ``total`` (in place) and return ``total``."""
    for namespace, counts in more.items():
        into = total.setdefault(namespace, dict.fromkeys(COUNTER_NAMES, 0))
        for name, value in counts.items():
            into[name] = into.get(name, 0) + value
    return total
