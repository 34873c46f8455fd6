"""What can go wrong reading a remote object, each error naming the URL.

The classes also subclass the builtin error a caller already handles:
a missing object is a ``FileNotFoundError`` (``LoadImageFromFile``'s
``ignore_empty`` and ``exists()`` checks keep working), refused credentials
a ``PermissionError``, and all of them ``OSError``.
"""
from typing import Optional


class RemoteIOError(OSError):
    """A remote read failed for good (after any retries).

    Args:
        url (str): The object.
        reason (str, optional): What happened, said for a user. Without it
            ``url`` is taken as the whole message: a DataLoader re-raises a
            worker's error in the main process with its formatted traceback
            as the only argument, and the type survives that way.
    """

    def __init__(self, url: str, reason: Optional[str] = None) -> None:
        super().__init__(url if reason is None else f'{reason}: {url}')
        self.url = None if reason is None else url
        self.reason = reason

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        # Errors raised in DataLoader workers cross to the main process by
        # pickle; keep (url, reason) rather than OSError's (errno, strerror).
        # One re-raised from a worker holds only its message.
        if self.reason is None:
            return type(self), (self.args[0], )
        return type(self), (self.url, self.reason)


class RemoteNotFoundError(RemoteIOError, FileNotFoundError):
    """The object does not exist (HTTP 404/410, S3 NoSuchKey/NoSuchBucket)."""


class RemoteAccessDeniedError(RemoteIOError, PermissionError):
    """Credentials missing, wrong or not allowed (HTTP 401/403)."""


class RemoteChangedError(RemoteIOError):
    """The object is not the one expected: its size or ETag changed."""


class RemoteCorruptError(RemoteIOError):
    """The bytes received do not match the object's checksum (its ETag
    when that is an MD5): damaged on the way; a new download may succeed."""


class RemoteUnavailableError(RemoteIOError):
    """Retryable failures (5xx, timeouts, resets, truncated bodies,
    unreachable host) persisted through every attempt."""


class RetryableError(Exception):
    """One attempt failed in a way worth retrying; carries what happened.

    Raised by a backend's single attempt and consumed by
    :class:`~mmdata_plugin.remote.retry.RetryPolicy`; never escapes it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def error_for_status(url: str, status: int, detail: str = '') -> Exception:
    """The error an HTTP status means: retryable, or final and named.

    Retryable: 408, 429 and every 5xx. Final: 404/410 (not found), 401/403
    (credentials), 412 (the object changed under a conditional read) and
    any other status.
    """
    what = f'HTTP {status}' + (f' {detail}' if detail else '')
    if status in (408, 429) or 500 <= status < 600:
        return RetryableError(what)
    if status in (404, 410):
        return RemoteNotFoundError(url, f'remote object not found ({what})')
    if status in (401, 403):
        return RemoteAccessDeniedError(
            url, f'access denied ({what}): check the credentials in '
            'backend_args or the environment')
    if status == 412:
        return RemoteChangedError(
            url, f'the remote object changed ({what})')
    return RemoteIOError(url, f'unexpected answer {what}')
