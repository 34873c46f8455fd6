"""Every scheme mmengine's CheckpointLoader knows loads with weights_only.

Remote checkpoints come from a loopback HTTP(S) server started here; hub
names are pointed at it the way mmengine resolves them (MMENGINE_HOME's
open_mmlab.json; the URL tables of torchvision and mmcls, patched here only);
s3/petrel go through a fileio backend registered under mmengine's 'petrel'
name; pavi through a stand-in ``pavi`` module.
"""
import functools
import os
import os.path as osp
import shutil
import ssl
import subprocess
import sys
import threading
import types
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import mmengine.fileio.backends.registry_utils as fileio_registry
import pytest
import torch
from hostile_checkpoints import RunsShellCommand, UsesGetattrGadget
from mmengine.fileio import BaseStorageBackend
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader

import mmdata_plugin  # noqa: F401  (installs the safe loaders)
from mmdata_plugin.utils import (TRUSTED_CHECKPOINTS_ENV,
                                 UnsafeCheckpointError, trust_checkpoint)
from mmdata_plugin.utils.checkpoint_schemes import SAFE_SCHEME_LOADERS


class _QuietHandler(SimpleHTTPRequestHandler):

    def log_message(self, *args):
        pass


@pytest.fixture(scope='module')
def served(tmp_path_factory):
    """A folder with a good, a malicious and a gadget checkpoint; the marker
    the malicious one would create."""
    root = tmp_path_factory.mktemp('served')
    marker = root / 'pwned'
    torch.save(dict(state_dict=dict(w=torch.arange(3.))), root / 'good.pth')
    torch.save(
        dict(
            state_dict=dict(w=torch.ones(1)),
            meta=RunsShellCommand(f'touch {marker}')), root / 'evil.pth')
    torch.save(
        dict(state_dict=dict(w=torch.ones(1)), meta=UsesGetattrGadget()),
        root / 'gadget.pth')
    return root, marker


def _serve(root, tls_dir=None):
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(('127.0.0.1', 0), handler)
    if tls_dir is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls_dir / 'cert.pem', tls_dir / 'key.pem')
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope='module')
def http_url(served):
    server = _serve(served[0])
    yield f'http://127.0.0.1:{server.server_address[1]}'
    server.shutdown()
    server.server_close()


@pytest.fixture(scope='module')
def https_url(served, tmp_path_factory):
    tls_dir = tmp_path_factory.mktemp('tls')
    subprocess.run([
        'openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days',
        '1', '-subj', '/CN=127.0.0.1', '-addext',
        'subjectAltName=IP:127.0.0.1', '-keyout',
        str(tls_dir / 'key.pem'), '-out',
        str(tls_dir / 'cert.pem')
    ],
                   check=True,
                   capture_output=True)
    server = _serve(served[0], tls_dir)
    yield f'https://127.0.0.1:{server.server_address[1]}', tls_dir
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def private_homes(tmp_path, monkeypatch):
    """Downloads and hub tables live in this test's tmp dir."""
    monkeypatch.delenv(TRUSTED_CHECKPOINTS_ENV, raising=False)
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.setenv('MMENGINE_HOME', str(tmp_path / 'mmengine_home'))
    os.makedirs(tmp_path / 'mmengine_home')


class _DictPetrelBackend(BaseStorageBackend):
    """Stands in for petrel_client: serves the files of one folder."""
    root = None

    def __init__(self, **kwargs):
        pass

    def get(self, filepath):
        with open(osp.join(self.root, filepath.rsplit('/', 1)[1]), 'rb') as f:
            return f.read()

    def get_text(self, filepath, encoding='utf-8'):
        return self.get(filepath).decode(encoding)


def _http(url, checkpoint, **_):
    return f'{url}/{checkpoint}'


def _https(https, checkpoint, monkeypatch, **_):
    url, tls_dir = https
    monkeypatch.setenv('SSL_CERT_FILE', str(tls_dir / 'cert.pem'))
    return f'{url}/{checkpoint}'


def _torchvision_table(prefix):

    def name(url, checkpoint, monkeypatch, **_):
        monkeypatch.setattr(mmengine_checkpoint, 'get_torchvision_models',
                            lambda: {'net': f'{url}/{checkpoint}'})
        return f'{prefix}net'

    return name


def _openmmlab_json(prefix, local=False):

    def name(url, checkpoint, served_root, **_):
        home = os.environ['MMENGINE_HOME']
        target = f'{url}/{checkpoint}'
        if local:
            shutil.copy(osp.join(served_root, checkpoint), home)
            target = checkpoint
        with open(osp.join(home, 'open_mmlab.json'), 'w') as f:
            f.write(f'{{"net": "{target}"}}')
        return f'{prefix}net'

    return name


def _mmcls(url, checkpoint, monkeypatch, **_):
    monkeypatch.setattr(mmengine_checkpoint, 'get_mmcls_models',
                        lambda: {'net': f'{url}/{checkpoint}'})
    return 'mmcls://net'


def _petrel(prefix):

    def name(checkpoint, served_root, monkeypatch, **_):
        monkeypatch.setattr(_DictPetrelBackend, 'root', str(served_root))
        monkeypatch.setitem(fileio_registry.backends, 'petrel',
                            _DictPetrelBackend)
        return f'{prefix}bucket/{checkpoint}'

    return name


def _pavi(checkpoint, served_root, monkeypatch, model_name=None, **_):

    class Model:
        name = model_name or checkpoint

        def download(self, path):
            shutil.copy(osp.join(served_root, checkpoint), path)

    pavi = types.ModuleType('pavi')
    pavi.modelcloud = types.SimpleNamespace(get=lambda name: Model())
    monkeypatch.setitem(sys.modules, 'pavi', pavi)
    return 'pavi://project/net'


#: scheme prefix (as registered) -> how a test names a served checkpoint.
SCHEME_CASES = {
    'http://': _http,
    'https://': _https,
    'torchvision://': _torchvision_table('torchvision://'),
    'modelzoo://': _torchvision_table('modelzoo://'),
    'openmmlab://': _openmmlab_json('openmmlab://'),
    'open-mmlab://': _openmmlab_json('open-mmlab://', local=True),
    'mmcls://': _mmcls,
    r'(\S+\:)?s3://': _petrel('s3://'),
    r'(\S+\:)?petrel://': _petrel('cluster:petrel://'),
    'pavi://': _pavi,
}


def test_every_registered_scheme_is_safe():
    assert set(CheckpointLoader._schemes) == set(SAFE_SCHEME_LOADERS)
    for prefix, loader in CheckpointLoader._schemes.items():
        assert loader is SAFE_SCHEME_LOADERS[prefix], prefix
    # '' is covered by test_checkpoint_safety.py.
    assert set(SCHEME_CASES) == set(SAFE_SCHEME_LOADERS) - {''}


@pytest.fixture(params=sorted(SCHEME_CASES))
def name_of(request, served, http_url, https_url, monkeypatch):
    """``name_of('evil.pth')``: how this scheme names that served file."""
    return functools.partial(
        SCHEME_CASES[request.param],
        url=http_url,
        https=https_url,
        served_root=served[0],
        monkeypatch=monkeypatch)


def test_scheme_loads_weights(name_of):
    checkpoint = CheckpointLoader.load_checkpoint(
        name_of(checkpoint='good.pth'), map_location='cpu')
    state_dict = checkpoint['state_dict']
    weight = state_dict.get('w', state_dict.get('backbone.w'))
    if 'mmcls' in name_of.func.__name__:
        # mmcls:// keeps only `backbone.*` keys, renamed (mmengine's rule).
        assert state_dict == {}
    else:
        assert torch.equal(weight, torch.arange(3.))


def test_scheme_refuses_code_in_checkpoint(name_of, served):
    name = name_of(checkpoint='evil.pth')
    with pytest.raises(UnsafeCheckpointError, match='posix.system'):
        CheckpointLoader.load_checkpoint(name, map_location='cpu')
    assert not served[1].exists()


def test_trusting_a_url_never_loads_another_urls_download(
        served, http_url, tmp_path):
    """Two URLs, one file name: the refused download of one must not be
    what the other, trusted, URL loads without restrictions."""
    root, marker = served
    for folder, checkpoint in (('evil', 'evil.pth'), ('good', 'good.pth')):
        os.makedirs(root / folder, exist_ok=True)
        shutil.copy(root / checkpoint, root / folder / 'model.pth')
    evil, good = (f'{http_url}/{folder}/model.pth'
                  for folder in ('evil', 'good'))
    with pytest.raises(UnsafeCheckpointError):
        CheckpointLoader.load_checkpoint(evil, map_location='cpu')
    trust_checkpoint(good)
    checkpoint = CheckpointLoader.load_checkpoint(good, map_location='cpu')
    assert not marker.exists()
    assert torch.equal(checkpoint['state_dict']['w'], torch.arange(3.))


def test_pavi_model_name_cannot_write_outside_the_download_folder(
        served, tmp_path, monkeypatch):
    escaped = tmp_path / 'escaped.pth'
    name = _pavi(
        'good.pth',
        served[0],
        monkeypatch,
        model_name=str(escaped))
    checkpoint = CheckpointLoader.load_checkpoint(name, map_location='cpu')
    assert torch.equal(checkpoint['state_dict']['w'], torch.arange(3.))
    assert not escaped.exists()


def test_scheme_trusted_by_name_loads(name_of):
    name = name_of(checkpoint='gadget.pth')
    with pytest.raises(UnsafeCheckpointError, match='builtins.getattr'):
        CheckpointLoader.load_checkpoint(name, map_location='cpu')
    trust_checkpoint(name)
    checkpoint = CheckpointLoader.load_checkpoint(name, map_location='cpu')
    assert torch.equal(
        checkpoint['state_dict'].get('w', torch.ones(1)), torch.ones(1))
