import os

import pytest
from helpers import REPO_ROOT

from mmdata_plugin.testing import cpu_env, python_path
from mmdata_plugin.utils import make_demo_dataset


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under ``-n 2 --dist loadgroup`` the Ray tests run on one worker:
    one loopback cluster at a time (they share one per worker, and a
    second beside it would take the cores its actors are sized for). Runs
    before xdist reads the groups."""
    for item in items:
        if ('test_data_nodes' in item.path.parts
                or item.path.name == 'test_benchmark_ray_nodes.py'):
            item.add_marker(pytest.mark.xdist_group('ray'))


@pytest.fixture(scope='session', autouse=True)
def node_cache_dir(tmp_path_factory):
    """The node store of configs without a cache_dir (the demo's head
    cache): a temporary one, for this process and every command it starts,
    never the user's ~/.cache."""
    path = str(tmp_path_factory.mktemp('node_cache'))
    previous = os.environ.get('MMDATA_CACHE_DIR')
    os.environ['MMDATA_CACHE_DIR'] = path
    yield path
    if previous is None:
        os.environ.pop('MMDATA_CACHE_DIR', None)
    else:
        os.environ['MMDATA_CACHE_DIR'] = previous


#: What urllib, botocore and our HTTP connections follow to reach a host.
PROXY_VARIABLES = ('http_proxy', 'https_proxy', 'no_proxy', 'all_proxy',
                   'HTTP_PROXY', 'HTTPS_PROXY', 'NO_PROXY', 'ALL_PROXY')


@pytest.fixture(scope='session', autouse=True)
def no_proxy_for_the_loopback():
    """The tests' servers are on 127.0.0.1: reached directly, in this
    process and every command it starts, whatever proxy the machine's
    environment names (with only ``https_proxy`` set, the https
    checkpoint cases alone failed: the pattern seen on a lent GPU node).
    Tests of the proxy path set their own (with ``monkeypatch``), from
    none."""
    saved = {name: os.environ.pop(name) for name in PROXY_VARIABLES
             if name in os.environ}
    yield
    os.environ.update(saved)


@pytest.fixture(scope='session')
def demo_root(tmp_path_factory):
    """A small demo set (same generator as the README's, smaller images)."""
    root = str(tmp_path_factory.mktemp('demo_data'))
    make_demo_dataset(root, num_train=64, num_val=32, max_side=160)
    return root


@pytest.fixture(scope='session')
def train_env(demo_root):
    """Environment for subprocesses: CPU only, this working tree first."""
    return cpu_env(
        dict(PYTHONPATH=python_path(REPO_ROOT), MMDATA_DEMO_ROOT=demo_root))
