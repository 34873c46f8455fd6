"""Remote storage for mmengine's fileio: S3 and HTTP(S), retried and pooled.

Importing this package registers the backends, so configs choose them with
``backend_args`` or by a path's prefix (see :mod:`.registration`).
"""
from .errors import (RemoteAccessDeniedError, RemoteChangedError,
                     RemoteCorruptError, RemoteIOError, RemoteNotFoundError,
                     RemoteUnavailableError, RetryableError)
from .http_backend import HTTPRemoteBackend
from .registration import register_remote_backends
from .remote_backend import RemoteBackend, RemoteBody, RemoteStat
from .retry import RetryPolicy
from .s3_backend import S3Backend, split_s3_url
from .tar_member_backend import (MemberPathError, ShardChangedError,
                                 TarMemberBackend, member_path,
                                 parse_member_path)

register_remote_backends()

__all__ = [
    'RemoteAccessDeniedError', 'RemoteChangedError', 'RemoteCorruptError',
    'RemoteIOError',
    'RemoteNotFoundError', 'RemoteUnavailableError', 'RetryableError',
    'HTTPRemoteBackend', 'register_remote_backends', 'RemoteBackend',
    'RemoteBody', 'RemoteStat', 'RetryPolicy', 'S3Backend', 'split_s3_url',
    'MemberPathError', 'ShardChangedError', 'TarMemberBackend', 'member_path',
    'parse_member_path'
]
