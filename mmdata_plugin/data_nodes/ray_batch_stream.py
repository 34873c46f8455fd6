"""The trainer's side: batches of indices out, packed batches back, in
order."""
import time
import warnings
from collections import deque
from typing import Any, Callable, Deque, Iterator, List, Optional, Tuple

import torch

from ..handover import BatchBlock, received_batch
from ..utils.torch_internals import pin_memory
from .actor_pool import ActorPool, Pending, import_ray
from .batch_producer import ProducedBatch
from .local_share import LOCAL, BatchOrder, LocalShare

_perf_counter = time.perf_counter
_wall_clock = time.time
#: Actors that may die making one batch before it is given up: a batch
#: whose sample crashes its process (or exhausts its memory) would
#: otherwise replace actors forever.
MAX_DEATHS_PER_BATCH = 3


def production_record(produced: ProducedBatch,
                      pending: Pending,
                      first_slot: int = 0) -> dict:
    """The monitor's worker record of a batch an actor made: its actor's
    time and CPU, node (Ray's node id, IP and host name), process and slot
    (the ``worker``: ``first_slot`` + the pool's slot, so that actors
    number after the local workers of a mixed stream), and the block's
    bytes.

    The actor's clock is not the trainer's: the end of its work is placed
    on the trainer's ``perf_counter`` through the wall clocks (the same
    clock on one machine, synchronised by NTP across machines), never
    after now, when the batch has arrived.
    """
    now = _perf_counter()
    end = now - max(_wall_clock() - produced.finished, 0.0)
    return dict(
        pid=produced.pid,
        worker=first_slot + pending.slot,
        samples=len(pending.indices),
        start=end - produced.production,
        end=end,
        cpu=produced.cpu,
        timed=False,
        node=produced.node_id,
        ip=produced.node_ip,
        host=produced.host,
        bytes=produced.block.nbytes)


def _lost(ray) -> tuple:
    """The errors of a batch lost with its actor or node (made again)."""
    return (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError,
            ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError,
            ray.exceptions.OutOfMemoryError)


def _host_block(array) -> torch.Tensor:
    # A block made on this node is a read-only view of Ray's shared-memory
    # object store (no copy); torch warns that it cannot mark the tensor
    # read-only. Like a local worker's block, it is only read.
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)
        return torch.from_numpy(array)


class RayBatchStream:
    """Iterator of the batches the data actors make from ``batches``.

    Each batch of indices the batch sampler yields goes to the next actor
    of the pool; up to ``max_inflight`` are being produced at any time, and
    they are handed out in the sampler's order. A batch whose actor died is
    sent again (with every other unfinished batch of that actor) and the
    actor is replaced, so nothing is lost, skipped or repeated.

    With ``local``, the train DataLoader's own workers make a share of the
    batches: their iterator draws a batch of indices whenever it has room
    (:attr:`LocalShare.depth` batches in production), the actors draw the
    rest, and each batch is handed out in the sampler's order by whoever
    drew it. In the steady state the local workers make
    ``depth / (depth + max_inflight)`` of the batches.

    Args:
        batches (Iterator[list]): The batch sampler's batches of indices.
        pool (ActorPool): The data actors.
        max_inflight (int, optional): Batches being produced by the actors
            at once; None: twice the actors taking batches, as the pool
            grows or shrinks.
        pin (bool): Pin each batch (the DataLoader's ``pin_memory``).
        wrap (callable, optional): Called with each batch an actor made and
            its :func:`production_record`; what it returns is handed out
            instead of the batch (the data monitor's ``MonitoredBatch``).
        local (LocalShare, optional): Local workers making a share of the
            batches; their batches are handed out as their DataLoader
            iterator gives them (pinned, with the monitor's records).
        made (dict, optional): ``{'local': n, 'actors': n}``, counted on
            as batches are handed out (a dict shared by the passes of a
            run); a new one by default.
    """

    def __init__(self,
                 batches: Iterator[List[Any]],
                 pool: ActorPool,
                 max_inflight: Optional[int],
                 pin: bool,
                 wrap: Optional[Callable[[Any, dict], Any]] = None,
                 local: Optional[LocalShare] = None,
                 made: Optional[dict] = None) -> None:
        self._order = BatchOrder(batches)
        self._window = self._order.window
        self._pool = pool
        self._max_inflight = max_inflight
        self._pin = pin
        self._wrap = wrap
        self._in_ray = 0
        self.made = dict(local=0, actors=0) if made is None else made
        # Started here, as a DataLoader's iterator starts its workers.
        self._share = local
        self._local = None if local is None else local.start(self._order)
        self._first_slot = 0 if local is None else local.num_workers
        #: Whether nothing was handed out yet: a hook that changes how the
        #: loader makes batches may stop this pass and start it again
        #: (:func:`~mmdata_plugin.utils.started_iterators.
        #: restart_started_iterator`).
        self.restartable = True

    def __iter__(self) -> 'RayBatchStream':
        return self

    def __next__(self):
        self.restartable = False
        self._fill()
        if not self._window:
            self._end_local_pass()
            raise StopIteration
        if self._window[0] is LOCAL:
            self._window.popleft()
            # Taking it, the local iterator draws its next batch (if any).
            batch = next(self._local)
            self.made['local'] += 1
            return batch
        started = _perf_counter()
        pending, produced = self._result()
        self._in_ray -= 1
        self._fill()
        block = _host_block(produced.block)
        if produced.is_block:
            batch = received_batch(started, block, produced.structure,
                                   produced.entries, produced.small_end,
                                   produced.complete)
        else:
            batch = BatchBlock(block, produced.structure, produced.entries,
                               produced.small_end, produced.complete).unpack()
        if self._pin:
            batch = pin_memory(batch)
        self.made['actors'] += 1
        if self._wrap is None:
            return batch
        return self._wrap(
            batch, production_record(produced, pending, self._first_slot))

    def shutdown_workers(self) -> None:
        """Stop this pass before it hands anything out (what
        ``torch_internals.shutdown_workers`` does to torch's iterators):
        its local workers stop, and the
        local share's DataLoader is built again at the next pass, with the
        train DataLoader's collate of then (the data monitor's timed one).
        Batches the actors were sent are let go."""
        self._end_local_pass()
        if self._share is not None:
            self._share.close()

    def _end_local_pass(self) -> None:
        # Dropped, the local iterator stops its workers at once (torch's
        # iterators do when collected), unless they are persistent: those
        # stay with the local DataLoader for the next pass.
        self._local = None

    def _fill(self) -> None:
        limit = self._max_inflight or 2 * self._pool.size
        while self._in_ray < limit:
            indices = self._order.draw()
            if indices is None:
                return
            self._window.append(self._pool.submit(indices))
            self._in_ray += 1

    def _result(self) -> Tuple[Pending, ProducedBatch]:
        ray = import_ray()
        while True:
            try:
                produced = ray.get(self._window[0].ref)
            except _lost(ray) as error:
                self._replace_dead(self._window[0].actor, error)
                continue
            except ray.exceptions.RayTaskError as error:
                raise RuntimeError(
                    'Ray data nodes: producing the batch of indices '
                    f'{[int(i) for i in self._window[0].indices]} failed '
                    f'on a data node: {error}') from error
            return self._window.popleft(), produced

    def _replace_dead(self, actor, error: Exception) -> None:
        """Replace ``actor``, and every other actor whose batches in the
        window have failed by now: a node removed takes all its actors,
        and their replacements start together rather than one by one as
        each one's batch comes due."""
        while actor is not None:
            self._resend(actor, error)
            actor, error = self._failed_elsewhere()

    def _failed_elsewhere(self) -> tuple:
        """``(actor, error)`` of a batch in the window that has failed with
        its actor, or ``(None, None)``; waits for nothing."""
        ray = import_ray()
        pending = [p for p in self._window if p is not LOCAL]
        refs = [p.ref for p in pending]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        for entry in pending:
            if entry.ref not in ready:
                continue
            try:
                ray.get(entry.ref, timeout=0)
            except _lost(ray) as error:
                return entry.actor, error
            except ray.exceptions.RayError:
                pass  # the dataset's error: raised when the batch is due
        return None, None

    def _resend(self, actor, error: Exception) -> None:
        # An actor makes its batches in order: it died making the first of
        # them in the window.
        making = next(p for p in self._window
                      if p is not LOCAL and p.actor is actor)
        making.deaths += 1
        if making.deaths >= MAX_DEATHS_PER_BATCH:
            raise RuntimeError(
                f'Ray data nodes: {making.deaths} data actors died making '
                'the batch of indices '
                f'{[int(i) for i in making.indices]} (last: '
                f'{type(error).__name__}: {error}); it is not sent again. '
                'A sample of it may crash or exhaust the memory of its '
                "process: load those indices with the dataset's pipeline "
                'in one process to see.') from error
        self._pool.replace(actor, error)
        for pending in self._window:
            if pending is not LOCAL and pending.actor is actor:
                again = self._pool.submit(pending.indices)
                pending.slot, pending.actor, pending.ref = (again.slot,
                                                            again.actor,
                                                            again.ref)
