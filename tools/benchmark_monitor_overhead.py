# What the data monitor costs: loader throughput with and without it, the
# per-sample cost in one process and the per-step cost in the training
# process, on a cheap pipeline and on a config's (the demo's by default).
import argparse
import os
import os.path as osp
import statistics
import time
from types import SimpleNamespace
from typing import Callable, Dict, Iterator, List, Optional

import cv2
import mmcv
import numpy as np
from mmcv.transforms import RandomFlip
from mmengine.config import Config, DictAction
from mmengine.dataset import BaseDataset, InfiniteSampler, default_collate
from mmengine.hooks import LoggerHook
from mmengine.logging import MessageHub
from mmengine.runner import Runner
from mmengine.utils.dl_utils import set_multi_processing
from torch.utils.data import DataLoader

import mmdata_plugin  # noqa: F401  (registers the demo components)
from mmdata_plugin.data_monitor import DataLoaderMonitor
from mmdata_plugin.data_monitor.instrument import LoaderInstrumentation
from mmdata_plugin.data_monitor.worker_timing import ACCUMULATOR
from mmdata_plugin.engine import DataMonitorHook
from mmdata_plugin.transforms import PackImageLabelInputs
from mmdata_plugin.utils import make_demo_dataset

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
MODES = ('plain', 'monitored')
#: Chunk order of a round: a drift in the machine's load hits both alike.
ROUND = ('plain', 'monitored', 'monitored', 'plain')
FETCH_PATHS = ('plain', 'untimed', 'timed')
CASES = ('cheap', 'demo')


def parse_args():
    parser = argparse.ArgumentParser(
        description='Measure what DataLoaderMonitor (what DataMonitorHook '
        'runs; per-transform timing and IO/decode split on, sampling as by '
        'default) costs, on a cheap pipeline (64x64 JPEGs decoded from '
        'memory, flip, pack; batch 32) and on a config\'s train pipeline: '
        '(1) loader throughput: two loaders read in alternating chunks '
        '(plain, monitored, monitored, plain per round), median ratio; '
        '(2) CPU per sample, in one process: alternating chunks of a '
        'worker-less plain and monitored loader, median difference; (3) per '
        'step in the training process: DataMonitorHook replaying recorded '
        'batches.')
    parser.add_argument(
        '--cases',
        nargs='+',
        choices=CASES,
        default=list(CASES),
        help='pipelines to measure')
    parser.add_argument(
        '--config',
        default=osp.join(ROOT, 'configs', 'demo', 'tinycnn_demo-jpeg.py'),
        help='the "demo" case\'s config')
    parser.add_argument(
        '--data-root',
        default=osp.join(ROOT, 'data', 'demo'),
        help='demo data (written there first if missing)')
    parser.add_argument(
        '--workers', type=int, default=2, help='workers of each loader')
    parser.add_argument(
        '--rounds', type=int, default=15, help='rounds of four chunks')
    parser.add_argument(
        '--chunk-seconds',
        type=float,
        default=0.5,
        help='length of a chunk, from the warm-up\'s rate: long enough that '
        'the scheduler and other jobs even out within it')
    parser.add_argument(
        '--batches',
        type=int,
        help='batches per chunk (overrides --chunk-seconds)')
    parser.add_argument(
        '--warmup', type=int, default=10, help='untimed batches per loader')
    parser.add_argument(
        '--process-rounds',
        type=int,
        default=15,
        help='rounds of the in-process per-sample measurement (0: skip)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override settings of the demo config')
    return parser.parse_args()


# ---------------------------------------------------------------- cheap case
class DecodeJpegBytes:
    """Decode ``results['img_bytes']`` with mmcv (the monitor's decode
    probe sees it)."""

    def __call__(self, results: dict) -> dict:
        results['img'] = mmcv.imfrombytes(results['img_bytes'])
        return results


class InMemoryJpegs(BaseDataset):
    """``num`` random 64x64 JPEGs held in memory, 10 labels."""

    def __init__(self, num: int = 1024, **kwargs) -> None:
        self.num = num
        super().__init__(**kwargs)

    def load_data_list(self) -> List[dict]:
        rng = np.random.default_rng(0)
        return [
            dict(
                img_bytes=cv2.imencode(
                    '.jpg', rng.integers(0, 255, (64, 64, 3),
                                         dtype=np.uint8))[1].tobytes(),
                gt_label=i % 10) for i in range(self.num)
        ]


def cheap_loader(num_workers: int) -> DataLoader:
    dataset = InMemoryJpegs(
        pipeline=[
            DecodeJpegBytes(),
            RandomFlip(prob=0.5),
            PackImageLabelInputs(meta_keys=())
        ],
        serialize_data=False)
    return DataLoader(
        dataset,
        batch_size=32,
        sampler=InfiniteSampler(dataset, shuffle=True, seed=0),
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        collate_fn=default_collate)


def config_loader(args) -> Callable[[int], DataLoader]:
    if not osp.isfile(osp.join(args.data_root, 'train.txt')):
        print(f'Writing the demo data to {args.data_root} ...', flush=True)
        make_demo_dataset(args.data_root)
    os.environ['MMDATA_DEMO_ROOT'] = args.data_root
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    set_multi_processing(**cfg.get('env_cfg', {}).get('mp_cfg', {}))

    def build(num_workers: int) -> DataLoader:
        loader_cfg = cfg.train_dataloader.copy()
        loader_cfg.update(
            num_workers=num_workers, persistent_workers=num_workers > 0)
        if not num_workers:
            loader_cfg.pop('prefetch_factor', None)
        return Runner.build_dataloader(loader_cfg, seed=0)

    return build


# ---------------------------------------------------------------- measures
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


def chunk_size(iterators: Dict[str, Iterator], args) -> int:
    """Warm both loaders up; batches per chunk: ``--batches``, or as many as
    the plain loader reads in ``--chunk-seconds`` (timed on as many more
    batches as the warm-up)."""
    for iterator in iterators.values():
        take(iterator, args.warmup)
    start = time.perf_counter()
    take(iterators['plain'], args.warmup)
    rate = args.warmup / (time.perf_counter() - start)
    return args.batches or max(1, round(args.chunk_seconds * rate))


def quartiles(values: List[float]) -> str:
    low, _, high = statistics.quantiles(values, n=4) if len(values) > 1 else (
        values * 3)
    return f'{low:.3f}-{high:.3f}'


def interleaved(build: Callable[[int], DataLoader], args):
    """Per-round ratios monitored/plain of samples per second, the ratio
    plain/monitored of CPU seconds per sample (workers + this process;
    steadier than wall time when other jobs share the cores), and the
    batches per chunk."""
    loaders = {m: build(args.workers) for m in MODES}
    monitor = DataLoaderMonitor(loaders['monitored']).install()
    iterators = {m: iter(loader) for m, loader in loaders.items()}
    main_cpu = {m: 0.0 for m in MODES}
    timed = {m: 0 for m in MODES}
    ratios = []
    try:
        batches = chunk_size(iterators, args)
        taken = {m: args.warmup for m in MODES}
        taken['plain'] += args.warmup
        for _ in range(args.rounds):
            rates: Dict[str, List[float]] = {m: [] for m in MODES}
            for mode in ROUND:
                cpu, start = time.process_time(), time.perf_counter()
                n = take(iterators[mode], batches)
                rates[mode].append(n / (time.perf_counter() - start))
                main_cpu[mode] += time.process_time() - cpu
                timed[mode] += n
                taken[mode] += batches
            ratios.append(
                statistics.mean(rates['monitored']) /
                statistics.mean(rates['plain']))
    finally:
        workers = {m: worker_cpu(iterators[m]) for m in MODES}
        sampling = monitor.summary()['sampling']
        monitor.uninstall()
        for iterator in iterators.values():
            shutdown = getattr(iterator, '_shutdown_workers', None)
            if shutdown is not None:
                shutdown()
    print(f'  {batches} batches per chunk; timed batches: '
          f"{sampling['timed_batches']} "
          f"({100 * sampling['timed_share']:.1f}% of the counted ones)")
    cpu_ratio = None
    if None not in workers.values():
        # Worker CPU covers the warm-up and prefetched batches too; this
        # process's only the timed chunks.
        per_sample = {
            m: workers[m] / (taken[m] * loaders[m].batch_size) +
            main_cpu[m] / timed[m]
            for m in MODES
        }
        cpu_ratio = per_sample['plain'] / per_sample['monitored']
        print('  CPU per sample (workers + training process): ' +
              ', '.join(f'{m} {1e6 * per_sample[m]:.1f} us' for m in MODES))
    return ratios, cpu_ratio


def in_process(build: Callable[[int], DataLoader], args) -> dict:
    """CPU seconds per sample of a worker-less plain loader, what the
    monitored one costs more (medians over rounds), and recorded batches.

    Each round reads chunks of a plain and a monitored loader without
    workers (plain, monitored, monitored, plain): the whole cost in one
    process (timed fetches and transforms, the untimed batches' counting,
    records, the monitor's bookkeeping). CPU time, not wall time: other
    jobs on the machine barely move it.
    """
    loaders = {m: build(0) for m in MODES}
    monitor = DataLoaderMonitor(loaders['monitored']).install()
    iterators = {m: iter(loader) for m, loader in loaders.items()}
    try:
        batches = chunk_size(iterators, args)
        rounds = cpu_rounds(iterators, args.process_rounds,
                            lambda iterator: take(iterator, batches))
        plain = [per_sample['plain'] for per_sample in rounds]
        costs = [per_sample['monitored'] - per_sample['plain']
                 for per_sample in rounds]
        recorded = record_batches(monitor, iterators['monitored'], batches)
        every = ACCUMULATOR.every  # this process loads: its K
    finally:
        monitor.uninstall()
    return dict(
        plain=statistics.median(plain),
        cost=statistics.median(costs),
        records=recorded,
        every=every)


def cpu_rounds(iterators: Dict[str, Iterator], rounds: int,
               read: Callable[[Iterator], int]) -> List[Dict[str, float]]:
    """Per round of :data:`ROUND` chunks, CPU seconds per unit of each
    mode in this process; ``read`` reads a chunk and returns its units."""
    results = []
    for _ in range(rounds):
        per_unit = {m: 0.0 for m in MODES}
        for mode in ROUND:
            start = time.process_time()
            units = read(iterators[mode])
            per_unit[mode] += (time.process_time() - start) / units / 2
        results.append(per_unit)
    return results


def record_batches(monitor: DataLoaderMonitor, iterator: Iterator,
                   batches: int) -> List[tuple]:
    """What the monitor receives for the next ``batches`` batches (after
    the measured rounds: recording is not the monitor's cost)."""
    recorded = []
    on_batch = monitor._on_batch

    def record(requested, received, rec):
        recorded.append((requested, received, rec))
        on_batch(requested, received, rec)

    monitor._on_batch = record
    take(iterator, batches)
    return recorded


def fetch_paths(build: Callable[[int], DataLoader],
                rounds: int) -> Dict[str, float]:
    """CPU seconds of a batch's fetch per sample: plain, and what an
    untimed batch (the sampled monitor's usual path) and a timed batch add.

    Each batch of indices (the loader's batch size, as torch's fetcher asks
    for them) is fetched the three ways one after the other, in an order
    that rotates from batch to batch; the additions are the medians of the
    per-batch differences: a paired measurement, which other jobs on the
    machine disturb far less than separate passes.
    """
    loader = build(0)
    dataset = loader.dataset
    size, batch_size = len(dataset), loader.batch_size
    batches = rounds * max(1, 160 // batch_size)
    instrumentation = LoaderInstrumentation(loader)
    instrumentation.install()
    plan = instrumentation.plan
    timed_class = type(dataset)
    base = timed_class._dm_base

    def fetch(path: str, indices: List[int]) -> float:
        ACCUMULATOR.timing = path == 'timed'
        plan.apply(ACCUMULATOR.timing)
        began = time.process_time()
        if path == 'plain':
            object.__setattr__(dataset, '__class__', base)
            try:  # what torch's fetcher does
                getitems = getattr(dataset, '__getitems__', None)
                getitems(indices) if getitems else [
                    dataset[i] for i in indices
                ]
            finally:
                object.__setattr__(dataset, '__class__', timed_class)
        else:
            dataset.__getitems__(indices)
        spent = time.process_time() - began
        ACCUMULATOR.reset()  # what the collate wrapper does
        return spent / len(indices)

    times: Dict[str, List[float]] = {m: [] for m in FETCH_PATHS}
    try:
        ACCUMULATOR.register(plan)
        for batch in range(-1, batches):  # batch -1 warms the caches up
            first = max(batch, 0) * batch_size
            indices = [i % size for i in range(first, first + batch_size)]
            shift = batch % len(FETCH_PATHS)
            for path in FETCH_PATHS[shift:] + FETCH_PATHS[:shift]:
                spent = fetch(path, indices)
                if batch >= 0:
                    times[path].append(spent)
    finally:
        ACCUMULATOR.reset()
        instrumentation.uninstall()
    plain = statistics.median(times['plain'])
    return dict(
        plain=plain,
        **{
            path: plain + statistics.median(
                t - p for t, p in zip(times[path], times['plain']))
            for path in FETCH_PATHS[1:]
        })


class Indices:
    """A dataset whose samples cost nothing: its index."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> int:
        return index


def per_batch_floor(batch_size: int, rounds: int) -> float:
    """CPU seconds the monitor adds per batch when samples cost nothing
    (median of the rounds' (plain, monitored, monitored, plain)
    differences, in one process): its own code, with the CPU caches as
    warm as they get. A real pipeline's work between batches cools them,
    which the in-process figure of that pipeline includes."""
    loaders = {
        m: DataLoader(Indices(), batch_size=batch_size, collate_fn=list)
        for m in MODES
    }
    monitor = DataLoaderMonitor(loaders['monitored']).install()
    iterators = {m: iter(loader) for m, loader in loaders.items()}
    batches = 500

    def read(iterator: Iterator) -> int:
        for _ in range(batches):
            next(iterator)
        return batches

    try:
        for iterator in iterators.values():
            read(iterator)  # warm-up
        rounds = cpu_rounds(iterators, rounds, read)
    finally:
        monitor.uninstall()
    return statistics.median(per_batch['monitored'] - per_batch['plain']
                             for per_batch in rounds)


def per_step(loader: DataLoader, recorded: list, repeat: int = 5) -> float:
    """CPU seconds per training step of DataMonitorHook (median of
    ``repeat`` replays of the recorded batches, 20 times each).

    The hook runs on a stand-in runner with mmengine's MessageHub and a
    LoggerHook of interval 10 (the hook publishes at its log lines); its
    private ``_logger`` / ``_start_log_interval`` and the monitor's
    ``_on_batch`` are what ``before_train`` and the DataLoader iterator
    would call: a benchmark-only shortcut around a whole Runner.
    """
    steps = recorded * 20
    runs = []
    for _ in range(repeat):
        hook = DataMonitorHook(warmup_iters=0, settle_iters=0,
                               table_interval=0)
        hook.monitor = DataLoaderMonitor(loader, **hook.monitor_args)
        hook._logger = LoggerHook(interval=10)
        runner = SimpleNamespace(
            iter=0,
            message_hub=MessageHub.get_instance('benchmark_monitor'),
            visualizer=SimpleNamespace(add_scalars=lambda *a, **k: None),
            train_dataloader=loader)
        hook._start_log_interval(runner)
        offset = 0.0
        start = time.process_time()
        for index, (requested, received, rec) in enumerate(steps):
            runner.iter = index
            if index % len(recorded) == 0:
                offset = index  # keep the replayed clock moving forward
            hook.monitor._on_batch(requested + offset, received + offset,
                                   rec)
            hook.before_train_iter(runner, index)
            hook.after_train_iter(runner, index)
        runs.append((time.process_time() - start) / len(steps))
    return statistics.median(runs)


def measure(name: str, build: Callable[[int], DataLoader], args) -> dict:
    probe = build(0)
    chunk = (f'{args.batches} batches' if args.batches else
             f'{args.chunk_seconds:g} s')
    print(f'{name}: batch_size={probe.batch_size}, {args.workers} workers '
          f'per loader; {args.rounds} rounds x (plain, monitored, '
          f'monitored, plain) x {chunk}', flush=True)
    ratios, cpu_ratio = interleaved(build, args)
    print(f'  throughput ratio monitored/plain per round: '
          f"{', '.join(f'{r:.3f}' for r in ratios)}")
    row = dict(
        case=name,
        ratio=statistics.median(ratios),
        spread=quartiles(ratios),
        cpu=cpu_ratio)
    if args.process_rounds:
        paths = fetch_paths(build, args.process_rounds)
        print('  batch fetch per sample, CPU: plain '
              f"{1e6 * paths['plain']:.1f} us; in an untimed batch "
              f"{1e6 * (paths['untimed'] - paths['plain']):+.2f} us, in a "
              f"timed batch {1e6 * (paths['timed'] - paths['plain']):+.2f}"
              ' us')
        costs = in_process(build, args)
        # What the per-sample instrumentation costs over a run: one batch
        # in K is timed.
        amortised = paths['untimed'] + (paths['timed'] -
                                        paths['untimed']) / costs['every']
        print(f"  instrumentation per sample, amortised (K={costs['every']}"
              f'): {1e6 * (amortised - paths["plain"]):+.2f} us')
        floor = per_batch_floor(probe.batch_size, args.process_rounds)
        print(f'  monitor per batch of zero-cost samples: {1e6 * floor:.2f} '
              f'us CPU ({1e6 * floor / probe.batch_size:.2f} us per sample '
              f'at batch {probe.batch_size})')
        row.update(
            every=costs['every'],
            amortised_us=1e6 * (amortised - paths['plain']),
            floor_us=1e6 * floor / probe.batch_size,
            sample_us=1e6 * costs['plain'],
            cost_us=1e6 * costs['cost'],
            cost_share=costs['cost'] / costs['plain'],
            step_us=1e6 * per_step(probe, costs['records']))
    return row


def main():
    args = parse_args()
    builders = dict(cheap=cheap_loader)
    if 'demo' in args.cases:
        builders['demo'] = config_loader(args)
    rows = [measure(case, builders[case], args) for case in args.cases]
    print('\ncase   throughput ratio (IQR)       CPU ratio  '
          'sample (one process)  monitor per sample    '
          'instrumentation, amortised (K)  '
          'zero-cost samples  per step (training process)')
    for row in rows:
        cpu = f"{row['cpu']:.3f}" if row['cpu'] is not None else '-'
        line = (f"{row['case']:<6} {row['ratio']:.3f} ({row['spread']}) "
                f">=0.99  {cpu:>7}")
        if 'sample_us' in row:
            line += (f"    {row['sample_us']:>9.1f} us        "
                     f"{row['cost_us']:>5.2f} us = "
                     f"{100 * row['cost_share']:5.2f}%   "
                     f"{row['amortised_us']:>+6.2f} us (K={row['every']:<3}) "
                     f"              {row['floor_us']:>6.2f} us        "
                     f"{row['step_us']:>6.1f} us CPU")
        print(line)
    print('Medians over interleaved rounds: other jobs on the machine hit '
          'plain and monitored alike. Throughput: samples/s per round, IQR '
          'of the rounds; monitor per sample: CPU time in one process, '
          'median of the rounds\' differences; instrumentation, amortised: '
          'the batch fetch\'s untimed cost plus its timed one over K; '
          'zero-cost samples: the same '
          'on a dataset whose samples are their index (the monitor\'s own '
          'code with warm CPU caches).')


if __name__ == '__main__':
    main()
