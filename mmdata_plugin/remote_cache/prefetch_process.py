"""Run a node's prefetcher in a process of its own.

Forked from the training process of the node's first rank, so that it
inherits the sampler and the dataset (no pickling, no second index build)
and its downloads and planning do not compete with training for the GIL.
It stops when told, when its parent dies, or on Ctrl-C; its downloads are
daemon threads (or processes it forks, see :mod:`.download_processes`)
and anything they leave half-written is a temp file that the store
reclaims.
"""
import contextlib
import gc
import multiprocessing
import os
import time
from multiprocessing.connection import wait
from typing import Callable, List, NamedTuple, Optional

from mmengine.logging import print_log

from ..cache.node_store import NodeStore
from ..sample_order.node_stream import NodeStream
from .coalesced_reads import CoalesceLimits
from .consumption_cursors import CursorReader
from .node_cache_backend import RemoteReader
from .prefetcher import NodePrefetcher

_POLL_SECONDS = 0.005
_STATUS_SECONDS = 0.5


class PrefetchSpec(NamedTuple):
    """Everything the prefetch process needs (inherited by fork)."""
    cache_dir: str
    cache_limit: int
    remote: Optional[dict]
    size_hint: int
    stream: NodeStream
    sample_urls: Callable[[int], List[str]]
    ranks: List[int]
    token: int
    reserve: Optional[int]
    readahead: int
    max_inflight: int
    stop: Optional[int]
    horizon: int
    download_processes: int = 1
    coalesce: Optional[CoalesceLimits] = None


def build_prefetcher(spec: PrefetchSpec) -> NodePrefetcher:
    store = NodeStore(spec.cache_dir, spec.cache_limit)
    prefetcher = NodePrefetcher(
        RemoteReader(store, spec.remote, spec.size_hint),
        spec.stream,
        spec.sample_urls,
        CursorReader(spec.cache_dir, spec.ranks, spec.token),
        reserve=spec.reserve,
        readahead=spec.readahead,
        max_inflight=spec.max_inflight,
        stop=spec.stop,
        horizon=spec.horizon,
        download_processes=spec.download_processes,
        coalesce=spec.coalesce)
    # The plan decides what goes when a download needs room.
    store.eviction_policy = prefetcher.victims
    return prefetcher


def _run(spec: PrefetchSpec, stop, parent: int) -> None:
    # The objects forked from the training process are never freed here:
    # out of the collector's reach, a full collection walks only this
    # process's own (and writes no reference counts into shared pages).
    gc.freeze()
    prefetcher = build_prefetcher(spec)
    next_status = 0.0
    try:
        while not stop.poll() and os.getppid() == parent:
            prefetcher.poll()
            now = time.monotonic()
            if now >= next_status:
                prefetcher.write_status(spec.cache_dir)
                prefetcher.write_victims(spec.cache_dir)
                next_status = now + _STATUS_SECONDS
            # Woken by an answer of a download process too.
            wait([stop] + prefetcher.connections(), _POLL_SECONDS)
    except KeyboardInterrupt:
        pass
    finally:
        prefetcher.close()
        prefetcher.write_status(spec.cache_dir)


class PrefetchProcess:
    """Start, and stop cleanly, the prefetch process of a node.

    Args:
        spec (PrefetchSpec): What to prefetch.
    """

    def __init__(self, spec: PrefetchSpec) -> None:
        context = multiprocessing.get_context('fork')
        # A pipe, not an Event: a process killed (kill -9, OOM) inside
        # Event.wait leaves the Event's condition counting it as a sleeper,
        # and Event.set() then waits for it forever -- the training process
        # would hang in stop().
        stop, self._stop = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_run,
            args=(spec, stop, os.getpid()),
            name='node-cache-prefetch',
            daemon=True)
        self._process.start()

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    @property
    def exitcode(self) -> Optional[int]:
        return self._process.exitcode

    def stop(self, timeout: float = 30) -> None:
        """Ask the process to stop; kill it if it does not within
        ``timeout`` seconds (a download stuck on a dead connection)."""
        with contextlib.suppress(OSError):  # dead already: no reader
            self._stop.send(None)  # a few bytes: never blocks
        self._process.join(timeout)
        if self._process.is_alive():
            print_log(
                'The remote cache prefetcher did not stop within '
                f'{timeout:.0f} s; killing it (the store reclaims what it '
                'was writing).',
                logger='current')
            self._process.kill()
            self._process.join()
