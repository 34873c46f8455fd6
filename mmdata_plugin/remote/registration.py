"""Put our backends into mmengine's fileio tables (one place, tested)."""
import importlib.util

from mmengine.fileio import register_backend

from .http_backend import HTTPRemoteBackend
from .s3_backend import S3Backend
from .tar_member_backend import PREFIX as TAR_MEMBER_PREFIX
from .tar_member_backend import TarMemberBackend

HTTP_BACKEND_NAME = 'remote_http'
S3_BACKEND_NAME = 's3'


def register_remote_backends() -> None:
    """Register ``'s3'``, ``'remote_http'`` and ``'tarmember'``, and route
    the prefixes.

    ``http://``/``https://`` paths go to :class:`HTTPRemoteBackend`
    (mmengine's urlopen backend has no timeout, retry, pool or range read;
    it stays reachable as ``backend='http'``). ``s3://`` goes to
    :class:`S3Backend` unless ``petrel_client`` is importable: then the
    prefix stays with mmengine's ``PetrelBackend``, whose users expect it.
    ``tarmember://`` goes to :class:`TarMemberBackend` (one member of a
    tar shard). Idempotent (a re-import or a spawned worker registers
    again).
    """
    register_backend(
        HTTP_BACKEND_NAME,
        HTTPRemoteBackend,
        force=True,
        prefixes=['http', 'https'])
    petrel = importlib.util.find_spec('petrel_client') is not None
    register_backend(
        S3_BACKEND_NAME,
        S3Backend,
        force=True,
        prefixes=None if petrel else 's3')
    register_backend(
        TAR_MEMBER_PREFIX,
        TarMemberBackend,
        force=True,
        prefixes=TAR_MEMBER_PREFIX)
