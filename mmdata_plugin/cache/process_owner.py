"""Who owns a reservation or a temp file, and whether that owner still runs.

An owner is ``host:pid:start`` where ``start`` is the process start time from
``/proc/<pid>/stat`` (clock ticks since boot). A bare pid is not enough: pids
are reused, and a reused pid would keep a dead writer's reservation alive.
"""
import contextlib
import os
import socket
import time
from typing import Optional

_cached = (None, None)  # (pid, owner) of this process; recomputed after fork


def _start_time(pid: int) -> Optional[str]:
    """The start time of ``pid``, '' where /proc is missing, None if dead."""
    try:
        with open(f'/proc/{pid}/stat', 'rb') as stat:
            fields = stat.read().rsplit(b')', 1)[1].split()
        return fields[19].decode()  # field 22 (starttime); fields[0] is 3
    except FileNotFoundError:
        return None if os.path.isdir('/proc/self') else ''
    except (OSError, IndexError):
        return ''


def owner_of(pid: int) -> str:
    """The owner string of the running process ``pid`` (a child the caller
    forked and reserves for)."""
    return f'{socket.gethostname()}:{pid}:{_start_time(pid)}'


def current_owner() -> str:
    """The owner string of the calling process."""
    global _cached
    pid = os.getpid()
    if _cached[0] != pid:
        _cached = (pid, owner_of(pid))
    return _cached[1]


def owner_is_alive(owner: str, created: float,
                   foreign_max_age: float = 6 * 3600) -> bool:
    """Whether the process named by ``owner`` still runs.

    Owners on another host (a cache directory on a shared file system) cannot
    be checked; they count as alive until ``foreign_max_age`` seconds after
    ``created``.
    """
    try:
        host, pid, start = owner.rsplit(':', 2)
        pid = int(pid)
    except ValueError:
        return time.time() - created < foreign_max_age
    if host != socket.gethostname():
        return time.time() - created < foreign_max_age
    now_start = _start_time(pid)
    if now_start is None:
        return False
    if now_start == '' or start == '':
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return now_start == start


def owner_file_name(owner: str, unique: str) -> str:
    """A file name that carries ``owner`` (host names hold no '@' or '+')."""
    return f"{owner.replace(':', '@')}+{unique}"


def owner_from_file_name(name: str) -> Optional[str]:
    """The owner of a file named by :func:`owner_file_name`, else None."""
    if '+' not in name:
        return None
    return name.split('+', 1)[0].replace('@', ':')


def remove_files_of_dead_owners(folder: str,
                                prefix: str = '',
                                foreign_max_age: float = 6 * 3600,
                                unowned: bool = False) -> None:
    """Delete the files of ``folder`` named ``prefix`` + an
    :func:`owner_file_name` whose owner no longer runs (what a killed
    writer left); with ``unowned``, also those that name no owner.

    Args:
        folder (str): The folder (missing: nothing to do).
        prefix (str): Only names starting with it are considered.
        foreign_max_age (float): See :func:`owner_is_alive`.
        unowned (bool): Delete the files that name no owner too.
    """
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        owner = owner_from_file_name(name[len(prefix):])
        if owner is None and not unowned:
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(FileNotFoundError):
            if owner is None or not owner_is_alive(
                    owner, os.path.getmtime(path), foreign_max_age):
                os.unlink(path)
