"""The data actors of one training process: started, checked, replaced."""
import logging
import socket
from typing import Any, Callable, List, Optional, Tuple

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


def _split_started(starting: List[tuple]) -> Tuple[List[tuple], List[tuple]]:
    """``(started, waiting)``: the ``(actor, report ref)`` pairs whose
    report is ready, and the others (waits for nothing)."""
    if not starting:
        return [], []
    refs = [ref for _, ref in starting]
    ready = set(import_ray().wait(refs, num_returns=len(refs), timeout=0)[0])
    return ([pair for pair in starting if pair[1] in ready],
            [pair for pair in starting if pair[1] not in ready])


class Pending:
    """A batch of indices sent to ``actor``, the pool's actor ``slot``;
    ``deaths`` counts the actors that died while making it."""

    __slots__ = ('indices', 'slot', 'actor', 'ref', 'deaths')

    def __init__(self, indices: List[Any], slot: int, actor, ref) -> None:
        self.indices = indices
        self.slot = slot
        self.actor = actor
        self.ref = ref
        self.deaths = 0


class ActorPool:
    """:class:`BatchProducer` actors fed round-robin; their number may
    change while they work.

    Args:
        dataset: The dataset every actor builds from (shipped once).
        collate_fn (callable): The DataLoader's collate.
        num_actors (int): How many actors to start with.
        options (dict): Ray actor options (``num_cpus``, ``resources``...).
        seed (int): The worker seed reported inside the actors.
    """

    def __init__(self, dataset: Any, collate_fn: Callable, num_actors: int,
                 options: dict, seed: int) -> None:
        ray = import_ray()
        self._remote_class = ray.remote(BatchProducer).options(**options)
        self._recipe = (ray.put(dataset), ray.put(collate_fn), seed)
        self._actors = [self._start() for _ in range(num_actors)]
        # Started, not yet taking batches: (actor, its report's ref).
        self._starting: List[tuple] = []
        self._retired: list = []
        # Replacements whose report has not been read: (actor, its ref).
        self._replacing: List[tuple] = []
        self._turn = 0
        self.replaced = 0
        try:
            self._nodes: List[NodeReport] = [
                check_node(report) for report in ray.get(
                    [actor.report.remote() for actor in self._actors])
            ]
        except BaseException:
            self.close()
            raise

    def _start(self):
        return self._remote_class.remote(*self._recipe)

    @property
    def nodes(self) -> List[NodeReport]:
        """Where each actor taking batches runs, slot by slot: a
        replacement's node once it has started (its predecessor's until
        then)."""
        if self._replacing:
            self._read_replacements()
        return self._nodes

    def _read_replacements(self) -> None:
        ray = import_ray()
        started, self._replacing = _split_started(self._replacing)
        for actor, ref in started:
            try:
                report = ray.get(ref)
            except ray.exceptions.RayActorError:
                continue  # died too: its own replacement reports
            if actor in self._actors:
                self._nodes[self._actors.index(actor)] = report

    @property
    def size(self) -> int:
        """Actors taking batches now."""
        return len(self._actors)

    @property
    def target(self) -> int:
        """Actors taking batches once those starting have joined."""
        return len(self._actors) + len(self._starting)

    def submit(self, indices: List[Any]) -> Pending:
        """Send ``indices`` to the next actor."""
        if self._starting:
            self.admit_started()
        slot, self._turn = self._turn, (self._turn + 1) % len(self._actors)
        actor = self._actors[slot]
        return Pending(indices, slot, actor, actor.produce.remote(indices))

    def resize(self, num_actors: int) -> None:
        """Grow or shrink the pool to ``num_actors``.

        New actors take batches once they have started and loaded sample 0
        (the trainer does not wait for them); removed ones finish the
        batches they were sent, which stay valid, and then exit (should
        Ray end one before its queued batches, as it did once in a test,
        those are made again by the others, in order).
        """
        if num_actors < 1:
            raise ValueError(f'ActorPool.resize: num_actors={num_actors} '
                             'must be >= 1')
        ray = import_ray()
        while self.target < num_actors:
            actor = self._start()
            self._starting.append((actor, actor.report.remote()))
        while self.target > num_actors and self._starting:
            ray.kill(self._starting.pop()[0], no_restart=True)
        while len(self._actors) > num_actors:
            # Queued after the batches it was sent: they complete first.
            retired = self._actors.pop()
            retired.__ray_terminate__.remote()
            self._retired.append(retired)
            self._nodes.pop()
        self._turn %= len(self._actors)

    def admit_started(self) -> None:
        """Let the new actors that have started take batches."""
        ray = import_ray()
        started, self._starting = _split_started(self._starting)
        for actor, ref in started:
            try:
                report = check_node(ray.get(ref))
            except ray.exceptions.RayActorError as error:
                print_log(
                    f'Ray data nodes: a new data actor died while starting '
                    f'({type(error).__name__}); the pool stays at '
                    f'{len(self._actors)} actors.',
                    logger='current', level=logging.WARNING)
                continue
            self._actors.append(actor)
            self._nodes.append(report)

    def replace(self, actor, error: Exception) -> None:
        """Start a new actor in the place of ``actor``, which died (one
        already removed from the pool is not replaced)."""
        ray = import_ray()
        ray.kill(actor, no_restart=True)
        if actor not in self._actors:
            return
        slot = self._actors.index(actor)
        self._actors[slot] = new = self._start()
        self._replacing.append((new, new.report.remote()))
        self.replaced += 1
        print_log(
            f'Ray data nodes: data actor {slot} died '
            f'({type(error).__name__}); a new actor takes its place and '
            'its unfinished batches are produced again, in order.',
            logger='current', level=logging.WARNING)

    def close(self) -> None:
        ray = import_ray()
        starting = [actor for actor, _ in self._starting]
        for actor in self._actors + starting + self._retired:
            ray.kill(actor, no_restart=True)
        self._actors, self._starting, self._retired = [], [], []
