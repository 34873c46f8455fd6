"""The loopback Ray cluster the data-node tests train on: one per test
module, so that what a module does to its cluster (a node removed) cannot
reach another module's tests."""
import os
import os.path as osp

import pytest
from helpers import REPO_ROOT

from mmdata_plugin.testing import python_path

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


@pytest.fixture(scope='module')
def cluster():
    """A head (1 CPU) and two data nodes (2 CPUs, ``data_node=2`` each),
    ``ray.cluster_utils.Cluster``; this process is connected to it."""
    ray = pytest.importorskip('ray')
    from ray.cluster_utils import Cluster
    previous = {name: os.environ.get(name) for name in _CLUSTER_ENV}
    os.environ.update(_CLUSTER_ENV)
    nodes = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1))
    try:
        for _ in range(2):
            nodes.add_node(num_cpus=2, resources=dict(data_node=2))
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
