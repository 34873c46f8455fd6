"""Fetch a remote file once per node into a node store, checked by ETag."""
import os
import os.path as osp
from typing import Optional, Union

from mmengine.fileio import get_file_backend
from mmengine.logging import print_log

from .remote_backend import RemoteBackend

# Where remote annotation files are kept unless a dataset names a folder.
FILES_CACHE_ENV = 'MMDATA_REMOTE_FILES_DIR'
DEFAULT_FILES_LIMIT = '20GB'
NAMESPACE = 'remote_file'


def is_remote(path: Union[str, os.PathLike],
              backend_args: Optional[dict] = None) -> bool:
    """Whether ``path`` is read through one of our remote backends."""
    path = str(path)
    if '://' not in path and not (backend_args or {}).get('backend'):
        return False
    backend = get_file_backend(
        path, backend_args=backend_args, enable_singleton=True)
    return isinstance(backend, RemoteBackend)


def default_files_dir() -> str:
    return os.environ.get(FILES_CACHE_ENV) or osp.join(
        osp.expanduser('~'), '.cache', 'mmdata_plugin', 'remote_files')


def fetch_to_node(url: str,
                  backend_args: Optional[dict] = None,
                  cache_dir: Optional[str] = None,
                  cache_limit: Union[int, str] = DEFAULT_FILES_LIMIT) -> str:
    """A local, complete copy of the remote file ``url``; its path.

    The copy lives in a :class:`~mmdata_plugin.cache.NodeStore` keyed by the
    URL *and* the object's current size and ETag: every process of the node
    asks, one downloads (the others wait for it), and a later run reuses the
    copy as long as the remote object is unchanged. A changed object gets a
    fresh copy (the old one is evicted when the budget needs room); an
    object that changes *during* the download fails with
    :class:`~mmdata_plugin.remote.RemoteChangedError` rather than leave a
    mix of two versions.

    Args:
        url (str): ``s3://`` or ``http(s)://`` path.
        backend_args (dict, optional): fileio backend arguments.
        cache_dir (str, optional): Store folder (default
            ``$MMDATA_REMOTE_FILES_DIR`` or
            ``~/.cache/mmdata_plugin/remote_files``).
        cache_limit (int | str): Byte budget of that store.
    """
    from ..cache import NodeStore
    backend = get_file_backend(
        url, backend_args=backend_args, enable_singleton=True)
    stat = backend.stat(url)
    store = NodeStore(cache_dir or default_files_dir(), cache_limit)
    if stat.size > store.limit:
        raise RuntimeError(
            f'{url} ({stat.size} bytes) is larger than the node store '
            f'{store.cache_dir} can hold (cache_limit={cache_limit}); raise '
            'the limit')
    key = f'{url}\nsize={stat.size}\netag={stat.etag}'
    path = store.lookup(NAMESPACE, key)
    if path is not None:
        return path
    entry = store.get_or_produce(
        NAMESPACE,
        key,
        lambda sink: backend.download(url, sink, expect=stat),
        size_hint=stat.size)
    if not entry.admitted:
        entry.release()
        raise RuntimeError(
            f'{url} ({stat.size} bytes) does not fit in the node store '
            f'{store.cache_dir} (cache_limit={cache_limit}); raise the '
            'limit or free the store')
    print_log(
        f'{url}: fetched to {entry.path} ({stat.size} bytes, ETag '
        f'{stat.etag})',
        logger='current')
    return entry.path
