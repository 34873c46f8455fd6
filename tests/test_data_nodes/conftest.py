"""The loopback Ray clusters the data-node tests train on: one shared by
the modules of this folder (``cluster``), and a module's own
(``own_cluster``) for a test that changes its cluster (a node removed), so
that no other test sees the change."""
import contextlib
import os
import os.path as osp

import pytest
from helpers import REPO_ROOT

from mmdata_plugin.testing import python_path, warm_ray_worker
from mmdata_plugin.testing.warm_python import warm_socket

# Every node and the driver name themselves 127.0.0.1 (read when Ray is
# imported): all cluster traffic stays on loopback.
os.environ['RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'] = '0'

_CLUSTER_ENV = {
    # Actors import this working tree and the tests' helper modules.
    'PYTHONPATH': python_path(REPO_ROOT, osp.join(REPO_ROOT, 'tests')),
    # Ray kills workers when the machine's memory is 95% used, whoever
    # uses it (other jobs on a shared test machine): a test's actors need
    # little, and a killed one would fail the test for nothing it did.
    'RAY_memory_monitor_refresh_ms': '0',
}


# Each node starts its workers (an actor's process) as forks of the warm
# interpreter: ~1 s per actor instead of ~3.5 s of imports.
_WARM_WORKERS = dict(worker_path=warm_ray_worker.__file__)


def _add_data_nodes(nodes, count: int) -> None:
    for _ in range(count):
        nodes.add_node(num_cpus=2, resources=dict(data_node=2),
                       **_WARM_WORKERS)


@contextlib.contextmanager
def _loopback_cluster():
    """A head (1 CPU) and two data nodes (2 CPUs, ``data_node=2`` each),
    ``ray.cluster_utils.Cluster``; this process is connected to it."""
    ray = pytest.importorskip('ray')
    from ray.cluster_utils import Cluster
    env = dict(_CLUSTER_ENV)
    warm = warm_socket(env)
    if warm is not None:
        env[warm_ray_worker.SOCKET_ENV] = warm
    previous = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    nodes = Cluster(initialize_head=True,
                    head_node_args=dict(num_cpus=1, include_dashboard=False,
                                        **_WARM_WORKERS))
    try:
        _add_data_nodes(nodes, 2)
        ray.init(address=nodes.address, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
        nodes.wait_for_nodes()
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


@pytest.fixture(scope='package')
def cluster():
    """The cluster the modules of this folder share."""
    with _loopback_cluster() as nodes:
        yield nodes


@pytest.fixture(scope='module')
def module_cluster():
    """A cluster for this module alone. The shared one, if started, stays
    up meanwhile and is connected to again afterwards."""
    ray = pytest.importorskip('ray')
    shared = (ray.get_runtime_context().gcs_address
              if ray.is_initialized() else None)
    ray.shutdown()
    try:
        with _loopback_cluster() as nodes:
            yield nodes
    finally:
        if shared is not None:
            ray.init(address=shared, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)


@pytest.fixture
def own_cluster(module_cluster):
    """This module's cluster with its two data nodes (a node a test removed
    is replaced by a new one)."""
    _add_data_nodes(module_cluster, 2 - len(module_cluster.worker_nodes))
    return module_cluster
