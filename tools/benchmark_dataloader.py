# How fast does a config's DataLoader deliver, where does its time go, and
# how many workers does it need?
import argparse
import copy
import os
import sys
import time
from typing import Dict, List, Tuple

from mmengine.config import Config, ConfigDict
from mmengine.registry import DATASETS
from mmengine.runner import Runner, set_random_seed
from mmengine.utils import ProgressBar
from mmengine.utils.dl_utils import set_multi_processing

from mmdata_plugin.data_monitor import (DataLoaderMonitor, format_stage_table,
                                        format_sweep_table, format_throughput,
                                        format_worker_table, recommend_workers,
                                        save_report, summarize_runs)
from mmdata_plugin.data_monitor.report import select_rank
from mmdata_plugin.data_monitor.worker_sweep import TOLERANCE, bottleneck_text
from mmdata_plugin.utils.tool_config import (add_dataloader_arguments,
                                             load_dataloader_config)


def parse_args():
    parser = argparse.ArgumentParser(
        description='Build only the DataLoader of a config (no model), run '
        'it and print samples/s, batches/s and where the time goes (file '
        'read, decode, each transform, collate, wait, transfer), measured by '
        "DataMonitorHook's DataLoaderMonitor. With several worker counts, "
        'compare them and recommend the smallest within 5% of the best.')
    parser.add_argument('config', help='config file')
    add_dataloader_arguments(parser)
    parser.add_argument(
        '--num-batches',
        type=int,
        default=50,
        help='batches measured per run, after the warm-up (50)')
    parser.add_argument(
        '--warmup',
        type=int,
        default=5,
        help='batches not counted after the first one of each run, whose '
        'wait (worker start) is reported apart (5)')
    parser.add_argument(
        '--workers',
        help='num_workers to measure, comma separated (e.g. 0,2,4,8); '
        "default: the config's")
    parser.add_argument(
        '--repeats',
        type=int,
        default=3,
        help='runs per worker count, each with a new DataLoader; medians '
        'are reported (3)')
    parser.add_argument(
        '--step-ms',
        type=float,
        default=0.0,
        help='stand in for the model: sleep this long per batch (your '
        "training step's time). Default 0: the loader is read flat out")
    parser.add_argument(
        '--out', help='write the rows and every run\'s report to this JSON')
    args = parser.parse_args()
    if args.num_batches < 1 or args.warmup < 0 or args.repeats < 1:
        parser.error('--num-batches and --repeats must be >= 1, --warmup '
                     '>= 0')
    if args.workers is not None:
        try:
            args.workers = sorted({int(w) for w in args.workers.split(',')})
        except ValueError:
            parser.error(f'--workers: integers expected, got {args.workers}')
        if args.workers[0] < 0:
            parser.error('--workers: counts must be >= 0')
    return args


def load_config(args) -> Tuple[Config, ConfigDict]:
    """The config as the Runner would see it (multi-processing settings
    included) and the dataloader to measure."""
    cfg, loader_cfg = load_dataloader_config(args.config, args.split,
                                             args.cfg_options)
    # Runner.setup_env: start method, one OpenCV/OpenMP thread per worker.
    set_multi_processing(
        **cfg.get('env_cfg', {}).get('mp_cfg', {}), distributed=False)
    return cfg, loader_cfg


def build_dataset(loader_cfg):
    """The dataset, built once for every run (as ``build_dataloader``)."""
    dataset = DATASETS.build(loader_cfg.dataset)
    if hasattr(dataset, 'full_init'):
        dataset.full_init()
    return dataset


def build_loader(loader_cfg, dataset, workers: int, randomness: dict):
    """``Runner.build_dataloader`` of the config with ``workers`` workers:
    its sampler, batch sampler, collate_fn and worker_init_fn (seeded)."""
    cfg = copy.deepcopy(loader_cfg)
    cfg.dataset = dataset
    cfg.num_workers = workers
    if workers == 0:  # torch refuses these without worker processes
        cfg.persistent_workers = False
        cfg.pop('prefetch_factor', None)
    return Runner.build_dataloader(
        cfg,
        seed=randomness['seed'],
        diff_rank_seed=randomness.get('diff_rank_seed', False))


def run_once(loader_cfg, dataset, workers: int, randomness: dict, args,
             progress: ProgressBar) -> dict:
    """Measure ``args.num_batches`` batches of a new loader; its report."""
    # The same global RNG state (samplers without their own generator) and
    # the same worker seeds for every run.
    set_random_seed(randomness['seed'])
    loader = build_loader(loader_cfg, dataset, workers, randomness)
    pause = args.step_ms / 1e3
    # The bar (of counted batches) is redrawn at most 5 times a second:
    # drawing it costs about as much as the consumer's other work.
    shown, drawn = time.perf_counter(), 0
    # The run's first batch (worker start) and `warmup` more are not
    # counted; later epochs' first batches are (their refill is a cost).
    with DataLoaderMonitor(
            loader,
            warmup_iters=args.warmup,
            settle_iters=0,
            count_restarts=True) as monitor:
        taken = 0
        while monitor.counted_steps < args.num_batches:
            taken_before = taken
            for _ in loader:
                taken += 1
                now = time.perf_counter()
                if now - shown > 0.2 and monitor.counted_steps > drawn:
                    progress.update(monitor.counted_steps - drawn)
                    shown, drawn = now, monitor.counted_steps
                if pause:
                    time.sleep(pause)
                if monitor.counted_steps >= args.num_batches:
                    break
            if taken == taken_before:
                raise SystemExit(f'the {args.split} DataLoader yields no '
                                 'batch')
        report = monitor.report()
    if monitor.counted_steps > drawn:
        progress.update(monitor.counted_steps - drawn)
    return report


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def describe_setup(args, loader_cfg, dataset, build_s: float,
                   randomness: dict) -> str:
    sampler = loader_cfg.get('batch_sampler') or loader_cfg.get('sampler')
    collate = loader_cfg.get('collate_fn', dict(type='pseudo_collate'))
    consumer = (f'sleeps {args.step_ms:g} ms per batch (--step-ms)'
                if args.step_ms else 'does nothing (flat out)')
    return '\n'.join([
        f'benchmark_dataloader: {args.split}_dataloader of {args.config}',
        f'  {type(dataset).__name__}: {len(dataset)} samples (built in '
        f"{build_s:.2f} s), batch_size={loader_cfg.get('batch_size')}, "
        f"sampler {sampler.get('type', sampler)}, collate_fn "
        f"{collate.get('type', collate)}; {usable_cores()} usable cores",
        f'  each run: a new DataLoader (Runner.build_dataloader, seed '
        f"{randomness['seed']}); its first batch (worker start) and "
        f'{args.warmup} more are not counted, then {args.num_batches} are '
        '(epoch starts included); '
        f'{args.repeats} run(s) per worker count, medians reported; the '
        f'consumer {consumer}',
    ])


def print_breakdown(row: dict, args) -> None:
    report = row['median_report']
    rank = select_rank(report)
    runs = ', '.join(f'{t:.2f}' for t in row['batches_per_s_runs'])
    print(f"\nnum_workers={row['workers']} (the median run; batches/s of the "
          f'runs: {runs})')
    print(format_throughput(rank))
    if row['startup_ms'] is not None:
        print(f"First batch of a run (worker start): {row['startup_ms']:.0f} "
              'ms')
    print()
    print(format_stage_table(rank))
    print()
    print(format_worker_table(rank))
    print()
    if args.step_ms:
        print(report['verdict']['summary'])
        advice = report['advice']
    else:
        print(f'Bottleneck: {bottleneck_text(report)}.')
        # Sizing workers needs a training step to keep up with.
        advice = [a for a in report['advice'] if a['topic'] != 'workers']
    advice = [a['text'] for a in advice]
    if advice:
        print('Advice:\n' + '\n'.join(f'  - {text}' for text in advice))


def main():
    args = parse_args()
    cfg, loader_cfg = load_config(args)
    randomness = dict(cfg.get('randomness') or {})
    if randomness.get('seed') is None:
        randomness['seed'] = 0  # every run reads the same samples
    counts = args.workers or [loader_cfg.get('num_workers', 0)]

    start = time.perf_counter()
    dataset = build_dataset(loader_cfg)
    build_s = time.perf_counter() - start
    print(describe_setup(args, loader_cfg, dataset, build_s, randomness),
          flush=True)

    reports: Dict[int, List[dict]] = {w: [] for w in counts}
    progress = ProgressBar(
        len(counts) * args.repeats * args.num_batches, file=sys.stderr)
    for repeat in range(args.repeats):
        # Alternate the order so that a drift in the machine's load does
        # not always favour the same counts.
        for workers in counts[::-1 if repeat % 2 else 1]:
            reports[workers].append(
                run_once(loader_cfg, dataset, workers, randomness, args,
                         progress))
    sys.stderr.write('\n')
    sys.stderr.flush()

    rows = [summarize_runs(w, reports[w]) for w in counts]
    shown = rows[0]
    if len(counts) > 1:
        print()
        print(format_sweep_table(rows))
        best = recommend_workers(
            {row['workers']: row['batches_per_s']
             for row in rows})
        shown = next(row for row in rows if row['workers'] == best)
        top = max(rows, key=lambda row: row['batches_per_s'] or 0)
        print(f'\nRecommended: num_workers={best}, the smallest count within '
              f'{100 * TOLERANCE:.0f}% of the best ('
              f"{top['batches_per_s']:.2f} batches/s with {top['workers']} "
              'workers)')
    print_breakdown(shown, args)
    if args.out:
        save_report(
            dict(
                rows=[{k: v
                       for k, v in row.items() if k != 'median_report'}
                      for row in rows],
                reports={str(w): runs
                         for w, runs in reports.items()}), args.out)
        print(f'\nwritten: {os.path.abspath(args.out)}')


if __name__ == '__main__':
    main()
