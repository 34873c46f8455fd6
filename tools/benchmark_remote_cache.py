# Training from a slow remote: loader throughput, batch waits, remote bytes
# and duplicate downloads of each way to read the same samples.
#
#   python tools/benchmark_remote_cache.py            # 20k x 100 KB, 2 x 2
#   python tools/benchmark_remote_cache.py --quick    # ~2 minutes
#   python tools/benchmark_remote_cache.py --download-rate 2000
#       # downloads/s and CPU per download against download processes
#   python tools/benchmark_remote_cache.py --tar-shards 50
#       # the same samples packed in tar shards, through the node cache
#       # with each member its own range GET and with coalesced ones
#   python tools/bootstrap.py --extras bench   # LitData + Mosaic, once
#   python tools/benchmark_remote_cache.py --tar-shards 50 \
#       --tar-orders window,global,litdata,mosaic --tar-coalesce on
#       # side by side: the same samples as LitData chunks and MosaicML
#       # Streaming MDS shards of the same samples each, read as s3:// from
#       # the same remote at the same cache budget, with a shuffle-quality
#       # figure for every order (see shuffle_quality)
#
# The data set (random, incompressible samples with their index in the
# first 8 bytes, so every read is checked) is served by our loopback HTTP
# server (mmdata_plugin.testing.loopback_http) with --latency per request
# and a --bandwidth cap shared by all connections. Each configuration runs
# --ranks real ranks (torchrun, gloo) x --workers DataLoader workers over a
# RankShardedDataset + RankShardedSampler (the same order math as training)
# for --epochs epochs, and reads every sample through one reader:
#
#   local             the same files on local disk (the reference)
#   mmengine_http     mmengine's stock HTTPBackend (urlopen per sample)
#   remote_http       our pooled, retried HTTP backend, no cache
#   fsspec_simple     fsspec's simplecache:: in front of HTTP (no size
#                     limit exists in fsspec: the budget is not applied)
#   litdata, mosaic   run over packed data only (--tar-shards; see
#                     pack_litdata / pack_mds), else reported, not run
#   ours@<b>%         our node cache at <b>% of the data set (see
#                     ours_backend_args / ours_prefetch below)
#
# Reported per configuration (both ranks together): loader samples/s per
# epoch, p99 batch wait, remote MB per epoch and over the data set size,
# hit rate (reads not served by a download) next to the hit rates of
# Belady-with-bypass (the optimum), LRU and keep-a-fixed-set computed
# offline on the very trace the node read at the same budget, remote bytes
# over Belady's (MB/opt), duplicate downloads (a sample downloaded more than
# once within one epoch), peak sample bytes on disk (entries and downloads
# in flight) over the budget, wrong samples (must be 0), and "bw use":
# remote MB/s over the cap, i.e. samples/s over the bound the bandwidth
# sets for the bytes this config downloads per sample (1.00 = at the
# bound; the goal is >= 0.95 wherever samples/s is below local's).
# Below the table, each ours@ run's hit rates next to Belady's and the
# fixed set's at the capacity its plan keeps samples in: the budget less
# the prefetch reserve that downloads in flight and read ahead take.
# Readers without a planner are bound at ranks x workers / latency
# samples/s (one request in flight per worker), so they read a subset of
# the data set sized to take --time-box seconds per epoch at that bound
# (the "set" column); an epoch still running after 3x that is cut and
# marked '*' (its rate stays a measured one).
import argparse
import contextlib
import importlib.util
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional, Sequence

import numpy as np

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
BASELINES = ('local', 'mmengine_http', 'remote_http', 'fsspec_simple',
             'litdata', 'mosaic')
# PyPI names of the streaming loaders compared when they install.
PIP_NAMES = dict(litdata='litdata', mosaic='mosaicml-streaming')
IMPORT_NAMES = dict(litdata='litdata', mosaic='streaming')
HEADER_BYTES = 8
# Orders of the tar shard runs (--tar-shards), and the suffix of a run
# whose node cache coalesces neighbouring members.
TAR_ORDERS = ('window', 'global')
COALESCED = '+coalesced'
# The other loaders of the packed runs, reading their own formats of the
# same samples as s3:// objects of this bucket (a folder the loopback
# server serves: an S3 GET of /<bucket>/<key> path-style is a GET of that
# file), and the credentials boto3 signs with (the server checks none).
PACKED_LOADERS = ('litdata', 'mosaic')
S3_BUCKET = 'packed'
S3_ENV = dict(AWS_ACCESS_KEY_ID='bench', AWS_SECRET_ACCESS_KEY='bench',
              AWS_DEFAULT_REGION='us-east-1')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Remote reading and caching benchmark on a loopback '
        'HTTP remote with latency and a bandwidth cap')
    parser.add_argument('--samples', type=int, default=20000)
    parser.add_argument('--sample-kb', type=float, default=100)
    parser.add_argument('--latency', type=float, default=0.05,
                        help='seconds per request (default 0.05)')
    parser.add_argument('--bandwidth', type=float, default=100,
                        help='MB/s shared by all connections (default 100)')
    parser.add_argument('--ranks', type=int, default=2)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--budgets', default='10,25,50',
                        help='cache budgets in %% of the data set')
    parser.add_argument('--configs', default=None,
                        help='comma-separated subset of ' +
                        ','.join(BASELINES) + ',ours')
    parser.add_argument('--time-box', type=float, default=120,
                        help='seconds per epoch that sizes the subset read '
                        'by readers without a planner')
    parser.add_argument('--quick', action='store_true',
                        help='2000 samples, 25%% budget, batch size 16, '
                        '6 s time box, no fsspec')
    parser.add_argument(
        '--planner-scale', default=None, metavar='N,N,...',
        help='only simulate the planner (no downloads) on node 0 of each '
        'of --planner-nodes nodes reading each number of samples per '
        'epoch (RankShardedSampler), with the sampler\'s inverse and with '
        'a look-ahead of --planner-horizon ticks, against Belady; and check '
        'the exact next uses of 1e6 ticks at every size')
    parser.add_argument('--planner-horizon', type=int, default=1 << 14)
    parser.add_argument('--planner-nodes', default='1,4', metavar='K,K,...')
    parser.add_argument(
        '--planner-ticks', type=float, default=3e7,
        help='largest number of ticks (3 epochs) planned tick by tick')
    parser.add_argument(
        '--planner-window', default=None, metavar='N,N,...',
        help='only simulate the planner tick by tick (no downloads) on one '
        'node of one rank reading each number of samples per epoch, in '
        'windows of epoch 2 started from Belady\'s own kept set, against '
        'Belady: hits, decisions/s, kept-set bytes and peak RSS')
    parser.add_argument(
        '--planner-window-ticks', type=float, default=1e7,
        help='ticks simulated per size, split between the windows')
    parser.add_argument(
        '--planner-window-centres', default='0.125,0.25,0.375',
        metavar='F,F,...',
        help='centres of the windows, as shares of epoch 2 (default: '
        'within the samples kept from epoch 1, across their end, past it)')
    parser.add_argument(
        '--books-window', default=None, metavar='N,N,...',
        help='only simulate the node prefetcher (its plan and books, '
        'downloads instant and nothing written) on one node of one rank '
        'reading each number of samples per epoch, --books-window-kept of '
        'them kept, in windows of epoch 2 started from Belady\'s own kept '
        'set: hits, decisions/s, plan and books bytes per kept sample and '
        'resident memory')
    parser.add_argument(
        '--books-window-kept', type=float, default=1e7,
        help='samples the plan keeps (its capacity)')
    parser.add_argument(
        '--books-window-ticks', type=float, default=4e5,
        help='ticks simulated per size, split between the windows')
    parser.add_argument(
        '--books-window-centres', default='0.5,1.5', metavar='F,F,...',
        help='centres of the windows in epoch 2, in kept samples (default: '
        'within the samples kept from epoch 1, past them)')
    parser.add_argument(
        '--download-cpu', type=int, default=None, metavar='FILES',
        help='only measure the CPU time of downloads into the node store '
        '(thread CPU clock, FILES of --sample-kb from an in-memory '
        'loopback server with MD5 ETags), clean and with 5%% of the '
        'bodies corrupted')
    parser.add_argument(
        '--download-rate', type=int, default=None, metavar='FILES',
        help='only measure the node prefetcher downloading FILES of '
        '--sample-kb (one epoch, all kept) from a loopback server in '
        'another process with --download-processes download processes: '
        'downloads/s and CPU ms per download in the prefetch process '
        '(planning, booking, IPC; the downloads too with one process) and '
        'in the download processes; medians of --repeats runs')
    parser.add_argument('--download-processes', default='1,2,4',
                        metavar='N,N,...')
    parser.add_argument(
        '--tar-shards', type=int, default=None, metavar='SAMPLES',
        help='only run our node cache over the samples packed into tar '
        'shards of SAMPLES samples (TarShardDataset), in each of '
        '--tar-orders, with every member its own range GET and with '
        'neighbouring members coalesced (RemoteCachePrefetchHook\'s '
        'coalesce): samples/s, GETs and MB per epoch, medians of --repeats '
        'runs (each config once per repeat, in turn)')
    parser.add_argument(
        '--tar-orders', default='window,global', metavar='ORDER,...',
        help='window: ShardWindowSampler (--window-shards shards a window); '
        'global: RankShardedSampler\'s global shuffle; litdata: LitData\'s '
        'StreamingDataset(shuffle=True) over optimize() chunks of '
        '--tar-shards samples; mosaic: MosaicML Streaming\'s '
        'StreamingDataset(shuffle=True) over MDS shards of --tar-shards '
        'samples, with its default shuffle_block_size (4,000,000 / '
        'num_canonical_nodes samples, at least 262,144: more than a small '
        'data set, so its py1e shuffle spreads every shard over the whole '
        'epoch); mosaic-bN: with shuffle_block_size=N (both loaders: '
        'python tools/bootstrap.py --extras bench)')
    parser.add_argument('--tar-coalesce', default='off,on',
                        metavar='off,on',
                        help='our tar runs with each member its own GET '
                        '(off), coalesced (on) or both')
    parser.add_argument('--window-shards', type=int, default=4)
    parser.add_argument('--coalesce-max-gap', default='16KiB',
                        help='RemoteCachePrefetchHook(coalesce_max_gap=) '
                        'of the coalesced tar runs')
    parser.add_argument('--coalesce-max-span', default='8MiB')
    parser.add_argument('--prefetch-reserve', default=None,
                        help='a fixed prefetch_reserve (e.g. 14MB) for the '
                        'tar runs; default: auto')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument(
        '--work-dir',
        default=osp.join(tempfile.gettempdir(), 'mmdata_benchmark_remote'))
    parser.add_argument('--rank-run', help=argparse.SUPPRESS)
    parser.add_argument('--root', help=argparse.SUPPRESS)
    parser.add_argument('--reader', help=argparse.SUPPRESS)
    parser.add_argument('--subset', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--shards', help=argparse.SUPPRESS)
    parser.add_argument('--cache-limit', type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.samples = min(args.samples, 2000)
        args.budgets = '25'
        args.batch_size = min(args.batch_size, 16)
        args.time_box = min(args.time_box, 6)
    return args


# ---------------------------------------------------------------- data
def write_dataset(root: str, samples: int, sample_bytes: int) -> str:
    """``samples`` random files + a ``path label`` list; returns the list."""
    ann_file = osp.join(root, 'train.txt')
    if osp.exists(ann_file):
        return ann_file
    rng = np.random.default_rng(0)
    os.makedirs(osp.join(root, 'data'), exist_ok=True)
    lines = []
    for i in range(samples):
        # +-25% sizes around the mean, like real encoded images.
        size = int(sample_bytes * rng.uniform(0.75, 1.25))
        rel = f'data/{i % 100:02d}/{i:07d}.bin'
        os.makedirs(osp.join(root, osp.dirname(rel)), exist_ok=True)
        with open(osp.join(root, rel), 'wb') as f:
            f.write(i.to_bytes(HEADER_BYTES, 'little'))
            f.write(rng.bytes(max(0, size - HEADER_BYTES)))
        lines.append(f'{rel} {i % 1000}\n')
    with open(ann_file + '.tmp', 'w') as f:
        f.writelines(lines)
    os.replace(ann_file + '.tmp', ann_file)
    return ann_file


# ------------------------------------------------- "ours": the node cache
def ours_backend_args(cache_dir: str, cache_limit: int) -> dict:
    """``backend_args`` of our cached reader at a byte budget.

    The reader is the ``node_cache`` fileio backend in front of our HTTP
    backend; the prefetcher that fills it from the known order is started
    by :func:`ours_prefetch`.
    """
    return dict(
        backend='node_cache',
        remote=dict(backend='remote_http'),
        cache_dir=cache_dir,
        cache_limit=cache_limit)


def ours_available() -> bool:
    import mmdata_plugin  # noqa: F401  (registers the backends)
    from mmengine.fileio.backends import backends
    return 'node_cache' in backends


@contextlib.contextmanager
def ours_prefetch(dataset, sampler, backend_args: dict, epochs: int,
                  batch_size: int, workers: int,
                  coalesce: Optional[dict] = None,
                  reserve: Optional[str] = None):
    """Run the node's prefetcher around a rank's loop.

    What ``RemoteCachePrefetchHook`` does in a runner, for this bare loop:
    every rank publishes its position (the yielded cursor writer, after each
    batch); the node's first rank forks the prefetch process that plans the
    node's reads from the sampler's order math.
    """
    import torch.distributed as dist
    from torch.utils.data import BatchSampler

    from mmdata_plugin.cache.node_store import NodeStore
    from mmdata_plugin.cache.size_units import parse_size
    from mmdata_plugin.engine.hooks.remote_cache_prefetch_hook import (
        RemoteCachePrefetchHook, node_ranks)
    from mmdata_plugin.remote_cache.consumption_cursors import CursorWriter
    from mmdata_plugin.remote_cache.pipeline_routing import SampleFiles
    from mmdata_plugin.remote_cache.prefetch_process import (PrefetchProcess,
                                                             PrefetchSpec)
    from mmdata_plugin.sample_order import NodeStream, sample_order_of
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank, local_size = node_ranks()
    cache_dir = backend_args['cache_dir']
    limit = parse_size(backend_args['cache_limit'])
    NodeStore(cache_dir, limit)  # claims the directory first
    token = [time.time_ns()]
    dist.broadcast_object_list(token)
    writer = CursorWriter(cache_dir, rank, token[0])
    writer.publish(0, 0)
    process = None
    if local_rank == 0:
        # The hook's defaults (download processes, coalescing limits), as
        # a user's config block gets them.
        hook = RemoteCachePrefetchHook(**(coalesce or {}))
        stream = NodeStream(
            sample_order_of(BatchSampler(sampler, batch_size, False),
                            world_size), world_size, rank, local_size)
        # The node's reads, for the offline policies of the report.
        np.save(osp.join(osp.dirname(cache_dir), 'trace.npy'),
                stream.ids(0, epochs * stream.epoch_ticks))
        process = PrefetchProcess(
            PrefetchSpec(
                cache_dir=cache_dir,
                cache_limit=limit,
                remote=backend_args.get('remote'),
                size_hint=0,
                stream=stream,
                sample_urls=SampleFiles(dataset, ('img_path', )),
                ranks=list(range(rank, rank + local_size)),
                token=token[0],
                reserve=reserve and parse_size(reserve, 'prefetch_reserve'),
                readahead=(2 * workers + 2) * batch_size * local_size,
                max_inflight=hook.max_inflight,
                download_processes=hook.download_processes,
                stop=epochs * stream.epoch_ticks,
                horizon=2 * stream.epoch_ticks,
                coalesce=hook.coalesce if coalesce else None))
    try:
        yield writer
        if process is not None and not process.alive:
            raise RuntimeError(
                f'the node prefetcher exited (code {process.exitcode}) '
                'before the end; its error is in the output above')
    finally:
        if process is not None:
            process.stop()
        writer.close()


# ------------------------------------------------------------ readers
class ReadSample:
    """A transform reading a sample's bytes and checking its index.

    Args:
        mode (str): ``'fileio'`` (mmengine's fileio with ``backend_args``)
            or ``'fsspec'`` (``simplecache::`` + fsspec's HTTP).
        backend_args (dict, optional): For ``'fileio'``.
        cache_dir (str, optional): simplecache's storage for ``'fsspec'``.
    """

    def __init__(self, mode='fileio', backend_args=None, cache_dir=None):
        self.mode = mode
        self.backend_args = backend_args
        self.cache_dir = cache_dir

    def read(self, path: str) -> bytes:
        if self.mode == 'fsspec':
            import fsspec
            with fsspec.open(
                    f'simplecache::{path}',
                    'rb',
                    simplecache=dict(cache_storage=self.cache_dir)) as f:
                return f.read()
        from mmengine import fileio
        return fileio.get(path, backend_args=self.backend_args)

    def __call__(self, results: dict) -> dict:
        data = self.read(results['img_path'])
        # A tar member's key is its sample's line number (pack_image_list).
        index = int(results.get('sample_key')
                    or osp.basename(results['img_path']).split('.')[0])
        ok = data[:HEADER_BYTES] == index.to_bytes(HEADER_BYTES, 'little')
        return dict(index=index, nbytes=len(data), ok=ok)


def reader_settings(name: str, args, work_dir: str) -> dict:
    """``root`` (data prefix), ``ReadSample`` kwargs and ``subset`` (how
    many samples the configuration reads) of a configuration."""
    local_root = osp.join(work_dir, 'dataset')
    # Readers without a planner: one request in flight per worker.
    bound = args.ranks * args.workers / args.latency
    subset = min(args.samples, max(1, int(args.time_box * bound)))
    url = args.url
    if name == 'local':
        return dict(
            root=local_root, reader=dict(mode='fileio'), subset=args.samples)
    if name == 'mmengine_http':
        return dict(
            root=url,
            reader=dict(backend_args=dict(backend='http')),
            subset=subset)
    if name == 'remote_http':
        return dict(
            root=url,
            reader=dict(backend_args=dict(backend='remote_http')),
            subset=subset)
    if name == 'fsspec_simple':
        return dict(
            root=url,
            reader=dict(mode='fsspec', cache_dir=osp.join(work_dir, 'cache')),
            subset=subset)
    if name.startswith(TAR_ORDERS):
        # Members are read through the tar member backend (by prefix).
        backend_args = dict(
            ours_backend_args(
                osp.join(work_dir, 'cache'), args.budget_bytes[name]),
            remote=None)
        return dict(
            root=url + 'tar/',
            reader=dict(backend_args=backend_args),
            subset=args.samples)
    if name.startswith(PACKED_LOADERS):
        # Their own format of the samples, as s3:// (pack_litdata/pack_mds).
        return dict(root=args.packed_urls[name.split('@')[0].split('-')[0]],
                    reader={},
                    subset=args.samples)
    if name.startswith('ours@'):
        return dict(
            root=url,
            reader=dict(
                backend_args=ours_backend_args(
                    osp.join(work_dir, 'cache'), args.budget_bytes[name])),
            subset=args.samples)
    raise ValueError(f'unknown configuration {name!r}')


# --------------------------------------------------------------- a rank
def collate(batch):
    return batch


def run_rank(args) -> None:
    import torch.distributed as dist
    from mmcv.transforms import TRANSFORMS
    from torch.utils.data import DataLoader

    from mmdata_plugin.datasets import (RankShardedDataset,
                                        RankShardedSampler,
                                        ShardWindowSampler)
    dist.init_process_group('gloo')
    TRANSFORMS.register_module(name='ReadSample', module=ReadSample,
                               force=True)
    reader = json.loads(args.reader)
    pipeline = [dict(type='ReadSample', **reader)]
    if args.rank_run.startswith(PACKED_LOADERS):
        run_epochs(args, packed_loader(args), None, contextlib.nullcontext())
        return
    if args.shards:
        dataset = tar_dataset(args, args.root, pipeline)
    else:
        dataset = RankShardedDataset(
            ann_file=osp.join(args.work_dir, 'dataset', 'train.txt'),
            data_prefix=dict(img_path=args.root),
            index_dir=osp.join(args.work_dir, 'index'),
            index_progress=False,
            # the first `subset` samples (RankShardedDataset's int indices)
            indices=args.subset,
            pipeline=pipeline)
    if args.rank_run.startswith('window'):
        sampler = ShardWindowSampler(
            dataset, seed=0, window_shards=args.window_shards)
    else:
        sampler = RankShardedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        persistent_workers=True,
        collate_fn=collate)
    context = ours_prefetch(
        dataset, sampler, reader.get('backend_args'), args.epochs,
        args.batch_size, args.workers,
        dict(coalesce_max_gap=args.coalesce_max_gap,
             coalesce_max_span=args.coalesce_max_span)
        if args.rank_run.endswith(COALESCED) else None, args.prefetch_reserve
    ) if args.rank_run.startswith(
                ('ours@', ) + TAR_ORDERS) else contextlib.nullcontext()
    run_epochs(args, loader, sampler, context)


def run_epochs(args, loader, sampler, context) -> None:
    """Read ``args.epochs`` epochs of ``loader`` on this rank and print
    its ``RESULT`` line: per epoch the times, samples, wrong samples, batch
    waits and the batches' sample indices in the order they came.

    Args:
        loader: Yields lists of ``dict(index=, ok=)`` (``ReadSample`` or
            :func:`packed_item_check`).
        sampler: Told each epoch (``set_epoch``); None for loaders that
            count their epochs themselves (LitData, Mosaic).
        context: Entered around the epochs; yields the cursor writer the
            node cache's prefetcher follows, or None.
    """
    import torch.distributed as dist
    rank = dist.get_rank()
    epochs = []
    per_batch = args.batch_size * dist.get_world_size()
    with context as cursor:
        for epoch in range(args.epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            dist.barrier()
            start = time.time()
            waits, samples, wrong, cut = [], 0, 0, False
            order = []
            batches = iter(loader)
            while True:
                asked = time.perf_counter()
                batch = next(batches, None)
                if batch is None:
                    break
                waits.append(time.perf_counter() - asked)
                if cursor is not None:
                    cursor.publish(epoch, len(waits) * per_batch)
                samples += len(batch)
                wrong += sum(not item['ok'] for item in batch)
                order.append([int(item['index']) for item in batch])
                if time.time() - start > 3 * args.time_box:
                    cut = True
                    break
            end = time.time()
            del batches
            dist.barrier()
            epochs.append(
                dict(
                    start=start,
                    end=end,
                    samples=samples,
                    wrong=wrong,
                    cut=cut,
                    waits=waits,
                    order=order))
    print('RESULT ' + json.dumps(dict(rank=rank, epochs=epochs)), flush=True)
    dist.destroy_process_group()


# -------------------------------------------------------------- driver
def directory_bytes(*paths: str) -> int:
    """Bytes of the regular files under ``paths`` (temp files included),
    summed by ``find`` in its own process: a walk in this process would
    hold the GIL that the loopback server needs."""
    result = subprocess.run(['find', *paths, '-type', 'f', '-printf',
                             '%s\n'],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL,
                            text=True)
    return sum(int(size) for size in result.stdout.split())


def run_config(name: str, args, server, work_dir: str) -> dict:
    from mmdata_plugin.testing import (cpu_env, python_path, run_command,
                                       torchrun_command)
    cache_dir = osp.join(work_dir, 'cache')
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.makedirs(cache_dir)
    settings = reader_settings(name, args, work_dir)
    server.reset_stats()
    peak = [0]
    done = threading.Event()

    def watch():
        # Sample data on disk: published entries and downloads in flight
        # (the ledger, counters and planner files are not sample bytes);
        # LitData's and Mosaic's whole cache folders (chunks, shards and
        # their partial downloads, a few small index and lock files).
        data = [cache_dir] if name.startswith(PACKED_LOADERS) else [
            osp.join(cache_dir, sub) for sub in ('entries', 'tmp')
        ]
        while not done.is_set():
            if all(osp.isdir(path) for path in data):
                peak[0] = max(peak[0], directory_bytes(*data))
            done.wait(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    cmd = torchrun_command(
        __file__, [
            '--rank-run', name, '--root', settings['root'], '--reader',
            json.dumps(settings['reader']), '--subset',
            str(settings['subset']), '--work-dir', work_dir,
            '--workers',
            str(args.workers), '--batch-size',
            str(args.batch_size), '--epochs',
            str(args.epochs), '--time-box',
            str(args.time_box), '--shards', args.shards or '',
            '--window-shards', str(args.window_shards),
            '--coalesce-max-gap', args.coalesce_max_gap,
            '--coalesce-max-span', args.coalesce_max_span,
            '--cache-limit', str(args.budget_bytes.get(name, 0))
        ] + (['--prefetch-reserve', args.prefetch_reserve]
             if args.prefetch_reserve else []),
        nproc=args.ranks)
    # LitData and Mosaic read the loopback server as an S3 endpoint.
    s3 = dict(S3_ENV, S3_ENDPOINT_URL=args.url.rstrip('/')) \
        if name.startswith(PACKED_LOADERS) else {}
    # The server's threads live in this process (the main thread only
    # waits): its CPU is what the stand-in remote spent on the run's
    # requests, on the cores the run's own processes use.
    server_cpu, children = time.process_time(), os.times()
    try:
        out = run_command(
            cmd,
            env=cpu_env(dict(PYTHONPATH=python_path(ROOT), **s3)),
            timeout=args.epochs * args.time_box * 4 + 300).stdout
    finally:
        done.set()
        watcher.join()
    server_cpu = time.process_time() - server_cpu
    ended = os.times()
    client_cpu = (ended.children_user + ended.children_system -
                  children.children_user - children.children_system)
    # Ranks print at the same moment; a long line of one may run into the
    # other's, so each object is decoded from where its tag starts.
    decoder = json.JSONDecoder()
    ranks = [
        decoder.raw_decode(chunk)[0]
        for chunk in out.split('RESULT ')[1:]
    ]
    result = summarize(name, ranks, server.download_log(), peak[0], args)
    result['subset'] = settings['subset']
    result.update(server_cpu_s=server_cpu, client_cpu_s=client_cpu)
    if name.startswith(('ours@', ) + TAR_ORDERS):
        trace = osp.join(work_dir, 'trace.npy')
        result['offline'] = offline_policies(trace, args.sample_sizes,
                                             args.budget_bytes[name],
                                             args.epochs)
        # The plan keeps samples in the budget less the prefetch reserve
        # (downloads in flight and read ahead count in the hard budget);
        # the offline policies stage nothing, so they are also run at the
        # plan's capacity: the comparison of the choices alone.
        with open(osp.join(cache_dir, 'planner', 'status.json')) as f:
            status = json.load(f)
        result['reserve'] = status['reserve']
        result['keep_capacity'] = status['keep_capacity']
        result['offline_keep'] = offline_policies(trace, args.sample_sizes,
                                                  status['keep_capacity'],
                                                  args.epochs)
    return result


def offline_policies(trace_file: str, sizes: np.ndarray, budget: int,
                     epochs: int) -> dict:
    """Hit rate and remote MB per epoch of Belady-with-bypass (the
    optimum), LRU and keep-a-fixed-set on the trace the run read, at the
    run's whole budget."""
    from mmdata_plugin.remote_cache import simulate_segments
    trace = np.load(trace_file)
    ticks = len(trace) // epochs
    segments = simulate_segments(trace, sizes, budget,
                                 [e * ticks for e in range(epochs + 1)])
    return {
        policy: [
            dict(hit_rate=r.hit_rate, remote_mb=r.remote_bytes / 1e6)
            for r in per_epoch
        ]
        for policy, per_epoch in segments.items()
    }


def summarize(name, ranks, log, peak_disk, args) -> dict:
    starts = [
        min(r['epochs'][e]['start'] for r in ranks)
        for e in range(args.epochs)
    ]
    # A download belongs to the epoch running when it ended; prefetches
    # before the first epoch count in it, late ones in the last.
    bounds = [-float('inf')] + starts[1:] + [float('inf')]
    epochs = []
    for e in range(args.epochs):
        parts = [r['epochs'][e] for r in ranks]
        end = max(p['end'] for p in parts)
        samples = sum(p['samples'] for p in parts)
        waits = [w for p in parts for w in p['waits']]
        # data objects and the packed formats' index.json
        got = [(path, size, start) for t, path, size, start in log
               if bounds[e] <= t < bounds[e + 1]
               and path.endswith(('.bin', '.tar', '.mds', '.json'))]
        again, again_bytes = rereads(got)
        epochs.append(
            dict(
                samples=samples,
                samples_per_s=samples / max(end - starts[e], 1e-9),
                p99_wait_ms=1e3 * float(np.percentile(waits, 99))
                if waits else 0.0,
                remote_mb=sum(size for _, size, _ in got) / 1e6,
                downloads=len(got),
                # every download is a miss of some reader
                hit_rate=None if name == 'local' else max(
                    0.0, 1 - len(got) / max(samples, 1)),
                duplicates=again,
                duplicate_mb=again_bytes / 1e6,
                wrong=sum(p['wrong'] for p in parts),
                cut=any(p['cut'] for p in parts),
                **(shuffle_quality([p['order'] for p in parts], args.samples,
                                   args.tar_shards) if args.shards else {})))
    return dict(name=name, epochs=epochs, peak_disk_mb=peak_disk / 1e6)


def rereads(got: list) -> tuple:
    """The GETs of an epoch that read bytes it had read already, and how
    many such bytes: a whole file downloaded twice, or a range of a shard
    overlapping one read before (a member GET twice, a coalesced span over
    a member read alone).

    Args:
        got (list): ``(path, bytes, start)`` of the epoch's GETs in the
            order they completed.
    """
    spans, count, total = {}, 0, 0
    for path, size, start in got:
        read = spans.setdefault(path, [])  # disjoint, sorted
        end = start + size
        overlap = sum(max(0, min(end, e) - max(start, s)) for s, e in read)
        count += overlap > 0
        total += overlap
        merged = []
        for s, e in sorted(read + [(start, end)]):
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        spans[path] = merged
    return count, total


def shuffle_quality(orders: list, samples: int, per_shard: int) -> dict:
    """How far the orders the ranks read are from uniform permutations.

    Args:
        orders (list): Per rank, its batches (lists of sample indices) in
            the order they came.
        samples (int): Samples in the data set.
        per_shard (int): Samples per shard: every format of the benchmark
            holds sample ``i`` in shard ``i // per_shard``.

    Returns:
        dict: ``spread``: the mean distance in the source of consecutive
        samples (within a rank) over ``(samples + 1) / 3``, its
        expectation in a uniform permutation (~1 uniform, ~0 in source
        order); ``batch_shard_share``: the mean share of a batch drawn
        from its most common shard (1 when every batch is one shard; a
        uniform permutation's is near ``1 / batch`` when shards are many).
    """
    gaps, shares = [], []
    for batches in orders:
        order = np.array([i for batch in batches for i in batch], np.int64)
        gaps.append(np.abs(np.diff(order)))
        shares += [
            np.bincount(np.asarray(batch) // per_shard).max() / len(batch)
            for batch in batches if batch
        ]
    gaps = np.concatenate(gaps) if gaps else np.zeros(0)
    return dict(
        spread=float(gaps.mean()) / ((samples + 1) / 3) if len(gaps) else
        float('nan'),
        batch_shard_share=float(np.mean(shares)) if shares else
        float('nan'))


def not_run_reason(name: str) -> str:
    """Why litdata/mosaic are not measured in a run."""
    if importlib.util.find_spec(IMPORT_NAMES[name]) is None:
        return (f'not installed ({PIP_NAMES[name]}: python tools/bootstrap.py'
                ' --extras bench installs it without its declared '
                'requirements, which would replace torch)')
    return ('reads its own packed format: --tar-shards N --tar-orders '
            f'...,{name}')


def main():
    args = parse_args()
    if args.rank_run:
        run_rank(args)
        return
    if args.planner_scale:
        report_planner_scale(args)
        return
    if args.planner_window:
        report_planner_window(args)
        return
    if args.books_window:
        report_books_window(args)
        return
    if args.download_cpu:
        report_download_cpu(args)
        return
    if args.download_rate:
        report_download_rate(args)
        return
    if args.tar_shards:
        report_tar_shards(args)
        return
    work_dir = args.work_dir
    data_dir, data_bytes = prepare_dataset(args)
    budgets = [float(b) for b in args.budgets.split(',') if b]
    args.budget_bytes = {
        f'ours@{b:g}%': int(data_bytes * b / 100)
        for b in budgets
    }
    default = [c for c in BASELINES + ('ours', )
               if not (args.quick and c == 'fsspec_simple')]
    wanted = (args.configs or ','.join(default)).split(',')
    configs = [c for c in BASELINES if c in wanted]
    if 'ours' in wanted:
        configs += list(args.budget_bytes)
    results, skipped = [], {}
    with bench_server(data_dir, args) as server:
        args.url = server.base_url
        for name in configs:
            if name in PIP_NAMES:
                skipped[name] = not_run_reason(name)
                continue
            if name == 'fsspec_simple' and not (
                    importlib.util.find_spec('fsspec')
                    and importlib.util.find_spec('aiohttp')):
                skipped[name] = ('not installed (fsspec and, for its HTTP '
                                 'filesystem, aiohttp)')
                continue
            if name.startswith('ours@') and not ours_available():
                skipped[name] = 'the node_cache backend is not in this build'
                continue
            print(f'running {name} ...', flush=True)
            results.append(run_config(name, args, server, work_dir))
    report(results, skipped, data_bytes, args)
    with open(osp.join(work_dir, 'results.json'), 'w') as f:
        json.dump(
            dict(
                results=results,
                skipped=skipped,
                data_bytes=data_bytes,
                settings={
                    k: v
                    for k, v in vars(args).items()
                    if k not in ('budget_bytes', 'sample_sizes')
                }),
            f,
            indent=1)


def bench_server(data_dir: str, args):
    """The loopback remote of the runs: ``--latency``, ``--bandwidth``,
    every download logged."""
    from mmdata_plugin.testing import LoopbackHTTPServer
    return LoopbackHTTPServer(
        data_dir,
        latency=args.latency,
        bandwidth=args.bandwidth * 1e6,
        log_downloads=True,
        max_lifetime=24 * 3600)


def prepare_dataset(args) -> tuple:
    """Write the data set (once per size) and a fresh index folder; its
    folder and bytes. Sets ``args.sample_sizes``."""
    work_dir = args.work_dir
    sample_bytes = int(args.sample_kb * 1000)
    data_dir = osp.join(work_dir, 'dataset')
    marker = osp.join(work_dir, 'dataset.json')
    spec = dict(samples=args.samples, sample_bytes=sample_bytes)
    if not osp.exists(marker) or json.load(open(marker)) != spec:
        shutil.rmtree(data_dir, ignore_errors=True)
        print(f'writing {args.samples} samples of ~{args.sample_kb:g} KB to '
              f'{data_dir} ...', flush=True)
        write_dataset(data_dir, args.samples, sample_bytes)
        with open(marker, 'w') as f:
            json.dump(spec, f)
    shutil.rmtree(osp.join(work_dir, 'index'), ignore_errors=True)
    data_bytes = directory_bytes(osp.join(data_dir, 'data'))
    with open(osp.join(data_dir, 'train.txt')) as f:
        args.sample_sizes = np.array([
            osp.getsize(osp.join(data_dir,
                                 line.split()[0])) for line in f
        ])
    return data_dir, data_bytes


# -------------------------------------------------------- tar shards
def pack_tar_shards(data_dir: str, per_shard: int) -> str:
    """Pack the data set into ``data_dir/tar`` (once per shard size);
    the shards' pattern for ``TarShardDataset``."""
    from mmdata_plugin.datasets.tar_shard_writer import pack_image_list
    out = osp.join(data_dir, 'tar')
    marker = osp.join(out, f'packed-{per_shard}')
    if not osp.exists(marker):
        shutil.rmtree(out, ignore_errors=True)
        pack_image_list(
            osp.join(data_dir, 'train.txt'), data_dir, out, 'train',
            per_shard)
        open(marker, 'w').close()
    count = sum(name.endswith('.tar') for name in os.listdir(out))
    return f'train-{{000000..{count - 1:06d}}}.tar'


def tar_dataset(args, root: str, pipeline=()):
    from mmdata_plugin.datasets import TarShardDataset
    return TarShardDataset(
        data_root=root,
        shards=args.shards,
        image_ext='bin',
        ann_ext='cls',
        index_dir=osp.join(args.work_dir, 'index'),
        index_progress=False,
        pipeline=list(pipeline))


# ------------------------------------- LitData and MosaicML Streaming
# Their own formats of the same samples, grouped as the tar shards are
# (sample i in shard i // per_shard), read as s3:// from the same loopback
# remote (boto3, the server as endpoint) at the same cache budget. Their
# imports stay in these functions: the tool runs without them.
def sample_files(data_dir: str) -> list:
    """The data set's files, in sample order (``train.txt``)."""
    with open(osp.join(data_dir, 'train.txt')) as f:
        return [osp.join(data_dir, line.split()[0]) for line in f]


def packed_sample(item: tuple) -> dict:
    """One sample as LitData's ``optimize`` stores it (a module function:
    its worker calls it by reference)."""
    index, path = item
    with open(path, 'rb') as f:
        return dict(index=index, data=f.read())


def pack_litdata(data_dir: str, per_shard: int) -> str:
    """The data set as LitData chunks of ``per_shard`` samples, once per
    shard size; their s3:// URL.

    ``optimize(chunk_size=per_shard)`` with one worker, so chunk ``k``
    holds samples ``k * per_shard`` on, as tar shard ``k`` does.
    """
    from litdata import optimize
    name = f'litdata-{per_shard}'
    out = osp.join(data_dir, S3_BUCKET, name)
    if not osp.exists(out + '.done'):
        shutil.rmtree(out, ignore_errors=True)
        optimize(
            fn=packed_sample,
            inputs=list(enumerate(sample_files(data_dir))),
            output_dir=out,
            chunk_size=per_shard,
            num_workers=1)
        open(out + '.done', 'w').close()
    return f's3://{S3_BUCKET}/{name}'


def import_mosaic() -> dict:
    """MosaicML Streaming's classes, from ``streaming.base`` alone.

    ``streaming/__init__.py`` imports Mosaic's model-zoo data sets
    (``streaming.vision``, ``.text``, ``.multimodal``: torchvision,
    transformers) and ``streaming/base/__init__.py`` its
    ``StreamingDataLoader`` (transformers); the bench extra installs
    neither (torchvision is built for one torch). So the two packages are
    entered as bare packages, their ``__init__`` not run, and the modules
    the benchmark uses are imported from them, unchanged.
    """
    import types
    for name in ('streaming', 'streaming.base'):
        if name not in sys.modules:
            spec = importlib.util.find_spec(name)
            package = types.ModuleType(name)
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__ = spec
            sys.modules[name] = package
    dataset = importlib.import_module('streaming.base.dataset')
    writer = importlib.import_module('streaming.base.format.mds.writer')
    util = importlib.import_module('streaming.base.util')
    return dict(StreamingDataset=dataset.StreamingDataset,
                MDSWriter=writer.MDSWriter, merge_index=util.merge_index)


def pack_mds(data_dir: str, per_shard: int) -> str:
    """The data set as Mosaic MDS shards of ``per_shard`` samples, once per
    shard size; their s3:// URL.

    ``MDSWriter`` cuts shards by bytes (``size_limit``), so each shard is
    written by a writer of its own into a folder of its own and Mosaic's
    ``merge_index`` joins their indexes (its way for parallel writers):
    shard ``k`` holds the samples of tar shard ``k``.
    """
    mosaic = import_mosaic()
    name = f'mds-{per_shard}'
    out = osp.join(data_dir, S3_BUCKET, name)
    if not osp.exists(out + '.done'):
        shutil.rmtree(out, ignore_errors=True)
        files = sample_files(data_dir)
        for first in range(0, len(files), per_shard):
            with mosaic['MDSWriter'](
                    out=osp.join(out, f'{first // per_shard:06d}'),
                    columns=dict(index='int', data='bytes'),
                    size_limit=(1 << 32) - 1) as writer:
                for index in range(first, min(first + per_shard,
                                              len(files))):
                    writer.write(packed_sample((index, files[index])))
        mosaic['merge_index'](out, keep_local=True)
        open(out + '.done', 'w').close()
    return f's3://{S3_BUCKET}/{name}'


def packed_item_check(batch: list) -> list:
    """The collate of the LitData and Mosaic runs: each sample's index and
    whether its bytes carry that index (as ``ReadSample`` checks)."""
    return [
        dict(index=int(item['index']),
             ok=bytes(item['data'][:HEADER_BYTES]) == int(
                 item['index']).to_bytes(HEADER_BYTES, 'little'))
        for item in batch
    ]


def litdata_loader(args):
    """LitData's loader as its docs set it up: ``StreamingDataset`` with
    ``shuffle=True`` (chunks in a seeded order per epoch, samples shuffled
    within a chunk) and ``max_cache_size`` = the budget, read through its
    ``StreamingDataLoader`` (which counts the epochs)."""
    import litdata
    dataset = litdata.StreamingDataset(
        args.root,
        cache_dir=osp.join(args.work_dir, 'cache'),
        shuffle=True,
        seed=0,
        max_cache_size=args.cache_limit,
        storage_options=dict(endpoint_url=os.environ['S3_ENDPOINT_URL']))
    return litdata.StreamingDataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=args.workers,
        collate_fn=packed_item_check)


def mosaic_loader(args):
    """Mosaic's ``StreamingDataset`` with ``shuffle=True`` (its default
    ``py1e`` shuffle) and ``cache_limit`` = the budget, in a plain
    ``DataLoader`` (its ``StreamingDataLoader`` only adds resumption);
    the S3 endpoint comes from ``S3_ENDPOINT_URL``."""
    from torch.utils.data import DataLoader
    dataset = import_mosaic()['StreamingDataset'](
        remote=args.root,
        local=osp.join(args.work_dir, 'cache'),
        shuffle=True,
        shuffle_seed=0,
        shuffle_block_size=mosaic_block_size(args.rank_run),
        cache_limit=args.cache_limit,
        batch_size=args.batch_size)
    # Mosaic 0.13 keeps the boto3 client that fetched the index in this
    # process; forked workers would share its keep-alive socket, and two
    # processes reading one socket interleave bodies (shards corrupted on
    # a plain-HTTP endpoint; TLS errors and retries on real S3). Dropped
    # here as Mosaic drops it before a retry, so each worker opens its own.
    for stream in dataset.streams:
        stream._downloader.clean_up()
    return DataLoader(
        dataset,
        batch_size=args.batch_size,
        num_workers=args.workers,
        persistent_workers=True,
        collate_fn=packed_item_check)


def mosaic_block_size(name: str) -> Optional[int]:
    """``N`` of a ``mosaic-bN@...`` run, None (Mosaic's default) for
    ``mosaic@...``."""
    order = name.split('@')[0]
    return int(order[len('mosaic-b'):]) if order.startswith('mosaic-b') \
        else None


def packed_loader(args):
    if args.rank_run.startswith('litdata'):
        return litdata_loader(args)
    return mosaic_loader(args)


def report_tar_shards(args) -> None:
    """Our node cache over tar shards, members one GET each against
    coalesced, in each order, and LitData and Mosaic over their formats
    of the same samples; each config once per repeat, in turn."""
    data_dir, data_bytes = prepare_dataset(args)
    args.shards = pack_tar_shards(data_dir, args.tar_shards)
    budgets = [float(b) for b in args.budgets.split(',') if b]
    suffixes = [{'off': '', 'on': COALESCED}[c]
                for c in args.tar_coalesce.split(',')]
    orders, skipped = [], {}
    for order in args.tar_orders.split(','):
        loader = order.split('-')[0]
        if loader in PACKED_LOADERS and \
                importlib.util.find_spec(IMPORT_NAMES[loader]) is None:
            skipped[order] = not_run_reason(loader)
        else:
            orders.append(order)
    names = [
        f'{order}@{budget:g}%{suffix}' for order in orders
        for budget in budgets
        for suffix in (suffixes if order in TAR_ORDERS else ('', ))
    ]
    args.budget_bytes = {
        name: int(data_bytes * float(name.split('@')[1].split('%')[0]) / 100)
        for name in names
    }
    packers = dict(litdata=pack_litdata, mosaic=pack_mds)
    args.packed_urls = {
        loader: packers[loader](data_dir, args.tar_shards)
        for loader in PACKED_LOADERS
        if any(order.startswith(loader) for order in orders)
    }
    runs = {name: [] for name in names}
    with bench_server(data_dir, args) as server:
        args.url = server.base_url
        # The index is built here, once (a GET per shard), not in a run.
        tar_dataset(args, args.url + 'tar/').full_init()
        for repeat in range(args.repeats):
            for name in names:
                print(f'running {name} ({repeat + 1}/{args.repeats}) ...',
                      flush=True)
                runs[name].append(
                    run_config(name, args, server, args.work_dir))
    report_tar(runs, data_bytes, args)
    for order, reason in skipped.items():
        print(f'{order:<26} {reason}')
    with open(osp.join(args.work_dir, 'results_tar.json'), 'w') as f:
        json.dump(dict(runs=runs, skipped=skipped, data_bytes=data_bytes),
                  f, indent=1)


def report_tar(runs: dict, data_bytes: int, args) -> None:
    shards = int(args.shards.split('..')[1].split('}')[0]) + 1
    # The figures of a uniform permutation read in batches, for scale.
    order = np.random.default_rng(0).permutation(args.samples).tolist()
    uniform = shuffle_quality([[
        order[i:i + args.batch_size]
        for i in range(0, args.samples, args.batch_size)
    ]], args.samples, args.tar_shards)
    print(f'\n{args.samples} samples, {data_bytes / 1e6:.0f} MB in {shards} '
          f'shards of {args.tar_shards} samples (tar; LitData chunks and MDS '
          f'shards of the same samples); remote: '
          f'{args.latency * 1e3:g} ms/request, {args.bandwidth:g} MB/s cap; '
          f'{args.ranks} ranks x {args.workers} workers, batch '
          f'{args.batch_size}; window = ShardWindowSampler('
          f'window_shards={args.window_shards}), global = RankShardedSampler;'
          f' coalesced: max_gap {args.coalesce_max_gap}, max_span '
          f'{args.coalesce_max_span}; litdata = LitData StreamingDataset('
          'shuffle=True), mosaic = Mosaic StreamingDataset(shuffle=True, '
          'py1e; -bN: shuffle_block_size=N); medians of '
          f'{args.repeats} runs. GETs and MB: what the server sent in the '
          'epoch; dup: GETs re-reading bytes read before in the epoch, and '
          'those MB; MB/opt: over Belady\'s bytes at the budget (ours); '
          'CPU s: the run\'s processes (start-up, both epochs) and the '
          'loopback server\'s threads, which share the same cores; '
          'spread: mean source distance of consecutive samples over a '
          'uniform permutation\'s; 1-shard: mean share of a batch from its '
          f'most common shard (a uniform permutation: spread '
          f'{uniform["spread"]:.2f}, 1-shard '
          f'{uniform["batch_shard_share"]:.2f}).')
    header = (f'{"config":<26}{"ep":>3}{"samples/s":>11}{"GETs":>7}'
              f'{"MB":>8}{"dup":>5}{"dup MB":>8}{"MB/opt":>7}'
              f'{"reserve MB":>11}{"disk/budget":>12}{"spread":>7}'
              f'{"1-shard":>8}{"wrong":>6}{"CPU s: run":>11}{"server":>7}')
    print(header)
    print('-' * len(header))
    for name, results in runs.items():
        budget = args.budget_bytes[name]
        cpu = (f"{np.median([r['client_cpu_s'] for r in results]):>11.1f}"
               f"{np.median([r['server_cpu_s'] for r in results]):>7.1f}")
        for e in range(args.epochs):
            epochs = [result['epochs'][e] for result in results]

            def median(key):
                return np.median([x[key] for x in epochs])

            over = '-'
            if 'offline' in results[0]:
                over = '%.2f' % np.median([
                    epoch['remote_mb'] /
                    max(r['offline']['belady_bypass'][e]['remote_mb'], 1e-9)
                    for epoch, r in zip(epochs, results)
                ])
            reserve = ('%.1f' % (np.median([r['reserve'] for r in results]) /
                                 1e6) if 'reserve' in results[0] else '-')
            disk = max(r['peak_disk_mb'] for r in results) * 1e6 / budget
            once = (f'{reserve:>11}{disk:>12.2f}' if e == 0 else f'{"":>23}')
            print(f'{name if e == 0 else "":<26}{e + 1:>3}'
                  f'{median("samples_per_s"):>11.0f}'
                  f'{median("downloads"):>7.0f}{median("remote_mb"):>8.1f}'
                  f'{median("duplicates"):>5.0f}{median("duplicate_mb"):>8.1f}'
                  f'{over:>7}{once}{median("spread"):>7.2f}'
                  f'{median("batch_shard_share"):>8.2f}'
                  f'{sum(x["wrong"] for x in epochs):>6}'
                  f'{cpu if e == 0 else ""}')


def report(results, skipped, data_bytes, args):
    data_mb = data_bytes / 1e6
    bound = args.ranks * args.workers / args.latency
    print(f'\n{args.samples} samples, {data_mb:.0f} MB; remote: '
          f'{args.latency * 1e3:g} ms/request, {args.bandwidth:g} MB/s '
          f'cap; {args.ranks} ranks x {args.workers} workers, batch '
          f'{args.batch_size}; an uncached reader is bound at ~{bound:.0f} '
          f'samples/s and reads the first "set" samples only (sized for '
          f'{args.time_box:g} s per epoch at that bound); "/set" = remote '
          f'bytes over the bytes of that set. * = epoch cut at '
          f'{3 * args.time_box:g} s.')
    local = next((r for r in results if r['name'] == 'local'), None)
    header = (f'{"config":<15}{"set":>6}{"ep":>3}{"samples/s":>11}'
              f'{"vs local":>9}{"bw use":>7}'
              f'{"p99 wait ms":>12}{"remote MB":>10}{"/set":>7}'
              f'{"hit %":>7}{"Belady":>7}{"LRU":>6}{"fixed":>6}'
              f'{"MB/opt":>7}{"dup dl":>7}{"disk/budget":>12}{"wrong":>6}')
    print(header)
    print('-' * len(header))
    for result in results:
        budget = args.budget_bytes.get(result['name'])
        disk = (f'{result["peak_disk_mb"] * 1e6 / budget:.2f}'
                if budget else f'{result["peak_disk_mb"]:.0f} MB'
                if result['peak_disk_mb'] else '-')
        set_mb = data_mb * result['subset'] / args.samples
        for e, epoch in enumerate(result['epochs']):
            ratio = '' if local is None else '%.2f' % (
                epoch['samples_per_s'] / local['epochs'][e]['samples_per_s'])
            hit = '-' if epoch['hit_rate'] is None else '%.1f' % (
                100 * epoch['hit_rate'])
            bw_use = (epoch['remote_mb'] * epoch['samples_per_s'] /
                      max(epoch['samples'] * args.bandwidth, 1e-9))
            first = e == 0
            offline = result.get('offline')
            if offline:
                policies = ''.join(
                    f'{100 * offline[p][e]["hit_rate"]:>{w}.1f}'
                    for p, w in (('belady_bypass', 7), ('lru', 6),
                                 ('fixed_set', 6)))
                optimum = offline['belady_bypass'][e]['remote_mb']
                over = f'{epoch["remote_mb"] / max(optimum, 1e-9):>7.2f}'
            else:
                policies, over = f'{"-":>7}{"-":>6}{"-":>6}', f'{"-":>7}'
            print(f'{result["name"] if first else "":<15}'
                  f'{result["subset"] if first else "":>6}{e + 1:>3}'
                  f'{epoch["samples_per_s"]:>10.0f}'
                  f'{"*" if epoch["cut"] else " "}{ratio:>9}{bw_use:>7.2f}'
                  f'{epoch["p99_wait_ms"]:>12.1f}{epoch["remote_mb"]:>10.1f}'
                  f'{epoch["remote_mb"] / set_mb:>7.2f}'
                  f'{hit:>7}{policies}{over}{epoch["duplicates"]:>7}'
                  f'{disk if e == 0 else "":>12}{epoch["wrong"]:>6}')
    for name, reason in skipped.items():
        print(f'{name:<15} {reason}')
    report_keep_capacity(results, args)


def report_keep_capacity(results, args):
    """Our hit rates next to the offline policies' at the capacity the
    plan keeps samples in (the budget less the prefetch reserve)."""
    ours = [r for r in results if 'keep_capacity' in r]
    if not ours:
        return
    print('\nAt the plan\'s capacity (budget - prefetch reserve, which holds '
          'the downloads in flight and read ahead), epoch by epoch:')
    for result in ours:
        budget = args.budget_bytes[result['name']]
        offline = result['offline_keep']
        rates = '; '.join(
            f'ep {e + 1}: hit {100 * epoch["hit_rate"]:.1f} / Belady '
            f'{100 * offline["belady_bypass"][e]["hit_rate"]:.1f} / fixed '
            f'{100 * offline["fixed_set"][e]["hit_rate"]:.1f}'
            for e, epoch in enumerate(result['epochs']))
        print(f'{result["name"]:<15} reserve '
              f'{result["reserve"] / 1e6:.1f} MB '
              f'({100 * result["reserve"] / budget:.1f}% of the budget), '
              f'capacity {result["keep_capacity"] / 1e6:.1f} MB: {rates}')


# ------------------------------------------------- planner at scale


def _scale_stream(samples: int, nodes: int, seed: int):
    """Node 0's stream of a RankShardedSampler over ``samples * nodes``
    samples read by ``nodes`` nodes of one rank each (the real sampler,
    its Feistel order and its inverse)."""
    from unittest import mock

    from mmdata_plugin.datasets import RankShardedSampler
    from mmdata_plugin.sample_order import NodeStream, RankShardedOrder
    with mock.patch(
            'mmdata_plugin.datasets.rank_sharded_sampler.get_dist_info',
            return_value=(0, nodes)):
        sampler = RankShardedSampler(range(samples * nodes), seed=seed)
    return NodeStream(RankShardedOrder(sampler), nodes, 0, 1)


def _planned_hits(stream, capacity: int, stop: int, horizon: int,
                  inverse: bool) -> tuple:
    """``(hits from epoch 2 on, seconds, block bytes)`` of the planner,
    with the order's inverse or without it (look-ahead and BEYOND)."""
    from unittest import mock

    from mmdata_plugin.remote_cache.stream_planner import StreamPlanner
    places = stream.order.places if inverse else (lambda cycle, ids: None)
    with mock.patch.object(stream.order, 'places', places):
        planner = StreamPlanner(stream, capacity, lambda sample: 1,
                                stop=stop, horizon=horizon)
        start = time.perf_counter()
        hits = sum(decision.hit for decision in iter(planner.decide, None)
                   if decision.tick >= stream.epoch_ticks)
        seconds = time.perf_counter() - start
    return hits, seconds, planner._ids.nbytes + planner._next.nbytes


def planner_scale(samples: int, horizon: int, nodes: int = 1,
                  epochs: int = 3, share: float = 0.25,
                  seed: int = 0) -> dict:
    """The planner alone, tick by tick, on node 0 of ``nodes`` reading
    ``samples`` equal samples per epoch, with a cache of ``share`` of the
    samples it reads: hit rate from epoch 2 on with the sampler's inverse
    and without it (look-ahead of ``horizon`` ticks, BEYOND), against
    Belady offline (on the whole trace while it fits in memory here; for
    one node, keeping the first ``share`` of the next epoch is optimal:
    ``share``)."""
    from mmdata_plugin.remote_cache.cache_simulator import simulate_segments
    stream = _scale_stream(samples, nodes, seed)
    stop = epochs * stream.epoch_ticks
    reads = (epochs - 1) * stream.epoch_ticks
    if stop <= _OFFLINE_TICKS:
        trace = stream.ids(0, stop)
        capacity = int(share * len(np.unique(trace)))
        belady = simulate_segments(trace, 1, capacity,
                                   [0, stream.epoch_ticks, stop])
        belady = belady['belady_bypass'][1].hits / reads
        del trace
    elif nodes == 1:
        capacity, belady = int(share * samples), share
    else:
        raise ValueError(f'no Belady figure for {nodes} nodes past '
                         f'{_OFFLINE_TICKS} ticks')
    exact, seconds, block = _planned_hits(stream, capacity, stop, horizon,
                                          True)
    row = dict(samples=samples, nodes=nodes, horizon=horizon,
               hit_rate=exact / reads, belady=belady,
               of_belady=exact / reads / belady, block_bytes=block,
               ticks_per_s=stop / seconds, beyond=None)
    if stop <= _OFFLINE_TICKS:
        row['beyond'] = _planned_hits(stream, capacity, stop, horizon,
                                      False)[0] / reads
    return row


def _reads_at(stream, ticks: np.ndarray) -> np.ndarray:
    """Sample ids the node reads at ``ticks`` (any, in any order)."""
    epochs, within = np.divmod(ticks, stream.epoch_ticks)
    ids = np.empty_like(ticks)
    for epoch in np.unique(epochs).tolist():
        at = epochs == epoch
        ids[at] = stream.order.ids(epoch, stream.positions(within[at]))
    return ids


def _wrong_next_uses(stream, ticks, ids, found) -> int:
    """Next uses that are not the node's next read, checked forwards: the
    node reads the sample at the tick found, and in each epoch between,
    the one position that reads it (an epoch is a bijection; no padding
    here) is another node's. For :func:`_scale_stream`'s streams (a pass
    per epoch, one rank per node)."""
    wrong = found <= ticks
    wrong[~wrong] = _reads_at(stream, found[~wrong]) != ids[~wrong]
    epoch, last = ticks // stream.epoch_ticks, found // stream.epoch_ticks
    between = epoch + 1
    while True:
        unsettled = ~wrong & (between < last)
        if not unsettled.any():
            return int(wrong.sum())
        for cycle in np.unique(between[unsettled]).tolist():
            at = unsettled & (between == cycle)
            position = stream.order.places(cycle, ids[at]).first
            node = position % stream.world_size == stream.first_rank
            read = stream.order.ids(cycle, position) == ids[at]
            wrong[at] = node | ~read
        between += 1


def next_use_window(samples: int, nodes: int = 1, ticks: int = 1_000_000,
                    offsets=(0.0, 1 / 3, 2 / 3), block: int = 1 << 16,
                    seed: int = 0) -> dict:
    """Exact next uses of ``ticks`` ticks of epoch 2 (split between
    ``offsets`` of the epoch), block by block as the planner asks them:
    each checked forwards (:func:`_wrong_next_uses`), timed, and the peak
    of Python and numpy allocations while asking (tracemalloc)."""
    import tracemalloc
    stream = _scale_stream(samples, nodes, seed)
    epoch = stream.epoch_ticks
    share = min(ticks // len(offsets), epoch)
    wrong = done = 0
    seconds = peak = 0.0
    for offset in offsets:
        first = epoch + int(offset * epoch)
        for start in range(first, first + share, block):
            stop = min(start + block, first + share)
            span = np.arange(start, stop)
            ids = stream.ids(start, stop)
            tracemalloc.start()
            began = time.perf_counter()
            found = stream.next_reads(span, ids, 1 << 62, 1 << 8)
            seconds += time.perf_counter() - began
            peak = max(peak, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            wrong += _wrong_next_uses(stream, span, ids, found)
            done += len(span)
    return dict(samples=samples, nodes=nodes, ticks=done, wrong=wrong,
                ticks_per_s=done / seconds, peak_bytes=peak)


#: Ticks up to which Belady is computed offline on the whole trace.
_OFFLINE_TICKS = 4_000_000


def report_planner_scale(args) -> None:
    print('Tick by tick (hits from epoch 2 of 3):')
    print('| samples per node | nodes | hit % exact next uses | hit % '
          f'look-ahead {args.planner_horizon} + BEYOND | Belady % | exact '
          '/ Belady | block MB | ticks/s |')
    print('|---|---|---|---|---|---|---|---|')
    sizes = [int(float(text)) for text in args.planner_scale.split(',')]
    nodes = [int(text) for text in args.planner_nodes.split(',')]
    for samples in sizes:
        for count in nodes:
            if 3 * samples > args.planner_ticks or (
                    count > 1 and 3 * samples > _OFFLINE_TICKS):
                continue
            row = planner_scale(samples, args.planner_horizon, count)
            beyond = ('-' if row['beyond'] is None else
                      f"{100 * row['beyond']:.2f}")
            print(f"| {samples:.0e} | {count} | "
                  f"{100 * row['hit_rate']:.2f} | {beyond} | "
                  f"{100 * row['belady']:.2f} | {row['of_belady']:.3f} | "
                  f"{row['block_bytes'] / 1e6:.2f} | "
                  f"{row['ticks_per_s']:.0f} |", flush=True)
    print('\nNext uses from the inverse, 1e6 ticks of epoch 2 at offsets '
          '0, 1/3, 2/3 of it:')
    print('| samples per node | nodes | ticks checked | wrong | ticks/s | '
          'peak MB (tracemalloc) |')
    print('|---|---|---|---|---|---|')
    for samples in sizes:
        for count in nodes:
            row = next_use_window(samples, count)
            print(f"| {samples:.0e} | {count} | {row['ticks']} | "
                  f"{row['wrong']} | {row['ticks_per_s']:.0f} | "
                  f"{row['peak_bytes'] / 1e6:.1f} |", flush=True)


#: Samples whose next reads are asked at once when a kept set is built.
_STATE_SLICE = 1 << 22


def one_node_belady_state(stream, capacity: int, tick: int) -> tuple:
    """``(samples, next uses)`` that Belady-with-bypass keeps before
    ``tick`` (from epoch 1 on) on a node of one rank reading equal samples
    (:func:`_scale_stream` with one node), ``capacity`` of them.

    At an epoch's start it keeps the ``capacity`` samples read first in
    the epoch: the epoch before read every sample, each kept in room or
    in place of one needed later, so the soonest needed stayed. Each read
    of those is a hit that frees its place for the sample read, so ``d``
    ticks into the epoch the ones not read yet are kept, and of the ``d``
    samples read, the ``min(d, capacity)`` read soonest in the next epoch.
    """
    epoch_ticks = stream.epoch_ticks
    epoch, done = divmod(tick, epoch_ticks)
    start = epoch * epoch_ticks
    samples = [stream.ids(tick, start + max(done, capacity))]
    untils = [np.arange(tick, start + max(done, capacity))]
    room = min(done, capacity)
    soonest = np.empty(0, np.int64)
    soonest_ids = np.empty(0, np.int64)
    for first in range(start, tick, _STATE_SLICE):
        ids = stream.ids(first, min(first + _STATE_SLICE, tick))
        following = (start + epoch_ticks +
                     stream.order.places(epoch + 1, ids).first)
        soonest = np.concatenate([soonest, following])
        soonest_ids = np.concatenate([soonest_ids, ids])
        if len(soonest) > room:
            chosen = np.argpartition(soonest, room - 1)[:room]
            soonest, soonest_ids = soonest[chosen], soonest_ids[chosen]
    return (np.concatenate(samples + [soonest_ids]),
            np.concatenate(untils + [soonest]))


def planner_window(samples: int, ticks: int,
                   centres: Sequence[float] = (1 / 8, 1 / 4, 3 / 8),
                   share: float = 0.25, seed: int = 0) -> dict:
    """The planner (exact next uses) tick by tick in windows of epoch 2
    (centred on ``centres`` of it, ``ticks`` in all) on a node of one
    rank reading ``samples`` equal samples an epoch, each window started
    from Belady's kept set (:func:`one_node_belady_state`), with a
    capacity of ``share`` of the samples. Belady hits a read there exactly
    when the epoch reads it among its first ``share``."""
    import resource

    from mmdata_plugin.remote_cache.stream_planner import StreamPlanner
    stream = _scale_stream(samples, 1, seed)
    epoch_ticks = stream.epoch_ticks
    capacity = int(share * samples)
    width = min(ticks // len(centres), epoch_ticks // 4)
    hits = belady = done = 0
    seconds = build = 0.0
    kept_bytes = 0
    for centre in centres:
        first = 2 * epoch_ticks + int(centre * epoch_ticks) - width // 2
        began = time.perf_counter()
        planner = StreamPlanner(stream, capacity, lambda sample: 1,
                                start=first)
        kept, untils = one_node_belady_state(stream, capacity, first)
        planner.cache.keep_all(kept, untils, np.ones(len(kept), np.int64))
        build += time.perf_counter() - began
        began = time.perf_counter()
        hits += int(planner.hits(first + width).sum())
        seconds += time.perf_counter() - began
        kept_bytes = max(kept_bytes, planner.cache.nbytes)
        within = first - 2 * epoch_ticks
        belady += int(np.clip(capacity - within, 0, width))
        done += width
        del planner
    return dict(samples=samples, ticks=done, hit_rate=hits / done,
                belady=belady / done, decisions_per_s=done / seconds,
                build_s=build, kept_bytes=kept_bytes,
                peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                * 1024)


def report_planner_window(args) -> None:
    centres = [float(text) for text in args.planner_window_centres.split(',')]
    print('Windows of epoch 2 centred at ' +
          ', '.join(f'{centre:.3f}' for centre in centres) +
          ' of it, one node of one rank, capacity 25% of the samples, '
          "each window started from Belady's kept set:")
    print('| samples per node | ticks simulated | hit % exact next uses | '
          'Belady % | exact / Belady | decisions/s | kept set bytes / '
          'sample | state built s | peak RSS MB |')
    print('|---|---|---|---|---|---|---|---|---|')
    for text in args.planner_window.split(','):
        row = planner_window(int(float(text)),
                             int(args.planner_window_ticks), centres)
        print(f"| {row['samples']:.0e} | {row['ticks']} | "
              f"{100 * row['hit_rate']:.2f} | {100 * row['belady']:.2f} | "
              f"{row['hit_rate'] / row['belady']:.3f} | "
              f"{row['decisions_per_s']:.0f} | "
              f"{row['kept_bytes'] / row['samples']:.1f} | "
              f"{row['build_s']:.0f} | {row['peak_rss'] / 1e6:.0f} |",
              flush=True)


def _bench_url(sample: int) -> str:
    return f'http://bench/train/{sample % 1000:04d}/{sample}.jpg'


def _instant_prefetcher(stream, cache_dir: str, kept: int, sample_bytes: int,
                        first: int):
    """A NodePrefetcher planning from tick ``first`` whose plan keeps
    ``kept`` samples of ``sample_bytes``, with Belady's kept set there
    (:func:`one_node_belady_state`) kept and booked, sizes learned."""
    from mmdata_plugin.cache.node_store import NodeStore
    from mmdata_plugin.remote_cache.consumption_cursors import CursorReader
    from mmdata_plugin.remote_cache.node_cache_backend import RemoteReader
    from mmdata_plugin.remote_cache.prefetcher import NodePrefetcher
    from mmdata_plugin.remote_cache.stream_planner import StreamPlanner
    capacity = kept * sample_bytes
    reserve = 1024 * sample_bytes
    prefetcher = NodePrefetcher(
        RemoteReader(NodeStore(cache_dir, capacity + reserve), None,
                     sample_bytes), stream, lambda sample: [_bench_url(sample)],
        CursorReader(cache_dir, [0], 1), reserve=reserve, readahead=256,
        max_inflight=1)
    prefetcher.marks.reset()
    prefetcher.planner = StreamPlanner(stream, capacity, prefetcher.size_of,
                                       start=first)
    samples, untils = one_node_belady_state(stream, kept, first)
    prefetcher.planner.cache.keep_all(
        samples, untils, np.full(len(samples), sample_bytes))
    # In slices: the URLs of 1e7 samples at once would take gigabytes.
    for start in range(0, len(samples), 1 << 20):
        part = samples[start:start + (1 << 20)].tolist()
        prefetcher._book_many(part, [[_bench_url(sample)] for sample in part])
        prefetcher._learn_sizes(part, [sample_bytes] * len(part))
    return prefetcher


def _run_instantly(prefetcher, stop: int, sample_bytes: int) -> None:
    """Drive ``prefetcher`` to tick ``stop`` as its poll does (loops at
    the planner's tick less the read-ahead, window decided, reads passed
    settled), each download done at once without a file."""
    from mmdata_plugin.remote_cache.download_processes import DownloadResult
    planner = prefetcher.planner
    while planner.tick < stop:
        prefetcher.position = max(prefetcher.position,
                                  planner.tick - prefetcher.readahead)
        prefetcher._release_consumed()
        for _ in range(min(prefetcher.window(), stop - planner.tick)):
            download = prefetcher._apply(planner.decide())
            if download is not None:
                sample, urls, _, _ = download
                prefetcher._finished(
                    DownloadResult(sample, urls, len(urls), sample_bytes,
                                   True, 0.0, None, False))
        # (nothing on disk to evict)
        prefetcher._leaving.clear()


def books_window(samples: int, kept: int, ticks: int,
                 centres: Sequence[float] = (0.5, 1.5),
                 sample_bytes: int = 1 << 16, seed: int = 0) -> dict:
    """The node prefetcher (plan and books, downloads instant) tick by
    tick in windows of epoch 2 centred ``centres`` x ``kept`` ticks into
    it, ``ticks`` in all, on a node of one rank reading ``samples`` equal
    samples an epoch, the plan keeping ``kept`` of them, each window
    started from Belady's kept set, booked. Belady hits a read there
    exactly when the epoch reads it among its first ``kept``."""
    import resource

    from mmdata_plugin.testing import process_memory
    stream = _scale_stream(samples, 1, seed)
    epoch_ticks = stream.epoch_ticks
    width = min(ticks // len(centres), kept // 2)
    hits = belady = done = 0
    seconds = build = 0.0
    held = resident = 0
    by_window = []
    baseline = process_memory()['rss']
    for centre in centres:
        first = 2 * epoch_ticks + int(centre * kept) - width // 2
        with tempfile.TemporaryDirectory() as cache_dir:
            began = time.perf_counter()
            prefetcher = _instant_prefetcher(stream, cache_dir, kept,
                                             sample_bytes, first)
            build += time.perf_counter() - began
            began = time.perf_counter()
            _run_instantly(prefetcher, first + width, sample_bytes)
            seconds += time.perf_counter() - began
            hits += prefetcher.stats['planned_hits']
            decided = prefetcher.stats['planned']
            by_window.append(prefetcher.stats['planned_hits'] / decided)
            done += decided
            within = first - 2 * epoch_ticks
            belady += int(np.clip(kept - within, 0, decided))
            held = max(held, prefetcher.planner.cache.nbytes +
                       prefetcher._books.nbytes + prefetcher._booked.nbytes)
            resident = max(resident, process_memory()['rss'] - baseline)
            prefetcher.close()
            del prefetcher
    return dict(samples=samples, kept=kept, ticks=done, hit_rate=hits / done,
                by_window=by_window, belady=belady / done,
                decisions_per_s=done / seconds,
                build_s=build, held=held, resident=resident,
                peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                * 1024)


def report_books_window(args) -> None:
    centres = [float(text) for text in args.books_window_centres.split(',')]
    kept = int(args.books_window_kept)
    print('Node prefetcher, downloads instant: windows of epoch 2 centred '
          + ', '.join(f'{centre:g}' for centre in centres) +
          f' x {kept:.0e} ticks into it, one node of one rank, {kept:.0e} '
          "samples kept, each window started from Belady's kept set:")
    print('| samples per node | kept | ticks simulated | hit % | hit % by '
          'window | Belady % | decisions/s | plan + books bytes / kept '
          'sample | resident MB (plan + books) | state built s | peak RSS '
          'MB |')
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    for text in args.books_window.split(','):
        row = books_window(int(float(text)), kept,
                           int(args.books_window_ticks), centres)
        print(f"| {row['samples']:.0e} | {row['kept']:.0e} | {row['ticks']} "
              f"| {100 * row['hit_rate']:.2f} | "
              + ' / '.join(f'{100 * rate:.2f}' for rate in row['by_window'])
              + f" | {100 * row['belady']:.2f} | "
              f"{row['decisions_per_s']:.0f} | "
              f"{row['held'] / row['kept']:.1f} | "
              f"{row['resident'] / 1e6:.0f} | {row['build_s']:.0f} | "
              f"{row['peak_rss'] / 1e6:.0f} |",
              flush=True)
    with open('/proc/loadavg') as loadavg:
        print(f'load average: {loadavg.read().strip()}')


# ------------------------------------------------- CPU per download


def _serve_objects(objects: dict, corrupt_rate: float, pipe) -> None:
    """A loopback server of ``objects`` in this (child) process: sends its
    URL, and its GET count when told to stop."""
    from mmdata_plugin.testing import LoopbackHTTPServer
    with LoopbackHTTPServer(objects, fault_rate=corrupt_rate,
                            fault_kinds=('corrupt', )) as server:
        pipe.send(server.base_url)
        pipe.recv()
        pipe.send(server.stats().get_requests)


def download_cpu(files: int, sample_bytes: int, corrupt_rate: float,
                 work_dir: str, threads: int = 8) -> dict:
    """Downloads through ``RemoteReader.fetch`` (what the prefetcher and
    the readers run per file) on ``threads`` threads from a loopback
    server in another process: the thread CPU time of each (HTTP client,
    checks, store ledger and files), the whole process's CPU time over the
    downloads (every thread, timers included), and whether the stored
    bytes are the served ones (read back once all are in)."""
    import multiprocessing
    from concurrent.futures import ThreadPoolExecutor

    import mmdata_plugin  # noqa: F401  (registers the remote backends)
    from mmdata_plugin.cache.node_store import NodeStore
    from mmdata_plugin.remote import RemoteCorruptError
    from mmdata_plugin.remote_cache.node_cache_backend import (NAMESPACE,
                                                               RemoteReader)
    rng = np.random.default_rng(0)
    objects = {f'{i}.bin': rng.bytes(sample_bytes) for i in range(files)}
    cache_dir = osp.join(work_dir, f'cpu_cache_{corrupt_rate:g}')
    shutil.rmtree(cache_dir, ignore_errors=True)
    store = NodeStore(cache_dir, 2 * files * sample_bytes)
    pipe, child_pipe = multiprocessing.Pipe()
    server = multiprocessing.get_context('fork').Process(
        target=_serve_objects, args=(objects, corrupt_rate, child_pipe),
        daemon=True)
    server.start()
    try:
        base_url = pipe.recv()
        reader = RemoteReader(store, dict(backend='remote_http'),
                              sample_bytes)

        def fetch(name):
            start = time.thread_time()
            try:
                path = reader.fetch(base_url + name).path
            except RemoteCorruptError:
                path = None  # damaged on every one of its downloads
            return time.thread_time() - start, path

        process_start = time.process_time()
        with ThreadPoolExecutor(threads) as pool:
            runs = list(pool.map(fetch, objects))
        process_ms = (time.process_time() - process_start) * 1e3 / files
        pipe.send('stop')
        requests = pipe.recv()
    finally:
        server.join(timeout=30)
        if server.is_alive():
            server.kill()
    same = []
    for name, (_, path) in zip(objects, runs):
        if path is not None:
            with open(path, 'rb') as file:
                same.append(file.read() == objects[name])
    cpu = np.array([seconds for seconds, _ in runs]) * 1e3
    return dict(files=files, cpu_ms_median=float(np.median(cpu)),
                cpu_ms_mean=float(cpu.mean()), process_ms=process_ms,
                wrong=same.count(False),
                raised=sum(path is None for _, path in runs),
                corrupt=store.counters(NAMESPACE)['corrupt'],
                requests=requests)


def _median_cpu_ms(step, items) -> float:
    """Median thread CPU ms of ``step(item)`` over ``items``."""
    spent = []
    for item in items:
        start = time.thread_time()
        step(item)
        spent.append(time.thread_time() - start)
    return float(np.median(spent)) * 1e3


class _Discard:
    """A sink that drops what it is given."""

    def write(self, data):
        return len(data)


def download_cpu_parts(files: int, sample_bytes: int,
                       work_dir: str) -> dict:
    """Where the CPU of a download goes, on one thread (thread CPU ms per
    file, median of each part measured alone): the HTTP transport (request
    out, status and headers in, body read into the connection's buffer),
    the MD5, the backend's whole GET with its length and MD5 checks, the
    store's whole part (single flight, reserve, temp file, rename, ledger)
    for a body already in hand, and in it the key's lock and the temp
    file's create, write and rename; an S3 GET from moto when moto is
    installed."""
    import hashlib
    import uuid

    import mmdata_plugin  # noqa: F401  (registers the remote backends)
    from mmengine.fileio import get_file_backend

    from mmdata_plugin.cache.node_store import NodeStore
    from mmdata_plugin.remote.http_backend import request_head
    from mmdata_plugin.remote.http_connections import HostConnections
    from mmdata_plugin.testing import LoopbackHTTPServer
    rng = np.random.default_rng(1)
    objects = {f'{i}.bin': rng.bytes(sample_bytes) for i in range(files)}
    cache_dir = osp.join(work_dir, 'cpu_parts_cache')
    shutil.rmtree(cache_dir, ignore_errors=True)
    store = NodeStore(cache_dir, 2 * files * sample_bytes)
    parts = {}
    with LoopbackHTTPServer(objects) as server:
        urls = [server.url(name) for name in objects]
        connections = HostConnections(10, 30, 1)

        def transport(url):
            scheme, host, port, head = request_head(url, 'GET', url, {})
            connection = connections.take(scheme, host, port)
            response = connection.request('GET', head)
            while response.readinto(connection.buffer):
                pass
            connections.give_back(connection)

        parts['transport'] = _median_cpu_ms(transport, urls)
        backend = get_file_backend(
            urls[0], backend_args=dict(backend='remote_http'))
        parts['http'] = _median_cpu_ms(
            lambda url: backend.download(url, _Discard()), urls)
    parts['md5'] = _median_cpu_ms(lambda body: hashlib.md5(body).hexdigest(),
                                  objects.values())
    parts['store'] = _median_cpu_ms(
        lambda name: store.get_or_produce(
            'remote', name, lambda file: file.write(objects[name]),
            sample_bytes), objects)

    def lock(name):
        with store._key_lock(uuid.uuid4().hex):
            pass

    parts['lock'] = _median_cpu_ms(lock, objects)
    temp_dir = osp.join(cache_dir, 'tmp')

    def create_write_rename(name):
        temp = osp.join(temp_dir, name + '.tmp')
        with open(temp, 'wb') as file:
            file.write(objects[name])
        os.rename(temp, osp.join(temp_dir, name))

    parts['files'] = _median_cpu_ms(create_write_rename, objects)
    parts['s3'] = s3_get_cpu(objects)
    return parts


def s3_get_cpu(objects: dict) -> Optional[float]:
    """Median thread CPU ms of the S3 backend's GET (with its length and
    MD5 checks) of each object from a moto server; None without moto."""
    if importlib.util.find_spec('moto') is None:
        return None
    from mmengine.fileio import get_file_backend

    from mmdata_plugin.testing import MotoS3Server
    with MotoS3Server() as server:
        server.put_objects('bucket', objects)
        backend = get_file_backend(
            's3://bucket', backend_args=server.backend_args())
        return _median_cpu_ms(
            lambda name: backend.download(f's3://bucket/{name}', _Discard()),
            objects)


def report_download_cpu(args) -> None:
    sample_bytes = int(args.sample_kb * 1000)
    os.makedirs(args.work_dir, exist_ok=True)
    parts = download_cpu_parts(args.download_cpu, sample_bytes,
                               args.work_dir)
    s3 = 'moto not installed' if parts['s3'] is None else \
        f"{parts['s3']:.3f}"
    print('| one thread, CPU ms per file (median) | HTTP transport | MD5 '
          '| GET + length + MD5 checks | store (lock, reserve, temp, '
          'rename, ledger) | of it: key lock | of it: temp file create, '
          'write, rename | S3 GET + checks (moto) |')
    print('|---|---|---|---|---|---|---|---|')
    print(f"| {args.download_cpu} files of {args.sample_kb:g} KB | "
          f"{parts['transport']:.3f} | {parts['md5']:.3f} | "
          f"{parts['http']:.3f} | {parts['store']:.3f} | "
          f"{parts['lock']:.3f} | {parts['files']:.3f} | {s3} |\n",
          flush=True)
    print(f'| bodies corrupted | files of {args.sample_kb:g} KB | '
          'thread CPU ms per download (median / mean) | process CPU ms per '
          'download | wrong | corrupt rejected | raised after 3 | requests |')
    print('|---|---|---|---|---|---|---|---|')
    for rate in (0.0, 0.05):
        row = download_cpu(args.download_cpu, sample_bytes, rate,
                           args.work_dir)
        print(f"| {100 * rate:g}% | {row['files']} | "
              f"{row['cpu_ms_median']:.2f} / {row['cpu_ms_mean']:.2f} | "
              f"{row['process_ms']:.2f} | {row['wrong']} | {row['corrupt']} | {row['raised']} | "
              f"{row['requests']} |",
              flush=True)


# ---------------------------- downloads/s against download processes


def download_rate(processes: int, files: int, base_url: str,
                  work_dir: str, max_inflight: int = 64) -> dict:
    """The node prefetcher downloading ``files`` samples (one epoch read
    from position 0, a budget that keeps them all, the whole epoch read
    ahead) with ``processes`` download processes: downloads/s from the
    first decision to the last answer, and CPU ms per download of this
    process (the prefetch process: planning, booking, IPC, and the
    downloads themselves with one process) and of the download processes
    (reaped, so counted in this process's children times)."""
    from multiprocessing.connection import wait
    from unittest import mock

    from torch.utils.data import BatchSampler

    import mmdata_plugin  # noqa: F401  (registers the remote backends)
    from mmdata_plugin.cache.node_store import NodeStore
    from mmdata_plugin.datasets import RankShardedSampler
    from mmdata_plugin.remote_cache.consumption_cursors import (
        CursorReader, CursorWriter)
    from mmdata_plugin.remote_cache.node_cache_backend import (NAMESPACE,
                                                               RemoteReader)
    from mmdata_plugin.remote_cache.prefetcher import NodePrefetcher
    from mmdata_plugin.sample_order import NodeStream, sample_order_of
    cache_dir = osp.join(work_dir, f'rate_cache_{processes}')
    shutil.rmtree(cache_dir, ignore_errors=True)
    with mock.patch(
            'mmdata_plugin.datasets.rank_sharded_sampler.get_dist_info',
            return_value=(0, 1)):
        sampler = RankShardedSampler(list(range(files)), seed=0)
    stream = NodeStream(sample_order_of(BatchSampler(sampler, 32, False), 1),
                        1, 0, 1)
    limit = 1 << 40
    store = NodeStore(cache_dir, limit)
    writer = CursorWriter(cache_dir, 0, 1)
    prefetcher = NodePrefetcher(
        RemoteReader(store, dict(backend='remote_http')), stream,
        lambda sample: [f'{base_url}{sample}.bin'],
        CursorReader(cache_dir, [0], 1), reserve=limit // 2,
        readahead=files, max_inflight=max_inflight,
        stop=stream.epoch_start(1), horizon=files,
        download_processes=processes)
    store.eviction_policy = prefetcher.victims
    writer.publish(0, 0)
    prefetcher.start(0)  # its size probes are not timed
    expected = files - store.usage().entries
    children = os.times()
    cpu, start = time.process_time(), time.perf_counter()
    while prefetcher.stats['downloads'] < expected:
        prefetcher.poll()
        connections = prefetcher.connections()
        if connections:
            wait(connections, 0.005)
        else:
            time.sleep(0.005)
    seconds = time.perf_counter() - start
    planner_cpu = time.process_time() - cpu
    prefetcher.close()  # reaps the download processes
    after = os.times()
    children_cpu = (after.children_user + after.children_system -
                    children.children_user - children.children_system)
    produced = store.counters(NAMESPACE)['produced']
    writer.close()
    return dict(processes=processes, downloads=expected,
                per_s=expected / seconds,
                planner_ms=planner_cpu * 1e3 / expected,
                downloaders_ms=children_cpu * 1e3 / expected,
                failed=prefetcher.stats['failed'], produced=produced)


def report_download_rate(args) -> None:
    import multiprocessing
    sample_bytes = int(args.sample_kb * 1000)
    os.makedirs(args.work_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    objects = {f'{i}.bin': rng.bytes(sample_bytes)
               for i in range(args.download_rate)}
    pipe, child_pipe = multiprocessing.Pipe()
    server = multiprocessing.get_context('fork').Process(
        target=_serve_objects, args=(objects, 0.0, child_pipe), daemon=True)
    server.start()
    rows = {}
    try:
        base_url = pipe.recv()
        for _ in range(args.repeats):
            for processes in (int(n) for n in
                              args.download_processes.split(',')):
                rows.setdefault(processes, []).append(
                    download_rate(processes, args.download_rate, base_url,
                                  args.work_dir))
        pipe.send('stop')
        pipe.recv()
    finally:
        server.join(timeout=30)
        if server.is_alive():
            server.kill()
    print(f'| download processes | downloads/s | CPU ms per '
          f'{args.sample_kb:g} KB download: prefetch process | download '
          'processes | failed |')
    print('|---|---|---|---|---|')
    for processes, runs in rows.items():

        def median(key):
            return float(np.median([run[key] for run in runs]))

        print(f"| {processes} | {median('per_s'):.0f} | "
              f"{median('planner_ms'):.3f} | "
              f"{median('downloaders_ms'):.3f} | "
              f"{sum(run['failed'] for run in runs)} |",
              flush=True)
    print(f'({args.download_rate} downloads per run, medians of '
          f'{args.repeats} runs; load average {os.getloadavg()[0]:.1f})')


if __name__ == '__main__':
    main()
