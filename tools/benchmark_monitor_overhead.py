# Loader throughput on the demo pipeline with and without the data monitor.
import argparse
import os
import os.path as osp
import resource
import statistics
import time
from typing import Tuple

from mmengine.config import Config, DictAction
from mmengine.runner import Runner
from mmengine.utils.dl_utils import set_multi_processing

import mmdata_plugin  # noqa: F401  (registers the demo components)
from mmdata_plugin.data_monitor import DataLoaderMonitor
from mmdata_plugin.utils import make_demo_dataset

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def parse_args():
    parser = argparse.ArgumentParser(
        description='Measure the DataLoader throughput of a config\'s train '
        'pipeline without and with DataLoaderMonitor (what DataMonitorHook '
        'runs; per-transform timing and IO/decode split on), in alternating '
        'runs, and print the median throughput ratio')
    parser.add_argument(
        '--config',
        default=osp.join(ROOT, 'configs', 'demo', 'tinycnn_demo-jpeg.py'))
    parser.add_argument(
        '--data-root',
        default=osp.join(ROOT, 'data', 'demo'),
        help='demo data (written there first if missing)')
    parser.add_argument(
        '--batches', type=int, default=60, help='timed batches per run')
    parser.add_argument(
        '--warmup', type=int, default=8, help='untimed batches per run')
    parser.add_argument(
        '--rounds',
        type=int,
        default=5,
        help='rounds of two plain and two monitored runs (ABBA order)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, e.g. train_dataloader.num_workers=4')
    return parser.parse_args()


def timed_run(cfg: Config, monitored: bool, warmup: int,
              batches: int) -> Tuple[float, float]:
    """One run of a fresh loader: samples per second over ``batches``
    batches, and CPU seconds per sample of the whole run.

    The CPU figure adds the training process's CPU time and that of its
    workers (counted once they are shut down and joined); it hardly moves
    when other jobs share the cores, unlike the wall-clock rate.
    """
    cpu_start = time.process_time() + _children_cpu()
    loader = Runner.build_dataloader(cfg.train_dataloader, seed=0)
    monitor = DataLoaderMonitor(loader).install() if monitored else None
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    samples, start = 0, time.perf_counter()
    for _ in range(batches):
        samples += len(next(iterator)['inputs'])
    elapsed = time.perf_counter() - start
    if monitor is not None:
        monitor.uninstall()
    shutdown = getattr(iterator, '_shutdown_workers', None)
    if shutdown is not None:
        shutdown()
    cpu = time.process_time() + _children_cpu() - cpu_start
    return samples / elapsed, cpu / (samples * (warmup + batches) / batches)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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
    print(
        f"{osp.basename(args.config)}: batch_size={loader_cfg.batch_size}, "
        f"num_workers={loader_cfg.num_workers}; {args.rounds} rounds x "
        f'(plain, monitored, monitored, plain), {args.warmup} + '
        f'{args.batches} batches per run',
        flush=True)

    rate_ratios, cpu_ratios, rates = [], [], dict(plain=[], monitored=[])
    for round_index in range(args.rounds):
        runs = dict(plain=[], monitored=[])
        for name in ('plain', 'monitored', 'monitored', 'plain'):
            runs[name].append(
                timed_run(cfg, name == 'monitored', args.warmup, args.batches))
        rate = {k: statistics.mean(r for r, _ in v) for k, v in runs.items()}
        cpu = {k: statistics.mean(c for _, c in v) for k, v in runs.items()}
        rate_ratios.append(rate['monitored'] / rate['plain'])
        cpu_ratios.append(cpu['plain'] / cpu['monitored'])
        for name in rates:
            rates[name] += [r for r, _ in runs[name]]
        print(
            f"round {round_index + 1}: plain {rate['plain']:6.1f} "
            f"samples/s ({1e3 * cpu['plain']:.2f} CPU ms/sample), "
            f"monitored {rate['monitored']:6.1f} samples/s "
            f"({1e3 * cpu['monitored']:.2f} CPU ms/sample)",
            flush=True)
    print(f"median throughput: plain {statistics.median(rates['plain']):.1f}"
          f", monitored {statistics.median(rates['monitored']):.1f} "
          'samples/s')
    print('median ratio monitored/plain, samples per second: '
          f'{statistics.median(rate_ratios):.3f}  (goal >= 0.99)')
    print('median ratio monitored/plain, samples per CPU second: '
          f'{statistics.median(cpu_ratios):.3f}')


if __name__ == '__main__':
    main()
