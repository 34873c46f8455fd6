"""The data actors of one training process: started, checked, replaced."""
import logging
import socket
from typing import Any, Callable, List, Optional

from mmengine.logging import print_log

from ..version import __version__
from .batch_producer import BatchProducer, NodeReport

#: Seconds to wait for the cluster's head to answer.
CONNECT_TIMEOUT = 5.0

def import_ray():
    """The ``ray`` module, or an ImportError that says how to get it."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            'Ray data nodes need Ray: pip install "mmdata_plugin[ray]" '
            '(or pip install "ray==2.60.0") on the trainer and on every '
            'data node') from error
    return ray


def _check_reachable(address: Optional[str],
                     timeout: float = CONNECT_TIMEOUT) -> None:
    """Fail fast on a 'host:port' or 'ray://host:port' address nothing
    listens on (``ray.init`` would retry it for minutes)."""
    if address is None or address == 'auto':
        return
    host, _, port = address.split('://')[-1].rpartition(':')
    if not host or not port.isdigit():
        raise ValueError(
            f"Ray data nodes: address={address!r} is not 'host:port', "
            "'ray://host:port', 'auto' or None")
    try:
        socket.create_connection((host, int(port)), timeout).close()
    except OSError as error:
        raise ConnectionError(
            f'Ray data nodes: cannot reach the Ray cluster at address='
            f'{address!r}: nothing answers at {host}:{port} within '
            f'{timeout:g} s ({error}). Start its head with `ray start '
            '--head` on that node, or fix the address.') from error


def connect(address: Optional[str]) -> bool:
    """Join the Ray cluster at ``address`` (None: start one on this
    machine, unless this process is connected already).

    Returns:
        bool: Whether this call connected (and so should disconnect).
    """
    _check_reachable(address)
    ray = import_ray()
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    except Exception as error:
        raise ConnectionError(
            f'Ray data nodes: cannot reach the Ray cluster at address='
            f'{address!r} ({type(error).__name__}: {error}). Start its head '
            "with `ray start --head` and give its address ('host:6379', "
            "'ray://host:10001' or 'auto' on a node of the cluster).") from error
    return True


def check_node(report: NodeReport) -> NodeReport:
    """``report`` if its node can make batches, else a RuntimeError naming
    the node and what is wrong there."""
    where = f'data node {report.host} ({report.node_ip})'
    if report.version != __version__:
        raise RuntimeError(
            f'{where} runs mmdata_plugin {report.version}, the trainer '
            f'{__version__}: install the same version on every node')
    if report.problem is not None:
        raise RuntimeError(
            f'{where} cannot load sample 0 of the train dataset: '
            f'{report.problem}. Every data node needs the dataset at the '
            'same paths as the trainer (or remote URLs).')
    return report


class Pending:
    """A batch of indices sent to the actor in ``slot``."""

    __slots__ = ('indices', 'slot', 'ref')

    def __init__(self, indices: List[Any], slot: int, ref) -> None:
        self.indices = indices
        self.slot = slot
        self.ref = ref


class ActorPool:
    """``num_actors`` :class:`BatchProducer` actors fed round-robin.

    Args:
        dataset: The dataset every actor builds from (shipped once).
        collate_fn (callable): The DataLoader's collate.
        num_actors (int): How many actors.
        options (dict): Ray actor options (``num_cpus``, ``resources``...).
        seed (int): The worker seed reported inside the actors.
    """

    def __init__(self, dataset: Any, collate_fn: Callable, num_actors: int,
                 options: dict, seed: int) -> None:
        ray = import_ray()
        self._remote_class = ray.remote(BatchProducer).options(**options)
        self._recipe = (ray.put(dataset), ray.put(collate_fn), seed)
        self._actors = [self._start() for _ in range(num_actors)]
        self._turn = 0
        self.replaced = 0
        try:
            self.nodes: List[NodeReport] = [
                check_node(report) for report in ray.get(
                    [actor.report.remote() for actor in self._actors])
            ]
        except BaseException:
            self.close()
            raise

    def _start(self):
        return self._remote_class.remote(*self._recipe)

    def submit(self, indices: List[Any],
               slot: Optional[int] = None) -> Pending:
        """Send ``indices`` to the next actor (or the one in ``slot``)."""
        if slot is None:
            slot, self._turn = self._turn, (self._turn + 1) % len(
                self._actors)
        return Pending(indices, slot,
                       self._actors[slot].produce.remote(indices))

    def replace(self, slot: int, error: Exception) -> None:
        """Start a new actor in ``slot`` after its actor died."""
        ray = import_ray()
        ray.kill(self._actors[slot], no_restart=True)
        self._actors[slot] = self._start()
        self.replaced += 1
        print_log(
            f'Ray data nodes: data actor {slot} died '
            f'({type(error).__name__}); a new actor takes its place and '
            'its unfinished batches are produced again, in order.',
            logger='current', level=logging.WARNING)

    def close(self) -> None:
        ray = import_ray()
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
