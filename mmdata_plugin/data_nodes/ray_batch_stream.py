"""The trainer's side: batches of indices out, packed batches back, in
order."""
import time
import warnings
from collections import deque
from typing import Any, Deque, Iterator, List

import torch
from torch.utils.data._utils.pin_memory import pin_memory

from ..handover import BatchBlock, received_batch
from .actor_pool import ActorPool, Pending, import_ray
from .batch_producer import ProducedBatch

_perf_counter = time.perf_counter


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

    Args:
        batches (Iterator[list]): The batch sampler's batches of indices.
        pool (ActorPool): The data actors.
        max_inflight (int): Batches being produced at once.
        pin (bool): Pin each batch (the DataLoader's ``pin_memory``).
    """

    def __init__(self, batches: Iterator[List[Any]], pool: ActorPool,
                 max_inflight: int, pin: bool) -> None:
        self._batches = batches
        self._pool = pool
        self._max_inflight = max_inflight
        self._pin = pin
        self._window: Deque[Pending] = deque()
        self._exhausted = False

    def __iter__(self) -> 'RayBatchStream':
        return self

    def __next__(self):
        self._fill()
        if not self._window:
            raise StopIteration
        started = _perf_counter()
        produced = self._result()
        self._fill()
        block = _host_block(produced.block)
        if produced.is_block:
            batch = received_batch(started, block, produced.structure,
                                   produced.entries, produced.small_end,
                                   produced.complete)
        else:
            batch = BatchBlock(block, produced.structure, produced.entries,
                               produced.small_end, produced.complete).unpack()
        return pin_memory(batch) if self._pin else batch

    def _fill(self) -> None:
        while not self._exhausted and len(self._window) < self._max_inflight:
            indices = next(self._batches, None)
            if indices is None:
                self._exhausted = True
            else:
                self._window.append(self._pool.submit(indices))

    def _result(self) -> ProducedBatch:
        ray = import_ray()
        while True:
            try:
                produced = ray.get(self._window[0].ref)
            except (ray.exceptions.RayActorError,
                    ray.exceptions.ObjectLostError) as error:
                self._resend(self._window[0].slot, error)
                continue
            except ray.exceptions.RayTaskError as error:
                raise RuntimeError(
                    'Ray data nodes: producing the batch of indices '
                    f'{[int(i) for i in self._window[0].indices]} failed '
                    f'on a data node: {error}') from error
            self._window.popleft()
            return produced

    def _resend(self, slot: int, error: Exception) -> None:
        self._pool.replace(slot, error)
        for pending in self._window:
            if pending.slot == slot:
                again = self._pool.submit(pending.indices)
                pending.slot, pending.ref = again.slot, again.ref
