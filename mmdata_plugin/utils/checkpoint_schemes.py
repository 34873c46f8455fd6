"""Every checkpoint scheme mmengine knows, loaded with ``weights_only=True``.

mmengine 0.10.7's ``CheckpointLoader`` fetches ``http(s)://``,
``openmmlab://``, ``torchvision://``, ``mmcls://``, ``s3://``/``petrel://``
and ``pavi://`` checkpoints itself and unpickles them with ``torch.load``
defaults or, for URLs, ``torch.hub.load_state_dict_from_url``'s explicit
``weights_only=False``: a downloaded checkpoint could run the code it
carries. Each loader here resolves the name the way mmengine does (its URL
tables, ``MMENGINE_HOME/open_mmlab.json``, its fileio backends), fetches the
bytes, and hands them to :func:`load_checkpoint_safely`, with the same
allow-list and the same ``--trust-checkpoint`` opt-in (by URL or name) as
local files. They are registered through mmengine's public
``CheckpointLoader.register_scheme``.
"""
import hashlib
import logging
import os
import os.path as osp
from tempfile import TemporaryDirectory
from urllib.parse import urlparse

import torch
from mmengine.dist import get_dist_info
from mmengine.fileio import get_file_backend
from mmengine.logging import print_log
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader

from .checkpoint_safety import (load_checkpoint_safely, load_from_local_safely,
                                register_safe_history_buffer_pickling)
from .torch_internals import mmengine_home, process_mmcls_checkpoint


def _download(url: str, model_dir: str = None) -> str:
    """Fetch ``url`` into torch hub's cache folder; the path.

    Same folder as ``torch.hub.load_state_dict_from_url`` (``TORCH_HOME``),
    and, as in mmengine, local rank 0 downloads before the others look.
    Unlike torch.hub, the cached file is keyed by the whole URL, not its
    file name: trust is granted per URL, so the download of another URL
    with the same file name (refused, or just different weights) must
    never stand in for this one.
    """
    model_dir = model_dir or osp.join(torch.hub.get_dir(), 'checkpoints')
    url_key = hashlib.sha256(url.encode()).hexdigest()[:16]
    file_name = osp.basename(urlparse(url).path)
    if file_name in ('', '.', '..'):
        file_name = 'checkpoint.pth'
    os.makedirs(osp.join(model_dir, url_key), exist_ok=True)
    cached = osp.join(model_dir, url_key, file_name)

    def fetch():
        if not osp.exists(cached):
            torch.hub.download_url_to_file(url, cached, progress=False)

    rank, world_size = get_dist_info()
    if rank == 0:
        fetch()
    if world_size > 1:
        torch.distributed.barrier()
        if rank > 0:
            fetch()
    return cached


def load_from_http_safely(url: str,
                          map_location=None,
                          model_dir: str = None,
                          name: str = None):
    """``http://`` and ``https://`` checkpoints; ``name`` is what the user
    asked for when that was a hub name resolved to ``url``."""
    return load_checkpoint_safely(
        _download(url, model_dir), map_location, name=name or url)


def load_from_torchvision_safely(filename: str, map_location=None):
    """``torchvision://NAME`` (and the deprecated ``modelzoo://NAME``)."""
    if filename.startswith('modelzoo://'):
        print_log(
            'The URL scheme of "modelzoo://" is deprecated, please use '
            '"torchvision://" instead',
            logger='current',
            level=logging.WARNING)
    model_name = filename.split('://', 1)[1]
    url = mmengine_checkpoint.get_torchvision_models()[model_name]
    return load_from_http_safely(url, map_location, name=filename)


def load_from_openmmlab_safely(filename: str, map_location=None):
    """``openmmlab://NAME`` / ``open-mmlab://NAME``: mmengine's URL table
    plus ``MMENGINE_HOME/open_mmlab.json``, deprecated names renamed."""
    prefix, model_name = filename.split('://', 1)
    deprecated = mmengine_checkpoint.get_deprecated_model_names()
    if model_name in deprecated:
        print_log(
            f'{prefix}://{model_name} is deprecated in favor of '
            f'{prefix}://{deprecated[model_name]}',
            logger='current',
            level=logging.WARNING)
        model_name = deprecated[model_name]
    model_url = mmengine_checkpoint.get_external_models()[model_name]
    if model_url.startswith(('http://', 'https://')):
        return load_from_http_safely(model_url, map_location, name=filename)
    # mmengine's own MMENGINE_HOME resolution, which its table entries use.
    local = osp.join(mmengine_home(), model_url)
    if not osp.isfile(local):
        raise FileNotFoundError(f'{local} can not be found.')
    return load_checkpoint_safely(local, map_location, name=filename)


def load_from_mmcls_safely(filename: str, map_location=None):
    """``mmcls://NAME``: mmengine's mmcls URL table, backbone keys kept."""
    url = mmengine_checkpoint.get_mmcls_models()[filename[len('mmcls://'):]]
    checkpoint = load_from_http_safely(url, map_location, name=filename)
    # mmengine's own conversion of mmcls checkpoints (keeps `backbone.*`).
    return process_mmcls_checkpoint(checkpoint)


def load_from_ceph_safely(filename: str, map_location=None,
                          backend: str = 'petrel'):
    """``s3://`` / ``petrel://`` (optionally ``NAME:s3://``) through the
    fileio backend mmengine uses for them."""
    file_backend = get_file_backend(
        filename, backend_args={'backend': backend})
    return load_checkpoint_safely(
        file_backend.get(filename), map_location, name=filename)


def load_from_pavi_safely(filename: str, map_location=None):
    """``pavi://MODEL``: downloaded from pavi's model cloud, then checked."""
    try:
        from pavi import modelcloud
    except ImportError as error:
        raise ImportError(
            'Please install pavi to load checkpoint from modelcloud.'
        ) from error
    model = modelcloud.get(filename[len('pavi://'):])
    with TemporaryDirectory() as tmp_dir:
        # The server names the model: an absolute or '..' name must not
        # choose where the download is written.
        downloaded = osp.join(tmp_dir, 'checkpoint.pth')
        model.download(downloaded)
        return load_checkpoint_safely(downloaded, map_location, name=filename)


#: mmengine 0.10.x's scheme prefixes -> the safe loader for them.
SAFE_SCHEME_LOADERS = {
    '': load_from_local_safely,
    'http://': load_from_http_safely,
    'https://': load_from_http_safely,
    'torchvision://': load_from_torchvision_safely,
    'modelzoo://': load_from_torchvision_safely,
    'openmmlab://': load_from_openmmlab_safely,
    'open-mmlab://': load_from_openmmlab_safely,
    'mmcls://': load_from_mmcls_safely,
    r'(\S+\:)?s3://': load_from_ceph_safely,
    r'(\S+\:)?petrel://': load_from_ceph_safely,
    'pavi://': load_from_pavi_safely,
}


def install_safe_checkpoint_loading() -> None:
    """Route mmengine's checkpoint loading through the safe loaders.

    Uses mmengine's public ``CheckpointLoader.register_scheme`` extension
    point. On torch before 2.6, whose ``torch.load`` does not default to
    ``weights_only``, the safe loaders refuse what they refuse on 2.6 too.
    """
    register_safe_history_buffer_pickling()
    for prefix, loader in SAFE_SCHEME_LOADERS.items():
        CheckpointLoader.register_scheme(prefix, loader, force=True)
