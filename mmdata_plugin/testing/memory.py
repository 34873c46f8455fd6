"""Per-process memory as the kernel accounts it (Linux ``smaps_rollup``).

RSS counts shared pages once per process and so overstates multi-process
loaders; PSS splits each shared page between the processes that map it (so
PSS summed over processes is the real footprint), and USS (private pages)
is what a process would free by exiting -- where copy-on-access shows up.
"""
import os
from typing import Dict, Iterable, List


def process_memory(pid: int = 0) -> Dict[str, int]:
    """``rss``, ``pss`` and ``uss`` (bytes) of process ``pid`` (0: this
    process)."""
    fields = {}
    with open(f'/proc/{pid or "self"}/smaps_rollup') as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == 'kB':
                fields[parts[0].rstrip(':')] = int(parts[1]) * 1024
    return dict(
        rss=fields['Rss'],
        pss=fields['Pss'],
        uss=fields['Private_Clean'] + fields['Private_Dirty'])


def descendants(pids: Iterable[int]) -> List[int]:
    """``pids`` and all their living descendants (children, workers ...)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/stat') as f:
                # The command name may contain spaces: split after its ')'.
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def total_memory(pids: Iterable[int]) -> Dict[str, int]:
    """Summed ``pss`` and ``uss`` of ``pids`` and their descendants."""
    total = dict(pss=0, uss=0)
    for pid in descendants(pids):
        try:
            memory = process_memory(pid)
        except OSError:  # exited meanwhile
            continue
        total['pss'] += memory['pss']
        total['uss'] += memory['uss']
    return total
