"""RemoteCachePrefetchHook: one prefetcher per node that knows the future."""
import logging
import math
import os
import time
from typing import Optional, Sequence, Union

from mmengine.dist import broadcast_object_list, get_dist_info
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS
from mmengine.runner import IterBasedTrainLoop

from ...cache.node_store import NodeStore
from ...cache.size_units import parse_size
from ...remote_cache.coalesced_reads import CoalesceLimits
from ...remote_cache.consumption_cursors import CursorWriter
from ...remote_cache.pipeline_routing import (SampleFiles,
                                              find_node_cache_args,
                                              pipeline_transforms,
                                              route_through_node_cache)
from ...remote_cache.prefetch_process import PrefetchProcess, PrefetchSpec
from ...sample_order.epoch_walk import EpochWalk, iteration_stop
from ...sample_order.global_order import sample_order_of
from ...sample_order.node_stream import NodeStream
from ...transforms.cached_pipeline_head import CachedPipelineHead
from ...utils.torch_internals import started_iterator


def node_ranks() -> tuple:
    """``(local rank, ranks on this node)``, as the launcher set them.

    torchrun sets ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``; without both,
    every rank is taken to be on one node, so that one prefetcher serves
    them all (never two on one cache directory).
    """
    rank, world_size = get_dist_info()
    local_rank = os.environ.get('LOCAL_RANK')
    local_size = os.environ.get('LOCAL_WORLD_SIZE')
    if local_rank is None or local_size is None:
        return rank, world_size
    return int(local_rank), int(local_size)


def _drop_last(loader) -> bool:
    inner = getattr(loader.batch_sampler, 'batch_sampler',
                    loader.batch_sampler)
    return bool(getattr(inner, 'drop_last', False))


def _base_dataset(dataset):
    seen = 0
    while not hasattr(dataset, 'get_data_info') and seen < 8:
        dataset, seen = getattr(dataset, 'dataset', None), seen + 1
    return dataset


@HOOKS.register_module()
class RemoteCachePrefetchHook(Hook):
    """Download the node's next samples ahead and keep what is read again
    soonest, under the node cache's byte budget.

    The train dataset reads through ``backend_args=dict(backend=
    'node_cache', remote=..., cache_dir=..., cache_limit=...)`` (see
    :class:`~mmdata_plugin.remote_cache.node_cache_backend.NodeCacheBackend`);
    this hook finds those arguments in the pipeline. On every rank it
    publishes the rank's position in the sample stream after each batch; on
    the first rank of each node it forks one prefetch process that computes
    the node's future reads from the sampler's own order math (seed, epoch,
    position), downloads them ahead with as many requests in flight as the
    measured latency needs, and keeps or drops each sample by furthest next
    use (Belady with bypass). Works with the fast-resume loops and mmengine's
    loops, persistent workers included; after a resume (other world size
    too) it plans from the resumed position and reuses the files on disk.

    Args:
        path_keys (Sequence[str]): Data-info keys holding the files a
            sample reads. Defaults to ``('img_path', 'seg_map_path')``.
        prefetch_reserve (int | str | float): Part of ``cache_limit`` held
            for files downloaded ahead of their read that the plan does not
            keep (bytes, ``'2GB'``, or a fraction of the limit); each is
            freed as soon as a DataLoader worker has read it. ``'auto'``:
            what the prefetch window's downloads need by Little's law
            (read-ahead plus measured rate x latency, times the miss
            share), followed as rates are measured, at most 5% of the
            limit (at least 4 samples). Defaults to ``'auto'``.
        max_inflight (int): Most downloads at once. Defaults to 64.
        download_processes (int): Processes the prefetch process forks to
            download (~1,000 downloads of 100 KB per second per core); the
            plan stays one, in the prefetch process, which reserves each
            download's bytes and hands it over. 1 downloads on threads of
            the prefetch process, where the downloads and the plan contend
            for one interpreter lock (measured: 0.7x the samples/s of 2 on
            tar shards). Defaults to 2.
        horizon_epochs (float): Look-ahead for next uses, in epochs (passes
            of the dataset for infinite samplers). Two see every reuse.
            Defaults to 2.
        max_horizon (int): Cap of the look-ahead in samples (memory: ~40
            bytes each); a sample read again beyond it is kept where no
            sooner-read sample needs the room (a fixed set). Defaults to
            2**23.
        cache_dir (str, optional): Node-local cache directory. Given with
            ``cache_limit``, the train pipeline's loading transforms are
            routed through the node cache (what they read with before
            becomes ``remote``), so this hook is the only config change.
            Unneeded when the pipeline already reads with
            ``backend_args=dict(backend='node_cache', ...)``.
        cache_limit (int | str, optional): Byte budget of the node cache,
            e.g. ``'200GB'``.
        remote (dict, optional): ``backend_args`` of the remote backend for
            routed transforms; None keeps each transform's own.
        coalesce (bool): Fetch the members of remote tar shards
            (``tarmember://`` paths, ``TarShardDataset``) that the
            prefetcher downloads at once and that lie close together in a
            shard with one range GET of the bytes covering them; each
            member's entry is cut from it (checked against the shard's
            size and ETag, the span's and the member's length). A request
            counts once against ``max_inflight``, so the prefetcher looks
            further ahead. Other paths are fetched one request each.
            Defaults to True.
        coalesce_max_gap (int | str): Most bytes between two members one
            request covers (tar headers, small members such as ``.cls``,
            members kept already or not read now), downloaded and thrown
            away. Defaults to ``'16KiB'``: a few headers, so a request
            reads about the bytes of its members.
        coalesce_max_span (int | str): Most bytes one request covers (held
            in the prefetch process's memory until its members are
            written). Defaults to ``'8MiB'``.
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 path_keys: Sequence[str] = ('img_path', 'seg_map_path'),
                 prefetch_reserve: Union[int, str, float] = 'auto',
                 max_inflight: int = 64,
                 download_processes: int = 2,
                 horizon_epochs: float = 2,
                 max_horizon: int = 1 << 23,
                 cache_dir: Optional[str] = None,
                 cache_limit: Union[int, str, None] = None,
                 remote: Optional[dict] = None,
                 coalesce: bool = True,
                 coalesce_max_gap: Union[int, str] = '16KiB',
                 coalesce_max_span: Union[int, str] = '8MiB') -> None:
        if (max_inflight < 1 or download_processes < 1 or horizon_epochs <= 0
                or max_horizon < 1):
            raise ValueError(
                'RemoteCachePrefetchHook needs max_inflight >= 1, '
                'download_processes >= 1, horizon_epochs > 0 and '
                f'max_horizon >= 1, got {max_inflight}, {download_processes}, '
                f'{horizon_epochs}, {max_horizon}')
        self.path_keys = tuple(path_keys)
        self.prefetch_reserve = prefetch_reserve
        self.max_inflight = max_inflight
        self.download_processes = download_processes
        self.horizon_epochs = horizon_epochs
        self.max_horizon = max_horizon
        self.overrides = dict(cache_dir=cache_dir, cache_limit=cache_limit,
                              remote=remote)
        self.coalesce = CoalesceLimits(
            parse_size(coalesce_max_gap, 'coalesce_max_gap'),
            parse_size(coalesce_max_span, 'coalesce_max_span')) \
            if coalesce else None
        self.process: Optional[PrefetchProcess] = None
        self._writer: Optional[CursorWriter] = None
        self._loader = None
        self._infinite: Optional[bool] = None
        self._node_stream: Optional[NodeStream] = None
        self._walk: Optional[EpochWalk] = None
        self._head_serves = None

    # -- setup ----------------------------------------------------------------

    def _cache_args(self, loader) -> dict:
        dataset = loader.dataset
        args = find_node_cache_args(dataset)
        if args is not None:
            return args
        given = self.overrides
        if not (given['cache_dir'] and given['cache_limit']):
            raise ValueError(
                'RemoteCachePrefetchHook: no transform of the train pipeline '
                "reads with backend_args=dict(backend='node_cache', ...); "
                'give the hook cache_dir and cache_limit to route them '
                'through the node cache (docs/remote_cache.md).')
        if started_iterator(loader) is not None:
            raise RuntimeError(
                'RemoteCachePrefetchHook cannot route the pipeline through '
                'the node cache: the DataLoader workers already run (a loop '
                'that starts them before `before_train`). Set the loading '
                "transforms' backend_args=dict(backend='node_cache', ...) "
                'in the config instead.')
        routed = route_through_node_cache(dataset, given['cache_dir'],
                                          given['cache_limit'],
                                          given['remote'])
        print_log(
            f'RemoteCachePrefetchHook: {routed} loading transform(s) of the '
            f'train pipeline read through the node cache {given["cache_dir"]}'
            f' (cache_limit={given["cache_limit"]}).',
            logger='current')
        return find_node_cache_args(dataset)

    def _reserve(self, limit: int) -> Optional[int]:
        value = self.prefetch_reserve
        if value == 'auto':
            return None
        if isinstance(value, float) and 0 < value < 1:
            return int(limit * value)
        return parse_size(value, 'prefetch_reserve')

    def before_train(self, runner) -> None:
        loop = runner.train_loop
        self._loader = loop.dataloader
        args = self._cache_args(self._loader)
        self._args = args
        token = [time.time_ns()]
        broadcast_object_list(token)
        rank, _ = get_dist_info()
        # The store claims (or checks) the directory before anything of
        # ours is written into it.
        NodeStore(args['cache_dir'], args['cache_limit'])
        self._writer = CursorWriter(args['cache_dir'], rank, token[0])
        self._token = token[0]
        self._head_serves = self._link_head_sources(self._loader)

    @staticmethod
    def _link_head_sources(loader):
        """A ``CachedPipelineHead`` of the pipeline serves its samples' image
        files from its entries once warm: have it link each file to its
        entry, so that the plan skips the files it serves; what tells
        whether it does (None without a head)."""
        for transform in pipeline_transforms(loader.dataset):
            if isinstance(transform, CachedPipelineHead):
                if started_iterator(loader) is not None:
                    # Workers hold their own copies of the head already.
                    return None
                return transform.record_sources().serves
        return None

    def _stream(self) -> NodeStream:
        rank, world_size = get_dist_info()
        local_rank, local_size = node_ranks()
        order = sample_order_of(self._loader.batch_sampler, world_size)
        return NodeStream(order, world_size, rank - local_rank, local_size)

    def _consumed(self, runner, batch_idx: int) -> tuple:
        """(epoch, global samples consumed) once this batch is read."""
        loop = runner.train_loop
        resumer = getattr(loop, 'data_resumer', None)
        if resumer is not None and resumer.position.samples_per_batch:
            position = resumer.position
            return position.epoch, position.samples_in_epoch
        _, world_size = get_dist_info()
        per_batch = self._loader.batch_size * world_size
        if self._infinite:
            return 0, (runner.iter + 1) * per_batch
        if isinstance(loop, IterBasedTrainLoop):
            # runner.epoch stays 0 and batch_idx counts every iteration,
            # while the DataLoader restarts at each epoch end.
            if self._walk is None:
                self._walk = EpochWalk(self._node_stream,
                                       self._loader.batch_size,
                                       _drop_last(self._loader))
            return self._walk.position(runner.iter + 1)
        return runner.epoch, (batch_idx + 1) * per_batch

    def _start_prefetcher(self, runner, stream: NodeStream) -> None:
        loader, loop = self._loader, runner.train_loop
        _, world_size = get_dist_info()
        per_batch = loader.batch_size * world_size
        limit = parse_size(self._args['cache_limit'], 'cache_limit')
        if stream.endless:
            stop = stream.tick_of(0, loop.max_iters * per_batch)
            pass_ticks = math.ceil(len(loader.dataset) * stream.local_ranks /
                                   world_size)
        else:
            if isinstance(loop, IterBasedTrainLoop):
                stop, epochs = iteration_stop(stream, loop.max_iters,
                                              loader.batch_size,
                                              _drop_last(loader))
            else:
                stop = stream.epoch_start(loop.max_epochs)
                epochs = loop.max_epochs
            # Epochs may differ in length (a growing window): the
            # look-ahead covers the longest.
            pass_ticks = max(
                stream.epoch_ticks_of(epoch) for epoch in range(epochs))
        # Batches each rank's workers may have read beyond the loop's
        # position: those in flight, the one being collated, and one for a
        # rank that runs an iteration ahead of the slowest.
        workers = loader.num_workers
        batches_ahead = workers * (loader.prefetch_factor or 2) + 2 \
            if workers else 2
        sample_urls = SampleFiles(_base_dataset(loader.dataset),
                                  self.path_keys, self._head_serves)
        sample_urls.check_keys('RemoteCachePrefetchHook.path_keys')
        spec = PrefetchSpec(
            cache_dir=self._args['cache_dir'],
            cache_limit=limit,
            remote=self._args.get('remote'),
            size_hint=int(self._args.get('size_hint', 0)),
            stream=stream,
            sample_urls=sample_urls,
            ranks=list(range(stream.first_rank,
                             stream.first_rank + stream.local_ranks)),
            token=self._token,
            reserve=self._reserve(limit),
            readahead=batches_ahead * loader.batch_size * stream.local_ranks,
            max_inflight=self.max_inflight,
            stop=stop,
            download_processes=self.download_processes,
            coalesce=self.coalesce,
            horizon=min(self.max_horizon,
                        max(1, int(self.horizon_epochs * pass_ticks))))
        self.process = PrefetchProcess(spec)
        runner.logger.info(
            f'RemoteCachePrefetchHook: node prefetcher started for ranks '
            f'{spec.ranks[0]}..{spec.ranks[-1]} (cache_limit '
            f'{self._args["cache_limit"]}, reserve '
            f'{"auto" if spec.reserve is None else spec.reserve}, '
            f'look-ahead {spec.horizon} samples, {spec.download_processes} '
            'download process(es)).')

    # -- per iteration ----------------------------------------------------

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch=None) -> None:
        if self._writer is None:
            return
        if self._infinite is None:
            # The loops position (and reseed) the sampler before the first
            # batch: only now is the order final.
            stream = self._node_stream = self._stream()
            self._infinite = stream.endless
            if node_ranks()[0] == 0:
                self._start_prefetcher(runner, stream)
        epoch, consumed = self._consumed(runner, batch_idx)
        self._writer.publish(epoch, consumed)
        if self.process is not None and not self.process.alive:
            code, self.process = self.process.exitcode, None
            raise RuntimeError(
                f'The node cache prefetcher exited (code {code}); its error '
                'is logged above. Training would go on downloading every '
                'sample on demand, so it stops here.')

    # -- shutdown ---------------------------------------------------------

    def _shutdown(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def after_train(self, runner) -> None:
        self._shutdown()

    def after_run(self, runner) -> None:
        self._shutdown()

    def __del__(self):
        try:
            self._shutdown()
        except Exception:  # interpreter shutdown: best effort
            print_log('RemoteCachePrefetchHook: shutdown at exit failed',
                      logger='current', level=logging.DEBUG)
