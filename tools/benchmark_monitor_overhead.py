# What the data monitor costs: loader throughput with and without it, the
# per-sample cost in one process, the per-step cost in the training
# process and the hook's whole cost at steady state (report refreshes
# included), on a cheap pipeline and on a config's (the demo's by default).
import argparse
import copy
import gc
import logging
import os
import os.path as osp
import shutil
import statistics
import tempfile
import time
from types import SimpleNamespace
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import cv2
import mmcv
import numpy as np
from mmcv.transforms import RandomFlip
from mmengine.config import Config, DictAction
from mmengine.dataset import BaseDataset, InfiniteSampler, default_collate
from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import MessageHub
from mmengine.registry import VISUALIZERS
from mmengine.runner import BaseLoop, Runner
from mmengine.utils.dl_utils import set_multi_processing
from torch.utils.data import DataLoader

import mmdata_plugin  # noqa: F401  (registers the demo components)
from mmdata_plugin.data_monitor import DataLoaderMonitor
from mmdata_plugin.data_monitor.instrument import LoaderInstrumentation
from mmdata_plugin.data_monitor.report_writer import ReportWriter
from mmdata_plugin.data_monitor.worker_timing import (ACCUMULATOR,
                                                      FULL_BATCHES)
from mmdata_plugin.engine import DataMonitorHook
from mmdata_plugin.testing import count_calls
from mmdata_plugin.transforms import PackImageLabelInputs
from mmdata_plugin.utils import make_demo_dataset
from mmdata_plugin.utils.torch_internals import shutdown_workers

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
MODES = ('plain', 'monitored')
#: Chunk order of a round: a drift in the machine's load hits both alike.
ROUND = ('plain', 'monitored', 'monitored', 'plain')
FETCH_PATHS = ('plain', 'untimed', 'timed')
CASES = ('cheap', 'demo')
#: Steps per group of the cold measurement (see cold_step): a whole number
#: of the log line's scalars, published every 10 steps (the stand-in
#: LoggerHook's interval). (The timeline's points come in bursts after a
#: hand-over of steps, every 10 s or so: rarely in these steps.)
COLD_GROUP = 50
#: Where the monitor's code lives (what :func:`monitor_calls` counts).
MONITOR_CODE = 'mmdata_plugin/data_monitor/'
#: The cheap case's visualizer: OpenMMLab's default runtime's.
LOCAL_VISUALIZER = dict(
    type='Visualizer', vis_backends=[dict(type='LocalVisBackend')])


def parse_args():
    parser = argparse.ArgumentParser(
        description='Measure what DataLoaderMonitor (what DataMonitorHook '
        'runs; per-transform timing and IO/decode split on, sampling as by '
        'default) costs, on a cheap pipeline (64x64 JPEGs decoded from '
        'memory, flip, pack; batch 32) and on a config\'s train pipeline: '
        '(1) loader throughput: two loaders read in alternating chunks '
        '(plain, monitored, monitored, plain per round), median ratio; '
        '(2) CPU per sample, in one process: a worker-less plain and '
        'monitored loader taking turns batch by batch, rounds of K batch '
        'pairs (K: the sampling interval, one timed batch per round), median '
        'of the rounds\' differences in thread CPU time; (3) per step in the '
        'training process: DataMonitorHook replaying recorded batches, and '
        'its calls with the CPU caches swept before each; (4) '
        'steady state: one DataMonitorHook (the config\'s arguments, tables '
        'and JSON refreshes included) on one long-lived worker-less loader '
        'read past the sampling ramp, then chunks alternating with a plain '
        'loader: CPU per sample of the process, and the longest '
        'after_train_iter call.')
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
        help='rounds of the in-process per-sample measurements (0: skip)')
    parser.add_argument(
        '--steady-rounds',
        type=int,
        default=15,
        help='rounds (plain, monitored, monitored, plain) of the steady-state '
        'measurement (0: skip)')
    parser.add_argument(
        '--steady-batches',
        type=int,
        default=64,
        help='batches per chunk of the steady-state measurement')
    parser.add_argument(
        '--steady-seconds',
        type=float,
        default=60.0,
        help='seconds of the uninterrupted monitored stretch whose hook and '
        'writer CPU is the steady state accounted (refreshes come about '
        'every 30 s with fast steps)')
    parser.add_argument(
        '--cold-steps',
        type=int,
        default=1000,
        help='steps of the per-step measurement with cold caches, in groups '
        f'of {COLD_GROUP} (0: skip), after --steady-warmup warm ones')
    parser.add_argument(
        '--sweep-mb',
        type=int,
        default=16,
        help='megabytes swept before each batch of those steps is taken and '
        'between the two calls of the hook, to evict what the hook touched '
        'from the CPU caches, as the pipeline and the model step do')
    parser.add_argument(
        '--idle-seconds',
        type=float,
        default=3.0,
        help='idle seconds before the small call that shows what code '
        'untouched for seconds costs on this machine (0: skip)')
    parser.add_argument(
        '--steady-warmup',
        type=int,
        default=4096,
        help='most batches read to get past the sampling ramp (the '
        'interval K doubles every 8 timed batches up to 256: about 2,600 '
        'batches)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override settings of the demo config')
    args = parser.parse_args()
    if args.idle_seconds < 0 or args.steady_seconds < 0:
        parser.error('--idle-seconds and --steady-seconds must be >= 0')
    if args.cold_steps % COLD_GROUP or args.cold_steps < 0:
        parser.error(f'--cold-steps must be 0 (skip) or a multiple of '
                     f'{COLD_GROUP}, got {args.cold_steps}')
    if args.sweep_mb < 1:
        parser.error(f'--sweep-mb must be >= 1, got {args.sweep_mb}')
    return args


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


def config_case(args) -> Tuple[Callable[[int], DataLoader], dict, dict]:
    """The config's DataLoader builder, its DataMonitorHook's arguments
    (none when it has no such hook) and its visualizer."""
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

    hooks = [
        hook for hook in cfg.get('custom_hooks', [])
        if hook.get('type') == 'DataMonitorHook'
    ]
    hook_args = {k: v for k, v in hooks[0].items() if k != 'type'} if (
        hooks) else {}
    return build, hook_args, cfg.get('visualizer') or LOCAL_VISUALIZER


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


def quartiles(values: List[float], form: str = '{:.3f}') -> str:
    low, _, high = statistics.quantiles(values, n=4) if len(values) > 1 else (
        values * 3)
    return f'{form.format(low)}..{form.format(high)}'


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
            shutdown_workers(iterator)
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
    monitored one costs more (median over rounds, with the rounds' IQR),
    the same for a second plain loader (the method's own noise and bias),
    its K, and recorded batches.

    The whole cost in one process (timed fetches and transforms, the
    untimed batches' counting, records, the monitor's bookkeeping),
    measured after the sampling interval K has settled, in rounds of K
    batch pairs (:func:`paired_round`): every round of the monitored
    loader holds one timed batch, so a round's difference is the cost
    amortised over a run. Each round is followed by one of the plain loader
    against a second plain loader (``control``), which should differ by
    nothing: what it shows is what the machine does to the method.
    """
    loaders = {m: build(0) for m in MODES + ('control', )}
    monitor = DataLoaderMonitor(loaders['monitored']).install()
    iterators = {m: iter(loader) for m, loader in loaders.items()}
    costs, noise, plain = [], [], []
    try:
        take(iterators['plain'], FULL_BATCHES)
        take(iterators['control'], FULL_BATCHES)
        every = settle_sampling(iterators['monitored'])
        for _ in range(args.process_rounds):
            measured = paired_round(iterators, MODES, every, sample_count)
            control = paired_round(iterators, ('plain', 'control'), every,
                                   sample_count)
            costs.append(measured['monitored'] - measured['plain'])
            noise.append(control['control'] - control['plain'])
            plain.append(measured['plain'])
        recorded = record_batches(monitor, iterators['monitored'], every)
    finally:
        monitor.uninstall()
    return dict(
        plain=statistics.median(plain),
        cost=statistics.median(costs),
        spread=quartiles([1e6 * c for c in costs], '{:+.2f}'),
        noise=statistics.median(noise),
        noise_spread=quartiles([1e6 * n for n in noise], '{:+.2f}'),
        records=recorded,
        every=every)


class _Idle:
    """What :func:`idle_code_cost` calls: a class of its own, so that
    nothing else runs its code."""

    def __init__(self) -> None:
        self.values, self.sums = [], {}


def idle_code_cost(idle: float = 3.0, repeats: int = 3) -> Tuple[float,
                                                                   float]:
    """Thread CPU time (median of ``repeats``) of a small call (a new
    object: a call, two containers) made after ``idle`` seconds in which
    the process did nothing, and of the same call made again at once.

    What code and data left untouched for seconds cost to reach again on
    this machine: the hook's refreshes and hand-overs come seconds apart
    and pay it. On a virtual machine whose host reclaims or migrates idle
    pages it is hundreds of times the warm cost; that, more than the
    hook's code, sets the refreshing call's time there.
    """
    first, again = [], []
    for _ in range(repeats):
        time.sleep(idle)
        for spent in (first, again):
            start = time.thread_time()
            _Idle()
            spent.append(time.thread_time() - start)
    return statistics.median(first), statistics.median(again)


def settle_sampling(iterator: Iterator, limit: int = 4096) -> int:
    """Read batches (at most ``limit``) until this process's sampling
    interval K has stayed the same for two of its periods; K."""
    every, steady = ACCUMULATOR.every, 0
    for _ in range(limit):
        next(iterator)
        steady = steady + 1 if ACCUMULATOR.every == every else 0
        every = ACCUMULATOR.every
        if steady >= 2 * every and every > 1:
            break
    return every


def sample_count(batch) -> int:
    return len(batch['inputs'])


def paired_round(iterators: Dict[str, Iterator], modes: Tuple[str, str],
                 pairs: int, samples: Callable) -> Dict[str, float]:
    """CPU seconds per sample of the two ``modes`` over ``pairs`` batch
    pairs.

    The two loaders take turns batch by batch, in the order first, second,
    then second, first: whatever else the machine runs slows both alike,
    and neither is always the one that runs first. Each ``next()`` is
    timed with this thread's CPU clock (``time.thread_time``): a
    worker-less loader does all its work in this thread, and time the
    scheduler gives other jobs is not counted. The batch is released before
    the clock is read, so its clean-up is its own loader's.
    """
    spent = {m: 0.0 for m in modes}
    taken = {m: 0 for m in modes}
    for pair in range(pairs):
        for mode in modes if pair % 2 == 0 else modes[::-1]:
            start = time.thread_time()
            taken[mode] += samples(next(iterators[mode]))
            spent[mode] += time.thread_time() - start
    return {m: spent[m] / taken[m] for m in modes}


class _Recorder:
    """Stands in for the monitor a timed iterator reports to, and keeps
    what it receives."""

    def __init__(self, monitor: DataLoaderMonitor) -> None:
        self.monitor, self.recorded = monitor, []
        self.add_trainer_stages = monitor.add_trainer_stages

    def _on_batch(self, requested, received, record) -> None:
        self.recorded.append((requested, received, record))
        self.monitor._on_batch(requested, received, record)


def record_batches(monitor: DataLoaderMonitor, iterator: Iterator,
                   batches: int) -> List[tuple]:
    """What the monitor receives for the next ``batches`` batches of the
    timed ``iterator`` (after the measured rounds: recording is not the
    monitor's cost)."""
    recorder = iterator._monitor = _Recorder(monitor)
    take(iterator, batches)
    iterator._monitor = monitor
    return recorder.recorded


def fetch_paths(build: Callable[[int], DataLoader],
                rounds: int) -> Dict[str, float]:
    """CPU seconds of a batch's fetch per sample: plain, and what an
    untimed batch (the sampled monitor's usual path) and a timed batch add.

    Each batch of indices (the loader's batch size, as torch's fetcher asks
    for them) is fetched the three ways one after the other, in an order
    that rotates from batch to batch; the additions are the medians of the
    per-batch differences: a paired measurement, which other jobs on the
    machine disturb far less than separate passes. The plain path reads a
    second dataset built from the same config (switching one dataset's
    class back and forth would cost the plain path the interpreter's
    attribute caches), and every fetch is timed with this thread's CPU
    clock.
    """
    plain_dataset = build(0).dataset
    loader = build(0)
    dataset = loader.dataset
    size, batch_size = len(dataset), loader.batch_size
    batches = rounds * max(1, 160 // batch_size)
    instrumentation = LoaderInstrumentation(loader)
    instrumentation.install()
    plan = instrumentation.plan

    def fetch(path: str, indices: List[int]) -> float:
        ACCUMULATOR.timing = path == 'timed'
        plan.apply(ACCUMULATOR.timing)
        began = time.thread_time()
        if path == 'plain':  # what torch's fetcher does
            getitems = getattr(plain_dataset, '__getitems__', None)
            getitems(indices) if getitems else [
                plain_dataset[i] for i in indices
            ]
        else:
            dataset.__getitems__(indices)
        spent = time.thread_time() - began
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


def monitor_calls(build: Callable[[int], DataLoader]) -> Dict[str, int]:
    """Calls into the monitor's code (its Python functions and the builtins
    they call) while a worker-less monitored loader yields a timed batch
    and the untimed one after it: a count, which no other job on the
    machine changes. (The untimed batch before a timed one also puts the
    timed transform lists and the probes in.)"""
    loader = build(0)
    calls = {}
    with DataLoaderMonitor(loader, warmup_iters=0, sample_every=4):
        batches = iter(loader)
        take(batches, 3)  # past the start-up batch
        while not ACCUMULATOR.timing:
            next(batches)
        for kind in ('timed', 'untimed'):
            _, counter = count_calls(lambda: next(batches), MONITOR_CODE)
            calls[kind] = sum(counter.values())
    return calls


class Indices:
    """A dataset whose samples cost nothing: its index."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> int:
        return index


def per_batch_floor(batch_size: int, rounds: int) -> float:
    """CPU seconds the monitor adds per batch when samples cost nothing
    (median over rounds of 500 batch pairs, :func:`paired_round`): its own
    code, with the CPU caches as warm as they get. A real pipeline's work
    between batches cools them, which the in-process figure of that
    pipeline includes."""
    loaders = {
        m: DataLoader(Indices(), batch_size=batch_size, collate_fn=list)
        for m in MODES
    }
    monitor = DataLoaderMonitor(loaders['monitored']).install()
    iterators = {m: iter(loader) for m, loader in loaders.items()}
    try:
        paired_round(iterators, MODES, 500, len)  # warm-up
        per_sample = [
            paired_round(iterators, MODES, 500, len) for _ in range(rounds)
        ]
    finally:
        monitor.uninstall()
    return batch_size * statistics.median(r['monitored'] - r['plain']
                                          for r in per_sample)


class StandInLoop(BaseLoop):
    """What DataMonitorHook reads of a train loop: its ``dataloader``, and
    its ``iter``, a property as in mmengine's loops. The benchmark steps
    it by ``_iter``."""

    def __init__(self, dataloader: DataLoader) -> None:
        self.dataloader = dataloader
        self._iter = 0

    @property
    def iter(self) -> int:
        return self._iter

    def run(self) -> None:
        # (BaseLoop's abstract method: this loop is stepped by the benchmark)
        raise RuntimeError('StandInLoop is stepped by the benchmark, not run')


class StandInRunner(SimpleNamespace):
    """What DataMonitorHook reads of a Runner. Its ``iter`` and
    ``train_loop`` are mmengine's ``Runner`` properties' bodies (0.10.x;
    onedl-mmengine's are the same), so that reading ``runner.iter`` costs
    here what it does in training: the ``train_loop`` property twice,
    three ``isinstance`` checks against ``BaseLoop`` (an abstract class),
    then the loop's own ``iter``.
    """

    @property
    def iter(self) -> int:
        if isinstance(self.train_loop, BaseLoop):
            return self.train_loop.iter
        return 0

    @property
    def train_loop(self) -> BaseLoop:
        if isinstance(self._train_loop, BaseLoop) or self._train_loop is None:
            return self._train_loop
        raise TypeError('the stand-in runner needs a built BaseLoop')


def stand_in_runner(loader: DataLoader,
                    name: str,
                    add_scalars: Callable[..., None],
                    logger: Optional[logging.Logger] = None,
                    log_dir: Optional[str] = None) -> StandInRunner:
    """What DataMonitorHook's ``before_train``, steps and refreshes read of
    a Runner around ``loader``: a :class:`StandInLoop`, a ``LoggerHook``
    of interval 10 (the hook publishes at its log lines), mmengine's
    MessageHub ``name``, a visualizer of ``add_scalars`` only, and the
    ``logger`` and ``log_dir`` that ``before_train`` and the refreshes
    write to (None where neither runs)."""
    return StandInRunner(
        max_iters=10**9,
        logger=logger,
        log_dir=log_dir,
        cfg=Config(),
        hooks=[LoggerHook(interval=10)],
        model=SimpleNamespace(),
        message_hub=MessageHub.get_instance(name),
        visualizer=SimpleNamespace(add_scalars=add_scalars),
        _train_loop=StandInLoop(loader),
        train_dataloader=loader)


def per_step(loader: DataLoader,
             recorded: list,
             hook_args: dict,
             repeat: int = 5) -> float:
    """CPU seconds per training step of DataMonitorHook with ``hook_args``
    (the config's; no table: ``table_interval=0``), the median of
    ``repeat`` replays of the recorded batches, 20 times each.

    The hook runs on a stand-in runner (:func:`stand_in_runner`); its
    private ``_logger``, ``_loop`` / ``_forget_log_scalars``, the
    monitor's books on a report writer's thread (``book_on``, counted:
    process CPU time, the writer flushed) and the monitor's ``_on_batch``
    are what ``before_train`` and the DataLoader iterator would do: a
    benchmark-only shortcut around a whole Runner. Its visualizer does
    nothing: the timeline's points cost what the backends do, which the
    steady state measures.
    """
    steps = recorded * 20
    runs = []
    for _ in range(repeat):
        hook = DataMonitorHook(**dict(
            hook_args, warmup_iters=0, settle_iters=0, table_interval=0))
        hook.monitor = DataLoaderMonitor(loader, **hook.monitor_args)
        runner = stand_in_runner(loader, 'benchmark_monitor',
                                 lambda *a, **k: None)
        hook._logger = runner.hooks[0]
        loop = hook._loop = runner.train_loop
        hook._forget_log_scalars(runner)
        writer = ReportWriter()
        hook.monitor.book_on(writer.submit)
        offset = 0.0
        start = time.process_time()
        for index, (requested, received, rec) in enumerate(steps):
            loop._iter = index
            if index % len(recorded) == 0:
                offset = index  # keep the replayed clock moving forward
            hook.monitor._on_batch(requested + offset, received + offset,
                                   rec)
            hook.before_train_iter(runner, index)
            hook.after_train_iter(runner, index)
        writer.flush()
        runs.append((time.process_time() - start) / len(steps))
        writer.close()
    return statistics.median(runs)


def cold_step(hook_args: dict, batch_size: int,
              args) -> Dict[str, Tuple[float, float]]:
    """CPU time of DataMonitorHook's two calls of a step (``hook_args``,
    no table) with the CPU caches cold as in training, and of mmengine's
    ``Hook`` (whose calls do nothing) the same way, by hook (``monitor``,
    ``nothing``): the median over ``--cold-steps`` steps (a step without
    periodic work), and the mean over each :data:`COLD_GROUP` of them,
    median of the groups (amortised).

    ``--sweep-mb`` are swept before each batch is taken (what the
    pipeline, or the model step before, does) and between the two calls
    (the model step): the hook's code and data come back from memory at
    each call, which timing the calls back to back hides
    (:func:`per_step`); the batch's record, made as it is taken, is warm.
    The thread's CPU time, not wall time: the steps are booked on the
    report writer's thread meanwhile, whose turns with the GIL are not the
    calls' cost. Zero-cost samples (``batch_size`` of them a batch), a
    stand-in runner as in :func:`steady_state` with a visualizer that does
    nothing, ``--steady-warmup`` warm steps first.
    """
    loaders = {
        name: DataLoader(Indices(), batch_size=batch_size, collate_fn=list)
        for name in ('monitor', 'nothing')
    }
    log_dir = tempfile.mkdtemp(prefix='benchmark_monitor_cold_')
    logger = logging.getLogger('benchmark_monitor_cold')
    logger.propagate = False
    runner = stand_in_runner(loaders['monitor'], 'benchmark_monitor_cold',
                             lambda *a, **k: None, logger, log_dir)
    loop = runner.train_loop
    hooks = dict(
        monitor=DataMonitorHook(
            **dict(hook_args, table_interval=0, plot=False)),
        nothing=Hook())
    spent = {name: [] for name in hooks}

    def step(cold: bool) -> None:
        for name, hook in hooks.items():
            if cold:
                sweep[::64] += 1  # a cache line each
            batch = next(batches[name])
            start = time.thread_time()
            hook.before_train_iter(runner, loop.iter, batch)
            spent_before = time.thread_time() - start
            if cold:
                sweep[::64] += 1
            start = time.thread_time()
            hook.after_train_iter(runner, loop.iter, batch)
            if cold:
                spent[name].append(spent_before + time.thread_time() -
                                   start)
        loop._iter += 1

    hooks['monitor'].before_train(runner)
    try:
        sweep = np.zeros(args.sweep_mb << 20, dtype=np.uint8)
        batches = {name: iter(loader) for name, loader in loaders.items()}
        for _ in range(args.steady_warmup):
            step(cold=False)
        for _ in range(args.cold_steps):
            step(cold=True)
    finally:
        hooks['monitor'].after_train(runner)
        shutil.rmtree(log_dir, ignore_errors=True)
    # Per hook: the median step, and the mean over groups of steps (a log
    # line's scalars every 10 of them), median of the groups.
    return {
        name: (statistics.median(times),
               statistics.median(
                   sum(times[first:first + COLD_GROUP]) / COLD_GROUP
                   for first in range(0,
                                      len(times) - COLD_GROUP + 1,
                                      COLD_GROUP)))
        for name, times in spent.items()
    }


def steady_state(build: Callable[[int], DataLoader], hook_args: dict,
                 visualizer: dict, args) -> dict:
    """What DataMonitorHook with ``hook_args`` (tables and JSON refreshes
    included, no PNG) costs once the timed batches have thinned out.

    One hook on one long-lived worker-less loader, called around every
    batch as a training loop calls it, on a stand-in runner (what
    ``before_train`` and the refreshes read of a Runner; the log goes to a
    file), is read past the sampling ramp; then chunks alternate with a
    plain loader on the same samples (plain, monitored, monitored, plain
    per round). A monitored chunk ends when the report writer has done
    what the chunk handed it (the hook's private ``_writer``: a
    benchmark-only shortcut, as is its count of refreshes handed over,
    ``_submitted``), so the process CPU time of the chunk (every
    thread: no DataLoader workers) holds the whole cost, amortised over
    the run as over the chunks: (monitored - plain) summed over the
    rounds, per sample. Also the longest single ``after_train_iter`` call
    (wall time) after the ramp, the longest that refreshed, and the
    garbage collections in the plain and the monitored chunks. Then the
    hook's own accounting (the thread CPU time inside its calls and its
    writer thread's CPU time) over ``--steady-seconds`` of monitored
    batches read without a break: the hook spaces its refreshes and
    hand-overs in seconds, which the plain chunks would add to. The
    timeline's points go to a real ``visualizer`` (its files in a
    temporary directory), as in training, whose backends' share of the
    hook's calls is counted apart.
    """
    loaders = {m: build(0) for m in MODES}
    hook = DataMonitorHook(**dict(hook_args, plot=False))
    log_dir = tempfile.mkdtemp(prefix='benchmark_monitor_')
    logger = logging.getLogger('benchmark_monitor_steady')
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(osp.join(log_dir, 'train.log'))
    logger.addHandler(handler)
    # (a copy: a Visualizer takes its backends' names and directories out
    # of the configs it is given)
    backends = VISUALIZERS.build(
        dict(
            copy.deepcopy(visualizer),
            name=osp.basename(log_dir),
            save_dir=log_dir))
    backends_cpu = [0.0]

    def add_scalars(*call_args, **call_kwargs) -> None:
        start = time.thread_time()
        backends.add_scalars(*call_args, **call_kwargs)
        backends_cpu[0] += time.thread_time() - start

    runner = stand_in_runner(loaders['monitored'], 'benchmark_monitor_steady',
                             add_scalars, logger, log_dir)
    loop = runner.train_loop
    hook.before_train(runner)
    longest = dict(
        before=0.0, before_cpu=0.0, call=0.0, refresh=0.0, refresh_cpu=0.0)
    # The hook's CPU time and the clock's own cost inside each reading of
    # it (a system call, cold after the pipeline's work), measured beside
    # it and subtracted.
    hook_cpu, clock_cpu = [0.0], [0.0]

    def hooked(iterator: Iterator) -> Iterator:
        while True:
            batch = next(iterator)
            index, submitted = loop.iter, hook._submitted
            cpu, start = time.thread_time(), time.perf_counter()
            hook.before_train_iter(runner, index, batch)
            spent = time.perf_counter() - start
            if spent > longest['before']:
                longest.update(
                    before=spent, before_cpu=time.thread_time() - cpu)
            # (the clock read only where a refresh may come)
            call_cpu = time.thread_time() if hook.table_interval and (
                index + 1) % hook.table_interval == 0 else 0.0
            start = time.perf_counter()
            hook.after_train_iter(runner, index, batch)
            spent = time.perf_counter() - start
            clock = time.thread_time()
            hook_cpu[0] += clock - cpu
            clock_cpu[0] += time.thread_time() - clock
            longest['call'] = max(longest['call'], spent)
            if hook._submitted != submitted and spent > longest['refresh']:
                # Its own CPU time, apart from waiting (for the GIL).
                longest.update(refresh=spent, refresh_cpu=clock - call_cpu)
            loop._iter += 1
            yield batch

    iterators = dict(
        plain=iter(loaders['plain']),
        monitored=hooked(iter(loaders['monitored'])))
    collections = GarbageCollections()
    try:
        take(iterators['plain'], args.warmup)
        every = settle_sampling(iterators['monitored'], args.steady_warmup)
        hook._writer.flush()
        longest.update(dict.fromkeys(longest, 0.0))
        writer_clock = time.pthread_getcpuclockid(hook._writer.thread.ident)
        refreshes = hook._submitted
        cpu = {m: [] for m in MODES}
        wall = {m: 0.0 for m in MODES}
        samples = {m: 0 for m in MODES}
        for _ in range(args.steady_rounds):
            spent = {m: 0.0 for m in MODES}
            for mode in ROUND:
                start, clock = time.process_time(), time.perf_counter()
                collections.mode = mode
                samples[mode] += take(iterators[mode], args.steady_batches)
                if mode == 'monitored':
                    hook._writer.flush()
                collections.mode = None
                spent[mode] += time.process_time() - start
                wall[mode] += time.perf_counter() - clock
            for mode in MODES:
                cpu[mode].append(spent[mode])
        refreshes = hook._submitted - refreshes
        # The accounting, over one uninterrupted monitored stretch: the
        # hook spaces its refreshes and hand-overs in seconds, and in the
        # rounds above the plain chunks' seconds count as the monitored
        # steps', which doubled its refreshes per monitored sample. (The
        # steps not booked when it starts are booked in it, those not
        # booked when it ends are not: alike, on average.)
        hook_cpu[0] = clock_cpu[0] = backends_cpu[0] = 0.0
        writer_cpu = time.clock_gettime(writer_clock)
        stretch = dict(refreshes=hook._submitted, samples=0)
        start = time.perf_counter()
        while True:
            stretch['samples'] += take(iterators['monitored'],
                                       args.steady_batches)
            if time.perf_counter() - start >= args.steady_seconds:
                break
        hook._writer.flush()
        writer_cpu = time.clock_gettime(writer_clock) - writer_cpu
        stretch['refreshes'] = hook._submitted - stretch['refreshes']
    finally:
        collections.close()
        hook.after_train(runner)
        backends.close()
        logger.removeHandler(handler)
        handler.close()
        shutil.rmtree(log_dir, ignore_errors=True)
    per_round = [(m - p) / (2 * args.steady_batches * loaders['plain'].
                            batch_size)
                 for m, p in zip(cpu['monitored'], cpu['plain'])]
    return dict(
        every=every,
        refreshes=refreshes,
        batches=samples['monitored'] // loaders['plain'].batch_size,
        plain_us=1e6 * sum(cpu['plain']) / samples['plain'],
        cpu_us=1e6 * (sum(cpu['monitored']) / samples['monitored'] -
                      sum(cpu['plain']) / samples['plain']),
        spread=quartiles([1e6 * c for c in per_round], '{:+.2f}'),
        stretch_batches=stretch['samples'] // loaders['plain'].batch_size,
        stretch_refreshes=stretch['refreshes'],
        hook_us=1e6 * (hook_cpu[0] - clock_cpu[0]) / stretch['samples'],
        visualizer_us=1e6 * backends_cpu[0] / stretch['samples'],
        clock_us=1e6 * clock_cpu[0] / stretch['samples'],
        writer_us=1e6 * writer_cpu / stretch['samples'],
        wall_us=1e6 * (wall['monitored'] / samples['monitored'] -
                       wall['plain'] / samples['plain']),
        longest_ms=1e3 * longest['call'],
        longest_before_ms=1e3 * longest['before'],
        longest_before_cpu_ms=1e3 * longest['before_cpu'],
        refresh_ms=1e3 * longest['refresh'],
        refresh_cpu_ms=1e3 * longest['refresh_cpu'],
        collections=collections.summary())


class GarbageCollections:
    """Python's garbage collections (count, milliseconds) while ``mode``
    is set, by mode: what is held between steps shows there, in whatever
    code allocated next (the pipeline's, mostly), not in the hook's calls.
    A monitored chunk ends when the writer is done, so its collections on
    the writer's thread count there too.
    """

    def __init__(self) -> None:
        self.mode: Optional[str] = None
        self.seen = {m: [0, 0.0] for m in MODES}
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == 'start':
            self._started = time.perf_counter()
        elif self.mode is not None:
            seen = self.seen[self.mode]
            seen[0] += 1
            seen[1] += 1e3 * (time.perf_counter() - self._started)

    def close(self) -> None:
        gc.callbacks.remove(self._on_collection)

    def summary(self) -> str:
        return ', '.join(f'{mode} {count} ({ms:.1f} ms)'
                         for mode, (count, ms) in self.seen.items())


def measure(name: str, build: Callable[[int], DataLoader], hook_args: dict,
            visualizer: dict, args) -> dict:
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
        calls = monitor_calls(build)
        print("  the monitor's calls (its functions and the builtins they "
              f"call) per batch: untimed {calls['untimed']}, timed "
              f"{calls['timed']}")
        paths = fetch_paths(build, args.process_rounds)
        print('  batch fetch per sample, CPU: plain '
              f"{1e6 * paths['plain']:.1f} us; in an untimed batch "
              f"{1e6 * (paths['untimed'] - paths['plain']):+.2f} us, in a "
              f"timed batch {1e6 * (paths['timed'] - paths['plain']):+.2f}"
              ' us')
        floor = per_batch_floor(probe.batch_size, args.process_rounds)
        print(f'  monitor per batch of zero-cost samples: {1e6 * floor:.2f} '
              f'us CPU ({1e6 * floor / probe.batch_size:.2f} us per sample '
              f'at batch {probe.batch_size})')
        costs = in_process(build, args)
        # Accounted: an untimed batch runs the monitor once per batch (the
        # call count above does not grow with the batch; a test checks it),
        # which the zero-cost floor measures; one batch in K adds the timed
        # fetch's cost.
        timed = (paths['timed'] - paths['untimed']) / costs['every']
        accounted = floor / probe.batch_size + timed
        print(f"  monitor per sample, accounted (K={costs['every']}): "
              f'{1e6 * accounted:.2f} us = per batch '
              f'{1e6 * floor / probe.batch_size:.2f} + timed batch '
              f'{1e6 * timed:.2f}')
        print(f'  monitor per sample, measured in one process, '
              f'{args.process_rounds} rounds of K={costs["every"]} batch '
              f"pairs: {1e6 * costs['cost']:+.2f} us of "
              f"{1e6 * costs['plain']:.1f} us (IQR {costs['spread']} us); "
              f"two plain loaders the same way: {1e6 * costs['noise']:+.2f} "
              f"us (IQR {costs['noise_spread']} us)")
        row.update(
            every=costs['every'],
            accounted_us=1e6 * accounted,
            floor_us=1e6 * floor,
            sample_us=1e6 * costs['plain'],
            cost_us=1e6 * costs['cost'],
            cost_spread=costs['spread'],
            noise_us=1e6 * costs['noise'],
            step_us=1e6 * per_step(probe, costs['records'], hook_args))
        shown = ', '.join(f'{key}={value!r}'
                          for key, value in hook_args.items()
                          if key != 'table_interval')
        print(f'  per step in the training process, DataMonitorHook({shown})'
              f" without its tables: {row['step_us']:.1f} us CPU")
    if args.steady_rounds:
        steady = steady_state(build, hook_args, visualizer, args)
        shown = ', '.join(f'{key}={value!r}'
                          for key, value in hook_args.items())
        print(f'  steady state, DataMonitorHook({shown}) past the sampling '
              f"ramp (K={steady['every']}), {args.steady_rounds} rounds of "
              f"{args.steady_batches}-batch chunks, {steady['batches']} "
              f"monitored batches, {steady['refreshes']} refreshes: "
              f"{steady['cpu_us']:+.2f} us CPU per sample of "
              f"{steady['plain_us']:.1f} us (IQR of the rounds "
              f"{steady['spread']} us), wall {steady['wall_us']:+.2f} us; "
              f"longest after_train_iter {steady['longest_ms']:.3f} ms, "
              f"longest refreshing one {steady['refresh_ms']:.3f} ms "
              f"({steady['refresh_cpu_ms']:.3f} ms of its thread's CPU), "
              "longest before_train_iter (it sends the timeline's points) "
              f"{steady['longest_before_ms']:.3f} ms "
              f"({steady['longest_before_cpu_ms']:.3f} ms of its thread's "
              "CPU); "
              f"garbage collections: {steady['collections']}")
        print(f"  steady state accounted, {args.steady_seconds:g} s "
              f"uninterrupted ({steady['stretch_batches']} batches, "
              f"{steady['stretch_refreshes']} refreshes): the hook's calls "
              f"{steady['hook_us']:.2f} us (of which the visualizer's "
              f"backends {steady['visualizer_us']:.2f} us; the clock's own "
              f"{steady['clock_us']:.2f} us subtracted) + its writer thread "
              f"{steady['writer_us']:.2f} us = "
              f"{steady['hook_us'] + steady['writer_us']:.2f} us CPU per "
              'sample')
        row.update(steady_us=steady['cpu_us'],
                   steady_accounted_us=steady['hook_us'] +
                   steady['writer_us'],
                   longest_ms=steady['longest_ms'])
    if args.cold_steps:
        # (after the steady state, which so runs in the process as it did
        # before this measurement existed)
        cold = cold_step(hook_args, probe.batch_size, args)
        (step, group), (nothing, nothing_group) = cold['monitor'], cold[
            'nothing']
        amortised = 1e6 * (group - nothing_group)
        print(f'  per step with cold caches ({args.sweep_mb} MB swept before '
              f'each call; {args.cold_steps} steps), CPU: DataMonitorHook '
              f"{1e6 * step:.1f} us, mmengine's Hook (its calls do nothing) "
              f'{1e6 * nothing:.1f} us in the median step: '
              f'{1e6 * (step - nothing):+.1f} us; amortised (steps in groups '
              f'of {COLD_GROUP}, the median group) {1e6 * group:.1f} and '
              f'{1e6 * nothing_group:.1f} us: {amortised:+.1f} us a step, '
              f'{amortised / probe.batch_size:+.2f} us per sample at batch '
              f'{probe.batch_size}')
    return row


def main():
    args = parse_args()
    if args.idle_seconds:
        repeats = 3
        cold, warm = idle_code_cost(args.idle_seconds, repeats)
        print(f'this machine: a small call after {args.idle_seconds:g} s '
              'idle costs '
              f'{1e3 * cold:.3f} ms of CPU, again at once {1e6 * warm:.1f} '
              f'us (median of {repeats}): code untouched for seconds, as a '
              "refresh's, pays the first", flush=True)
    cases = dict(cheap=(cheap_loader, {}, LOCAL_VISUALIZER))
    if 'demo' in args.cases:
        cases['demo'] = config_case(args)
    rows = [measure(case, *cases[case], args) for case in args.cases]
    print('\ncase   throughput ratio (IQR)       CPU ratio  '
          'sample (one process)  monitor per sample: accounted (K)  '
          'measured (IQR)             per batch, zero-cost samples  '
          'per step (training process)  steady state: per sample  '
          'accounted  longest after_train_iter')
    for row in rows:
        cpu = f"{row['cpu']:.3f}" if row['cpu'] is not None else '-'
        line = (f"{row['case']:<6} {row['ratio']:.3f} ({row['spread']}) "
                f">=0.99  {cpu:>7}")
        if 'sample_us' in row:
            line += (f"    {row['sample_us']:>9.1f} us        "
                     f"{row['accounted_us']:>5.2f} us (K={row['every']:<3})"
                     f"            {row['cost_us']:>+5.2f} us "
                     f"({row['cost_spread']} us; plain/plain "
                     f"{row['noise_us']:+.2f} us)   "
                     f"{row['floor_us']:>6.2f} us                  "
                     f"{row['step_us']:>6.1f} us CPU")
        if 'steady_us' in row:
            line += (f"                 {row['steady_us']:>+6.2f} us"
                     f"  {row['steady_accounted_us']:>6.2f} us"
                     f"              {row['longest_ms']:.3f} ms")
        print(line)
    print('Throughput: samples/s per round of interleaved chunks, median and '
          'IQR of the rounds. Monitor per sample, accounted: what the '
          'monitor runs per batch (a count that does not grow with the batch '
          'for untimed ones), timed on zero-cost samples, over the batch '
          'size, plus a timed batch\'s extra fetch cost (paired per batch) '
          'over K: the figure to read on a busy machine. Measured: this '
          'thread\'s CPU time of the whole path in one process, worker-less '
          'loaders taking turns batch by batch, rounds of K batch pairs (one '
          'timed batch each), median of the rounds\' differences: it '
          'includes what the accounting leaves out (CPU caches the monitor '
          'cools), and the noise of the machine: its IQR, and the same '
          'measured between two plain loaders (plain/plain), which differ '
          'by nothing but that noise. Steady state: the whole hook with the '
          'config\'s arguments (tables and JSON refreshes included), past '
          'the sampling ramp, process CPU (all threads) per sample, '
          'monitored minus plain chunks (a difference of two totals: noisy '
          'on a shared machine); accounted: the thread CPU time spent in the '
          'hook\'s before/after_train_iter calls (the timeline\'s points '
          'sent to the config\'s visualizer included) plus the CPU time of '
          'its writer thread, per sample, over --steady-seconds of monitored '
          'batches read without a break (the loader\'s own per-batch '
          'accounting is the "accounted" column); longest '
          'after_train_iter: wall time of one call, refreshes included '
          '(the longest before_train_iter, which sends the timeline\'s '
          'points, is on the steady state\'s line).')

if __name__ == '__main__':
    main()
