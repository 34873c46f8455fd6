# Loader throughput on the demo pipeline with and without the data monitor.
import argparse
import os
import os.path as osp
import statistics
import time
from typing import Dict, Iterator, List, Optional

from mmengine.config import Config, DictAction
from mmengine.runner import Runner
from mmengine.utils.dl_utils import set_multi_processing

import mmdata_plugin  # noqa: F401  (registers the demo components)
from mmdata_plugin.data_monitor import DataLoaderMonitor
from mmdata_plugin.data_monitor.instrument import LoaderInstrumentation
from mmdata_plugin.utils import make_demo_dataset

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
MODES = ('plain', 'monitored')


def parse_args():
    parser = argparse.ArgumentParser(
        description='Measure the DataLoader throughput of a config\'s train '
        'pipeline without and with DataLoaderMonitor (what DataMonitorHook '
        'runs; per-transform timing and IO/decode split on). Two loaders '
        'run side by side and are read in alternating chunks (plain, '
        'monitored, monitored, plain per round), so that changes in the '
        'machine\'s load hit both alike; prints the median ratio.')
    parser.add_argument(
        '--config',
        default=osp.join(ROOT, 'configs', 'demo', 'tinycnn_demo-jpeg.py'))
    parser.add_argument(
        '--data-root',
        default=osp.join(ROOT, 'data', 'demo'),
        help='demo data (written there first if missing)')
    parser.add_argument(
        '--rounds', type=int, default=20, help='rounds of four chunks')
    parser.add_argument(
        '--batches', type=int, default=15, help='timed batches per chunk')
    parser.add_argument(
        '--warmup', type=int, default=10, help='untimed batches per loader')
    parser.add_argument(
        '--fetch-rounds',
        type=int,
        default=40,
        help='rounds of the in-process per-sample measurement (0: skip)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, e.g. train_dataloader.num_workers=4')
    return parser.parse_args()


def take(iterator: Iterator, batches: int) -> int:
    """Samples in the next ``batches`` batches."""
    return sum(len(next(iterator)['inputs']) for _ in range(batches))


def worker_cpu(iterator) -> Optional[float]:
    """CPU seconds used so far by the loader's worker processes (Linux).

    Reads the private ``_workers`` list of torch's multi-process iterator:
    a benchmark-only shortcut to tell two loaders' workers apart.
    """
    total = 0.0
    for worker in getattr(iterator, '_workers', []):
        try:
            with open(f'/proc/{worker.pid}/stat') as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf(
            'SC_CLK_TCK')
    return total


def fetch_cost(loader_cfg, rounds: int, per_round: int = 100) -> None:
    """Per-sample cost of the worker-side timing, in this process.

    Wall time of ``dataset[i]`` with and without the instrumentation (the
    timed fetch, every transform, the IO/decode probes), in alternating
    passes over the same indices: far steadier than loader throughput, and
    the share it prints is what the monitor costs each worker.
    """
    loader_cfg = loader_cfg.copy()
    loader_cfg.update(num_workers=0, persistent_workers=False)
    loader_cfg.pop('prefetch_factor', None)
    loader = Runner.build_dataloader(loader_cfg, seed=0)
    dataset = loader.dataset
    instrumentation = LoaderInstrumentation(loader)
    size = len(dataset)

    def per_sample(start: int) -> float:
        began = time.perf_counter()
        for index in range(start, start + per_round):
            dataset[index % size]
        return (time.perf_counter() - began) / per_round

    times: Dict[str, List[float]] = {m: [] for m in MODES}
    for round_index in range(rounds):
        start = round_index * per_round
        times['plain'].append(per_sample(start))
        instrumentation.install()
        try:
            times['monitored'].append(per_sample(start))
        finally:
            instrumentation.uninstall()
    plain, monitored = (statistics.median(times[m]) for m in MODES)
    print(f'per sample in one process ({rounds} alternating passes of '
          f'{per_round}): plain {1e6 * plain:.1f} us, monitored '
          f'{1e6 * monitored:.1f} us; the timing costs '
          f'{1e6 * (monitored - plain):.1f} us = '
          f'{100 * (monitored - plain) / plain:.2f}% of a sample, ratio '
          f'plain/monitored {plain / monitored:.3f}')


def main():
    args = parse_args()
    if not osp.isfile(osp.join(args.data_root, 'train.txt')):
        print(f'Writing the demo data to {args.data_root} ...', flush=True)
        make_demo_dataset(args.data_root)
    os.environ['MMDATA_DEMO_ROOT'] = args.data_root
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    set_multi_processing(**cfg.get('env_cfg', {}).get('mp_cfg', {}))
    loader_cfg = cfg.train_dataloader
    print(f'{osp.basename(args.config)}: batch_size={loader_cfg.batch_size}, '
          f'num_workers={loader_cfg.num_workers}; {args.rounds} rounds x '
          f'(plain, monitored, monitored, plain) x {args.batches} batches',
          flush=True)

    loaders = {m: Runner.build_dataloader(loader_cfg, seed=0) for m in MODES}
    monitor = DataLoaderMonitor(loaders['monitored']).install()
    iterators = {m: iter(loader) for m, loader in loaders.items()}
    samples = {m: take(iterators[m], args.warmup) for m in MODES}
    main_cpu = {m: 0.0 for m in MODES}
    seconds = {m: 0.0 for m in MODES}
    ratios: List[float] = []
    for round_index in range(args.rounds):
        rates: Dict[str, List[float]] = {m: [] for m in MODES}
        for mode in ('plain', 'monitored', 'monitored', 'plain'):
            cpu, start = time.process_time(), time.perf_counter()
            n = take(iterators[mode], args.batches)
            elapsed = time.perf_counter() - start
            main_cpu[mode] += time.process_time() - cpu
            seconds[mode] += elapsed
            samples[mode] += n
            rates[mode].append(n / elapsed)
        ratio = statistics.mean(rates['monitored']) / statistics.mean(
            rates['plain'])
        ratios.append(ratio)
        print(f"round {round_index + 1:2d}: plain "
              f"{statistics.mean(rates['plain']):6.1f}, monitored "
              f"{statistics.mean(rates['monitored']):6.1f} samples/s, "
              f'ratio {ratio:.3f}', flush=True)

    workers = {m: worker_cpu(iterators[m]) for m in MODES}
    monitor.uninstall()
    for iterator in iterators.values():
        shutdown = getattr(iterator, '_shutdown_workers', None)
        if shutdown is not None:
            shutdown()
    timed = {m: samples[m] - args.warmup * loader_cfg.batch_size
             for m in MODES}
    print('throughput over all chunks: ' + ', '.join(
        f'{m} {timed[m] / seconds[m]:.1f} samples/s' for m in MODES))
    print('median ratio monitored/plain, samples per second: '
          f'{statistics.median(ratios):.3f}  (goal >= 0.99)')
    if None not in workers.values():
        # Worker CPU covers warm-up and prefetched batches too; the
        # training process's CPU only the timed chunks.
        per_sample = {
            m: workers[m] / samples[m] + main_cpu[m] / timed[m]
            for m in MODES
        }
        cpu_ratio = per_sample['plain'] / per_sample['monitored']
        print('CPU per sample (workers + training process): ' + ', '.join(
            f'{m} {1e3 * per_sample[m]:.3f} ms' for m in MODES) +
              f'; ratio plain/monitored {cpu_ratio:.3f}')
    if args.fetch_rounds:
        fetch_cost(loader_cfg, args.fetch_rounds)


if __name__ == '__main__':
    main()
