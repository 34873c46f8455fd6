"""What a data node runs: the train dataset, its pipeline and collate.

A :class:`BatchProducer` lives in a Ray actor process. It holds the
training DataLoader's dataset and ``collate_fn`` (shipped once through Ray's
object store) and turns a batch of indices into one packed block, exactly
as a DataLoader worker would: ``dataset[i]`` for each index, then the
collate, then :func:`~mmdata_plugin.handover.pack_batch`. The process
passes for a DataLoader worker (``get_worker_info()`` answers), so
per-sample seeding (``SampleSeededDataset``) and ``block_collate`` behave
as they do in a local worker.
"""
import os
import socket
import time
from typing import Any, Callable, List, NamedTuple, Optional

import numpy as np

from ..handover import BatchBlock, pack_batch
from ..utils.torch_internals import act_as_worker
from ..version import __version__


class ProducedBatch(NamedTuple):
    """One batch as it travels back: one uint8 array plus small metadata.

    ``block`` is read without a copy from Ray's shared-memory object store
    on the trainer's node; the rest is the structure
    :class:`~mmdata_plugin.handover.BatchBlock` needs to view it again.
    ``is_block`` says whether the collate itself made a block (what a local
    worker hands over as one) rather than a plain batch. ``production`` is
    what the batch cost its actor: seconds from its first fetch to its
    packed block, and CPU seconds; ``finished`` the actor's wall-clock
    time (``time.time()``) at the end, which the trainer maps onto its
    own clock. ``host``, ``node_ip``, ``node_id`` (Ray's) and ``pid`` say
    which actor made it.
    """
    block: np.ndarray
    structure: bytes
    entries: list
    small_end: int
    complete: bool
    is_block: bool
    production: float
    cpu: float
    finished: float
    host: str
    node_ip: str
    pid: int
    node_id: str


class NodeReport(NamedTuple):
    """Where a producer runs and whether it can load the dataset."""
    host: str
    node_ip: str
    pid: int
    version: str
    problem: Optional[str]


class BatchProducer:
    """Produces packed batches from indices (the body of a Ray actor).

    Args:
        dataset: The train DataLoader's dataset.
        collate_fn (callable): The DataLoader's ``collate_fn``.
        seed (int): The worker seed ``get_worker_info()`` reports.
    """

    def __init__(self, dataset: Any, collate_fn: Callable, seed: int) -> None:
        import ray
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.where = (socket.gethostname(), ray.util.get_node_ip_address(),
                      os.getpid())
        self.node_id = ray.get_runtime_context().get_node_id()
        # The actor process does a DataLoader worker's job and nothing
        # else: datasets and collates that ask get_worker_info() (seeding
        # wrappers, block_collate) must take their worker path here too.
        act_as_worker(dataset, seed)

    def report(self) -> NodeReport:
        """This node's name and version, and the error loading the first
        sample gives here (a path missing on this node), if any."""
        problem = None
        try:
            self.dataset[0]
        except Exception as error:  # noqa: BLE001 (reported by node)
            problem = f'{type(error).__name__}: {error}'
        return NodeReport(*self.where, __version__, problem)

    def produce(self, indices: List[Any]) -> ProducedBatch:
        """The batch of ``indices``, collated and packed into one block."""
        start, cpu = time.perf_counter(), time.thread_time()
        batch = self.collate_fn([self.dataset[index] for index in indices])
        is_block = isinstance(batch, BatchBlock)
        if not is_block:
            batch = pack_batch(batch)
        return ProducedBatch(batch.block.numpy(), batch.structure,
                             batch.entries, batch.small_end, batch.complete,
                             is_block, time.perf_counter() - start,
                             time.thread_time() - cpu, time.time(),
                             *self.where, self.node_id)
