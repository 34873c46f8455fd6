"""Per-key single-flight locks of a node store: one byte of one shared file
per key, locked with an open-file-description (OFD) lock.

A lock file per key was an inode made and freed per download, 1/6 of the
prefetch process's CPU on ext4 (inode allocation skips recently freed ones
by reading their table blocks). OFD locks belong to the open file
description, so each holder opens its own and threads of one process
exclude each other as processes do; the kernel drops them when their
process dies. Two keys whose first 60 bits agree share a lock: a wait,
never a wrong entry.

:func:`key_lock` holds one key for a ``with`` block; :class:`KeyHolds`
holds several keys on one descriptor and lets each go on its own (a
coalesced request holding its members' keys from before its read until
each member is published, so that their readers wait for its bytes
instead of reading them again).
"""
import contextlib
import ctypes
import errno
import fcntl
import os
import threading
from typing import Dict, Iterator, List, Set


class _Flock(ctypes.Structure):
    """``struct flock`` of Linux (``off_t`` of 64 bits, as Python builds
    with), for ``fcntl.fcntl``'s OFD lock commands."""
    _fields_ = [('l_type', ctypes.c_short), ('l_whence', ctypes.c_short),
                ('l_start', ctypes.c_int64), ('l_len', ctypes.c_int64),
                ('l_pid', ctypes.c_int)]


# The key-lock descriptors open in this process. A forked child gets copies
# that would hold their locks until it exits (an OFD lock goes with its
# last descriptor), so it closes them at once; a descriptor is opened and
# recorded, or forgotten and closed, apart from any fork (the guard).
_KEY_LOCK_FDS: Set[int] = set()
_KEY_LOCK_FDS_GUARD = threading.Lock()


def _close_inherited_key_locks() -> None:
    for fd in _KEY_LOCK_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _KEY_LOCK_FDS.clear()
    _KEY_LOCK_FDS_GUARD.release()  # taken by the parent's fork


os.register_at_fork(before=_KEY_LOCK_FDS_GUARD.acquire,
                    after_in_parent=_KEY_LOCK_FDS_GUARD.release,
                    after_in_child=_close_inherited_key_locks)


def _byte(digest: str) -> int:
    """The byte of the lock file that stands for ``digest``'s key."""
    return int(digest[:15], 16)


def _flock(kind: int, offset: int) -> bytes:
    """The ``struct flock`` of a lock (or unlock) of byte ``offset`` (an
    OFD lock's ``l_pid`` must be 0)."""
    return bytes(_Flock(kind, os.SEEK_SET, offset, 1, 0))


def _open(lock_file: str) -> int:
    with _KEY_LOCK_FDS_GUARD:
        fd = os.open(lock_file, os.O_RDWR | os.O_CLOEXEC)
        _KEY_LOCK_FDS.add(fd)
    return fd


def _close(fd: int) -> None:
    """Close ``fd``, which releases every lock it holds."""
    with _KEY_LOCK_FDS_GUARD:
        _KEY_LOCK_FDS.discard(fd)
        os.close(fd)


def _try_lock(fd: int, offset: int, blocking: bool) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if blocking else fcntl.F_OFD_SETLK,
                    _flock(fcntl.F_WRLCK, offset))
    except OSError as error:
        if error.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


@contextlib.contextmanager
def key_lock(lock_file: str, digest: str,
             blocking: bool = True) -> Iterator[bool]:
    """An exclusive lock on the byte of ``lock_file`` that stands for
    ``digest``'s key; yields whether it was taken (always, when
    ``blocking``)."""
    fd = _open(lock_file)
    try:
        yield _try_lock(fd, _byte(digest), blocking)
    finally:
        _close(fd)


class KeyHolds:
    """Keys held by one owner across calls, on one descriptor: each is let
    go on its own (:meth:`let_go`), the rest when closed.

    Args:
        lock_file (str): The store's key-lock file.
    """

    def __init__(self, lock_file: str) -> None:
        self._fd = _open(lock_file)
        self._held: Dict[str, int] = {}  # digest -> its byte
        self._bytes: Dict[int, int] = {}  # byte -> digests holding it
        self._lock = threading.Lock()

    def try_hold(self, digest: str) -> bool:
        """Take ``digest``'s key unless another holder has it."""
        offset = _byte(digest)
        with self._lock:
            if self._fd < 0:
                return False
            if digest in self._held:
                return True
            # A byte this descriptor holds already (a 60-bit collision of
            # two of its keys) is held once and let go with its last key.
            if offset not in self._bytes and not _try_lock(
                    self._fd, offset, blocking=False):
                return False
            self._held[digest] = offset
            self._bytes[offset] = self._bytes.get(offset, 0) + 1
            return True

    def holds(self, digest: str) -> bool:
        with self._lock:
            return digest in self._held

    def held(self) -> List[str]:
        """The digests held now."""
        with self._lock:
            return list(self._held)

    def let_go(self, digest: str) -> None:
        """Release ``digest``'s key (nothing if not held)."""
        with self._lock:
            offset = self._held.pop(digest, None)
            if offset is None:
                return
            self._bytes[offset] -= 1
            if self._bytes[offset]:
                return
            del self._bytes[offset]
            # Called from callers' finally blocks: a failed unlock must not
            # hide their exception; close() releases the byte anyway.
            with contextlib.suppress(OSError):
                fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK,
                            _flock(fcntl.F_UNLCK, offset))

    def close(self) -> None:
        """Release every key still held."""
        with self._lock:
            if self._fd < 0:
                return
            self._held.clear()
            self._bytes.clear()
            fd, self._fd = self._fd, -1
        _close(fd)

    def __enter__(self) -> 'KeyHolds':
        return self

    def __exit__(self, *exc) -> None:
        self.close()
