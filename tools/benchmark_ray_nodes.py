# Data nodes through Ray: what a batch costs on its way to the trainer, and
# how production scales with the number of data actors.
import argparse
import os
import statistics
import time

# Every node of the benchmark's cluster names itself 127.0.0.1 (read when
# Ray is imported): all traffic stays on loopback.
os.environ.setdefault('RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER', '0')

import torch  # noqa: E402
from mmengine.structures import BaseDataElement  # noqa: E402
from torch.utils.data import (BatchSampler, DataLoader,  # noqa: E402
                              Dataset, SequentialSampler)

import mmdata_plugin  # noqa: F401,E402  (registers block_collate)
from mmdata_plugin.data_nodes import (ActorPool, LocalShare,  # noqa: E402
                                      RayBatchStream, import_ray)
from mmdata_plugin.handover import block_collate  # noqa: E402
from mmdata_plugin.utils.torch_internals import \
    shutdown_workers  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(
        description='Ray data nodes on a Ray cluster started on this '
        'machine (ray.cluster_utils.Cluster: the trainer\'s node and '
        '--data-nodes data nodes). 1) Per-batch cost, one producer each, of a ready batch '
        '(--batch-size x 3 x --size x --size uint8) reaching the trainer: '
        'local DataLoader workers, one actor on the trainer\'s node, one on '
        'another node (ms, GB/s). 2) Throughput vs the number of actors k '
        'when each sample waits --wait-ms (a stand-in for remote CPUs), '
        'against k x one actor. 3) Mixed production '
        '(RayDataNodesHook(local_workers=True)) on that pipeline: '
        '--mix-workers local DataLoader workers beside --mix-actors actors, '
        'against each alone and their sum. Medians of --rounds rounds.')
    parser.add_argument('--batch-size', type=int, default=256)
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument('--batches', type=int, default=12,
                        help='batches measured per run, after 2 of warm-up')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--idle', type=float, default=0.5,
                        help='seconds between batches when measuring what '
                        'taking a ready batch costs the trainer')
    parser.add_argument('--data-nodes', type=int, default=2)
    parser.add_argument('--scale-k', default='1,2,4',
                        help='numbers of actors for the scaling part')
    parser.add_argument('--scale-batch-size', type=int, default=32)
    parser.add_argument('--wait-ms', type=float, default=10.0,
                        help='injected wait per sample in the scaling part')
    parser.add_argument('--mix-workers', type=int, default=2,
                        help='local DataLoader workers in the mixed part')
    parser.add_argument('--mix-actors', type=int, default=2,
                        help='actors on the data nodes in the mixed part')
    parser.add_argument('--parts', default='overhead,scaling,mixed',
                        help='which tables to print')
    parser.add_argument('--object-store-mb', type=int, default=1024,
                        help='object store per node')
    return parser.parse_args()


class ReadySamples(Dataset):
    """Ready-made samples (a copy of one uint8 image and a label), each
    after an optional wait: only the hand-over (and the wait) costs."""

    def __init__(self, size: int, wait_ms: float = 0.0) -> None:
        self.image = torch.randint(0, 256, (3, size, size),
                                   dtype=torch.uint8)
        self.wait_ms = wait_ms

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index):
        if self.wait_ms:
            time.sleep(self.wait_ms / 1e3)
        return dict(inputs=self.image.clone(),
                    data_samples=BaseDataElement(label=int(index) % 10))


def _batches(batch_size: int):
    return iter(BatchSampler(SequentialSampler(range(1 << 30)), batch_size,
                             drop_last=True))


def _back_to_back(stream, batches: int) -> float:
    """Seconds per batch taken back to back, after 2 of warm-up."""
    for _ in range(2):
        next(stream)
    start = time.perf_counter()
    for _ in range(batches):
        assert next(stream)['inputs'].dtype == torch.uint8
    return (time.perf_counter() - start) / batches


def _seconds_per_batch(stream, batches: int, idle: float):
    """(seconds per batch taken back to back, seconds the trainer spends
    taking a batch that is ready: its receive cost)."""
    rate = _back_to_back(stream, batches)
    receive = []
    for _ in range(3):
        time.sleep(idle)  # a slow step: the next batch is ready
        start = time.perf_counter()
        next(stream)
        receive.append(time.perf_counter() - start)
    return rate, statistics.median(receive)


def _ray_stream(dataset, batch_size: int, k: int, resources: dict):
    pool = ActorPool(dataset, block_collate, k,
                     dict(num_cpus=0.5, resources=resources), seed=0)
    return pool, RayBatchStream(_batches(batch_size), pool, 2 * k, False)


def _ray_rate(dataset, args, batch_size: int, k: int,
              resources: dict) -> float:
    pool, stream = _ray_stream(dataset, batch_size, k, resources)
    try:
        return _seconds_per_batch(stream, args.batches, args.idle)
    finally:
        pool.close()


def _local_loader(dataset, batch_size: int, workers: int) -> DataLoader:
    return DataLoader(dataset, batch_sampler=BatchSampler(
        SequentialSampler(range(1 << 30)), batch_size, drop_last=True),
                      num_workers=workers, collate_fn=block_collate)


def _local_rate(dataset, args) -> float:
    iterator = iter(_local_loader(dataset, args.batch_size, 1))
    try:
        return _seconds_per_batch(iterator, args.batches, args.idle)
    finally:
        shutdown_workers(iterator)


def _start_cluster(args):
    from ray.cluster_utils import Cluster
    ray = import_ray()
    store = args.object_store_mb << 20
    cluster = Cluster(
        initialize_head=True,
        head_node_args=dict(num_cpus=2, object_store_memory=store,
                            resources=dict(trainer_node=4),
                            include_dashboard=False))
    for _ in range(args.data_nodes):
        cluster.add_node(num_cpus=4, object_store_memory=store,
                         resources=dict(data_node=4))
    ray.init(address=cluster.address, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    return cluster


def overhead_table(args) -> None:
    dataset = ReadySamples(args.size)
    nbytes = args.batch_size * 3 * args.size * args.size
    runs = dict(local_workers=lambda: _local_rate(dataset, args),
                ray_same_node=lambda: _ray_rate(
                    dataset, args, args.batch_size, 1,
                    dict(trainer_node=1)),
                ray_other_node=lambda: _ray_rate(
                    dataset, args, args.batch_size, 1, dict(data_node=1)))
    times = {name: [] for name in runs}
    for _ in range(args.rounds):  # interleaved rounds
        for name, run in runs.items():
            times[name].append(run())
    print(f'\nPer batch of {args.batch_size}x3x{args.size}x{args.size} '
          f'uint8 ({nbytes / 1e6:.1f} MB), ready samples, one producer '
          f'each, median of {args.rounds} rounds: back to back ({args.batches} '
          'batches) and what taking a ready batch costs the trainer:')
    print(f"{'path':<16}{'ms/batch':>10}{'GB/s':>8}{'vs local':>10}"
          f"{'take ms':>9}{'take GB/s':>11}")
    local = statistics.median(rate for rate, _ in times['local_workers'])
    for name, values in times.items():
        seconds = statistics.median(rate for rate, _ in values)
        take = statistics.median(receive for _, receive in values)
        print(f'{name:<16}{seconds * 1e3:>10.1f}'
              f'{nbytes / seconds / 1e9:>8.2f}{seconds / local:>10.2f}'
              f'{take * 1e3:>9.1f}{nbytes / take / 1e9:>11.2f}')


def scaling_table(args) -> None:
    dataset = ReadySamples(args.size, args.wait_ms)
    batch = args.scale_batch_size
    ks = [int(k) for k in args.scale_k.split(',')]
    times = {k: [] for k in ks}
    for _ in range(args.rounds):
        for k in ks:
            times[k].append(
                _ray_rate(dataset, args, batch, k, dict(data_node=0.5))[0])
    one = batch / statistics.median(times[ks[0]]) / ks[0]
    print(f'\nThroughput vs actors on the data nodes, {batch} samples per '
          f'batch, {args.wait_ms:g} ms wait per sample:')
    print(f"{'k':>3}{'img/s':>10}{'k x one':>10}{'ratio':>8}")
    for k in ks:
        rate = batch / statistics.median(times[k])
        print(f'{k:>3}{rate:>10.1f}{k * one:>10.1f}{rate / (k * one):>8.2f}')


def _mixed_rate(dataset, args, actors: int, workers: int) -> tuple:
    """(seconds per batch, share of the batches local workers made) of a
    stream fed by ``actors`` actors on the data nodes and ``workers``
    local workers (either may be 0)."""
    batch = args.scale_batch_size
    if not actors:
        iterator = iter(_local_loader(dataset, batch, workers))
        try:
            return _back_to_back(iterator, 2 * args.batches), 1.0
        finally:
            shutdown_workers(iterator)
    pool = ActorPool(dataset, block_collate, actors,
                     dict(num_cpus=0.5, resources=dict(data_node=0.5)),
                     seed=0)
    local = (LocalShare(_local_loader(dataset, batch, workers))
             if workers else None)
    try:
        stream = RayBatchStream(_batches(batch), pool, 2 * actors, False,
                                local=local)
        seconds = _back_to_back(stream, 2 * args.batches)
        return seconds, stream.made['local'] / sum(stream.made.values())
    finally:
        pool.close()
        if local is not None:
            local.close()


def mixed_table(args) -> None:
    dataset = ReadySamples(args.size, args.wait_ms)
    batch, workers, actors = (args.scale_batch_size, args.mix_workers,
                              args.mix_actors)
    runs = {
        f'{workers} local workers': (0, workers),
        f'{actors} actors': (actors, 0),
        'mixed': (actors, workers)
    }
    times = {name: [] for name in runs}
    shares = []
    for _ in range(args.rounds):  # interleaved rounds
        for name, (k, w) in runs.items():
            seconds, share = _mixed_rate(dataset, args, k, w)
            times[name].append(seconds)
            if name == 'mixed':
                shares.append(share)
    rates = {name: batch / statistics.median(values)
             for name, values in times.items()}
    both = sum(rate for name, rate in rates.items() if name != 'mixed')
    print(f'\nMixed production, {batch} samples per batch, {args.wait_ms:g} '
          f'ms wait per sample ({2 * args.batches} batches per run; local '
          f'share of the mixed run: {100 * statistics.median(shares):.0f}%):')
    print(f"{'producers':<18}{'img/s':>10}{'vs sum':>8}")
    for name, rate in rates.items():
        print(f'{name:<18}{rate:>10.1f}{rate / both:>8.2f}')


TABLES = dict(overhead=overhead_table, scaling=scaling_table,
              mixed=mixed_table)


def main():
    args = parse_args()
    started = time.perf_counter()
    cluster = _start_cluster(args)
    print(f'cluster of {1 + args.data_nodes} nodes up in '
          f'{time.perf_counter() - started:.1f} s')
    try:
        for part in args.parts.split(','):
            TABLES[part](args)
    finally:
        import_ray().shutdown()
        cluster.shutdown()


if __name__ == '__main__':
    main()
