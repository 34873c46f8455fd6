# Resume cost of mmengine's IterBasedTrainLoop vs FastResumeIterBasedTrainLoop.
"""Measure what resuming at iteration N costs, stock loop versus ours.

The demo config (configs/demo/tinycnn_demo-jpeg.py: real JPEGs decoded at
reduced size by LoadImageFromFileReduced, random resize/crop/flip, 2
workers) is trained with each sampler asked for (mmengine's
``InfiniteSampler`` and our ``RankShardedInfiniteSampler`` by default).

Every run resumes from a real checkpoint, the way ``tools/train.py
--resume`` does: a first process builds the runner with the loop, puts the
loop at iteration N -- the fast-resume loop's data position advanced by N
batches, exactly as training N iterations leaves it -- and saves a
checkpoint with ``Runner.save_checkpoint`` (so the fast-resume loop's
``meta['data_position']`` is written by its own hook); a fresh process then
resumes from it (``resume=True``, ``load_from``) and is timed from the
loop's construction (mmengine's loop starts its workers there) to the first
``before_train_iter``; model, optimizer and checkpoint loading excluded.

Two metrics:

* **resume overhead**: the time spent advancing the data stream. Stock: its
  per-iteration slope x N (a least-squares line over the time to the first
  batch at a few small N; the slope excludes the N = 0 intercept). Ours: the
  positioning time the loop reports (``loop.resume_report.seconds``).
* **time to the first batch**: end to end, worker start-up and one batch
  included on both sides. Stock at the target N is EXTRAPOLATED from the
  small N (intercept + slope x N).

Ours is also measured resuming the stock loop's checkpoint at the target N
(position derived from ``meta.iter``), and at N = 1e6 iterations of batch 32
over a 1.28e6-sample dataset (``RepeatDataset`` of the demo set). Each
figure is the median over ``--repeats`` fresh processes. Usage:

    python tools/benchmark_resume.py            # writes demo data to a tmp dir
    python tools/benchmark_resume.py --data-root data/demo --repeats 5 \\
        --samplers RankShardedInfiniteSampler
"""
import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(ROOT, 'configs', 'demo', 'tinycnn_demo-jpeg.py')
STOCK, OURS = 'IterBasedTrainLoop', 'FastResumeIterBasedTrainLoop'
SAMPLERS = ('InfiniteSampler', 'RankShardedInfiniteSampler')
# Strategies that position the stream without replaying indices.
DIRECT_STRATEGIES = ('infinite', 'fast_forward')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--data-root',
        help='demo data (tools/make_demo_data.py); default: written to a '
        'temporary directory')
    parser.add_argument(
        '--samplers',
        nargs='+',
        choices=SAMPLERS,
        default=list(SAMPLERS),
        help='train samplers to measure (default: both)')
    parser.add_argument('--num-workers', type=int, default=2)
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument(
        '--stock-iters',
        type=int,
        nargs='+',
        default=[0, 25, 50, 100],
        help='N at which the stock loop is measured (at least two)')
    parser.add_argument('--target-iters', type=int, default=10_000)
    parser.add_argument('--big-iters', type=int, default=1_000_000)
    parser.add_argument('--big-batch-size', type=int, default=32)
    parser.add_argument('--big-dataset-size', type=int, default=1_280_000)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--child', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if len(set(args.stock_iters)) < 2:
        parser.error('--stock-iters needs at least two different N')
    return args


# ------------------------------------------------------------ child side
def build_runner(spec: dict):
    """The demo runner for ``spec`` (loop, sampler, sizes)."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    import mmdata_plugin  # noqa: F401

    cfg = Config.fromfile(CONFIG)
    cfg.work_dir = spec['work_dir']
    # Runners of one process (tests) must not share a logger/message hub.
    cfg.experiment_name = f'benchmark_resume_{time.time_ns()}'
    cfg.log_level = 'WARNING'
    # The loops alone: no data monitor restarting workers.
    cfg.custom_hooks = []
    cfg.train_cfg = dict(
        type=spec['loop'], max_iters=spec['iters'] + 1, val_begin=2**62)
    loader = cfg.train_dataloader
    loader.batch_size = spec['batch_size']
    loader.num_workers = spec['num_workers']
    loader.persistent_workers = spec['num_workers'] > 0
    loader.sampler = dict(type=spec['sampler'], shuffle=True)
    if spec.get('dataset_size'):
        annotations = osp.join(loader.dataset.data_root,
                               loader.dataset.ann_file)
        with open(annotations) as f:
            demo_size = sum(1 for line in f if line.strip())
        loader.dataset = dict(
            type='RepeatDataset',
            times=-(-spec['dataset_size'] // demo_size),
            dataset=loader.dataset)
    if spec.get('checkpoint'):
        cfg.resume = True
        cfg.load_from = spec['checkpoint']
    return Runner.from_cfg(cfg)


class _Done(Exception):
    """Stops ``runner.train()`` once a child has what it came for."""


def write_checkpoints(spec: dict) -> dict:
    """Save the checkpoints a run of ``spec['loop']`` writes at each N."""
    from mmengine.hooks import Hook

    class AtIterations(Hook):
        priority = 'VERY_LOW'

        def before_train(self, runner):
            # Everything is built (optimizer included): save as training
            # would have at each iteration N.
            loop = runner.train_loop
            resumer = getattr(loop, 'data_resumer', None)
            for iters, path in sorted(spec['checkpoints'].items()):
                iters = int(iters)
                if resumer is not None:
                    while resumer.position.iteration < iters:
                        resumer.position.advance()
                loop._iter = iters
                runner.save_checkpoint(
                    osp.dirname(path),
                    osp.basename(path),
                    meta=dict(iter=iters, epoch=0),
                    by_epoch=False)
            raise _Done

    runner = build_runner(
        dict(spec, iters=max(map(int, spec['checkpoints']))))
    runner.register_hook(AtIterations())
    try:
        runner.train()
    except _Done:
        pass
    return spec['checkpoints']


def measure(spec: dict) -> dict:
    """Resume from ``spec['checkpoint']`` and time it, in this process."""
    from mmengine.hooks import Hook

    class Clock(Hook):
        priority = 'VERY_HIGH'

        def after_load_checkpoint(self, runner, checkpoint):
            self.data_position = 'data_position' in checkpoint.get(
                'meta', {})

        def before_train(self, runner):
            self.start = time.perf_counter()

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            self.first_batch = time.perf_counter()
            raise _Done

    runner = build_runner(spec)
    clock = Clock()
    runner.register_hook(clock)
    start = time.perf_counter()
    runner._train_loop = runner.build_train_loop(runner._train_loop)
    build = time.perf_counter() - start
    try:
        runner.train()
    except _Done:
        pass
    if runner.iter != spec['iters']:
        raise RuntimeError(f'resumed at iteration {runner.iter}, expected '
                           f'{spec["iters"]}')
    report = getattr(runner.train_loop, 'resume_report', None)
    result = dict(
        seconds=build + clock.first_batch - clock.start,
        data_position=clock.data_position,
        dataset_size=len(runner.train_loop.dataloader.dataset))
    if report is not None:
        if report.strategy not in DIRECT_STRATEGIES:
            raise RuntimeError(
                f'the fast-resume loop positioned the stream by '
                f'{report.strategy!r}, not directly; this is no measurement '
                'of the fast path')
        result.update(positioning=report.seconds, strategy=report.strategy)
    return result


def child_main(spec: dict) -> None:
    action = write_checkpoints if spec['action'] == 'write' else measure
    print('RESULT ' + json.dumps(action(spec)), flush=True)
    # Skip interpreter teardown (DataLoader workers shut down slowly).
    os._exit(0)


# ----------------------------------------------------------- parent side
class Bench:
    """Runs the children and keeps their checkpoints, one per setting."""

    def __init__(self, args, data_root: str, tmp: str) -> None:
        self.args = args
        self.data_root = data_root
        self.tmp = tmp
        self.checkpoints = {}

    def _run_child(self, spec: dict) -> dict:
        from mmdata_plugin.testing import python_path
        env = dict(
            os.environ,
            MMDATA_DEMO_ROOT=self.data_root,
            PYTHONPATH=python_path(ROOT))
        out = subprocess.run(
            [sys.executable, __file__, '--child',
             json.dumps(spec)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True)
        for line in out.stdout.splitlines():
            if line.startswith('RESULT '):
                return json.loads(line[len('RESULT '):])
        raise RuntimeError(f'{spec} failed:\n{out.stdout[-5000:]}')

    def _spec(self, loop, sampler, iters, **extra) -> dict:
        spec = dict(
            loop=loop,
            sampler=sampler,
            iters=iters,
            work_dir=osp.join(self.tmp, 'work'),
            batch_size=self.args.batch_size,
            num_workers=self.args.num_workers)
        spec.update(extra)
        return spec

    def write(self, writer: str, sampler: str, iters: list, **extra) -> None:
        """Checkpoints of a ``writer`` loop at each N, one process."""
        paths = {}
        for n in iters:
            key = json.dumps([writer, sampler, n, extra], sort_keys=True)
            paths[n] = self.checkpoints[key] = osp.join(
                self.tmp, 'checkpoints', f'{len(self.checkpoints)}.pth')
        self._run_child(
            self._spec(
                writer,
                sampler,
                max(iters),
                action='write',
                checkpoints=paths,
                **extra))

    def median(self, label: str, loop: str, sampler: str, iters: int,
               writer: str, **extra) -> dict:
        path = self.checkpoints[json.dumps([writer, sampler, iters, extra],
                                           sort_keys=True)]
        spec = self._spec(
            loop, sampler, iters, action='measure', checkpoint=path, **extra)
        runs = [self._run_child(spec) for _ in range(self.args.repeats)]
        if runs[0]['data_position'] != (writer == OURS):
            raise RuntimeError(f'{label}: unexpected checkpoint kind')
        seconds = [r['seconds'] for r in runs]
        result = dict(
            runs[0], seconds=statistics.median(seconds), all=seconds)
        line = (f'  {label:<44} N={iters:<8} first batch '
                f'{result["seconds"]:7.3f} s  (runs: '
                f'{", ".join(f"{s:.3f}" for s in seconds)})')
        if 'positioning' in runs[0]:
            result['positioning'] = statistics.median(
                r['positioning'] for r in runs)
            line += (f'  positioning {1e3 * result["positioning"]:.3f} ms '
                     f'({result["strategy"]})')
        print(line, flush=True)
        return result


def fit_line(points):
    """Least-squares ``seconds = a + b * N``."""
    xs, ys = zip(*points)
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum(
        (x - mean_x)**2 for x in xs)
    return mean_y - slope * mean_x, slope


def bench_sampler(bench: Bench, sampler: str) -> dict:
    args = bench.args
    target = args.target_iters
    print(f'\n{sampler}:', flush=True)
    big_data = dict(
        batch_size=args.big_batch_size, dataset_size=args.big_dataset_size)
    bench.write(STOCK, sampler, args.stock_iters + [target])
    bench.write(OURS, sampler, [target])
    bench.write(OURS, sampler, [args.big_iters], **big_data)
    stock = [(n,
              bench.median('stock loop', STOCK, sampler, n,
                           STOCK)['seconds']) for n in args.stock_iters]
    intercept, slope = fit_line(stock)
    print(f'  stock loop: {1e3 * slope:.2f} ms per skipped iteration, '
          f'{intercept:.3f} s at N=0 (least squares over N={args.stock_iters})',
          flush=True)
    ours = bench.median('ours, own checkpoint (data_position)', OURS,
                        sampler, target, OURS)
    from_stock = bench.median('ours, stock checkpoint (meta.iter)', OURS,
                              sampler, target, STOCK)
    big = bench.median(
        f'ours, own checkpoint, batch {args.big_batch_size}, '
        f'{args.big_dataset_size} samples',
        OURS,
        sampler,
        args.big_iters,
        OURS,
        **big_data)
    return dict(
        sampler=sampler,
        slope=slope,
        intercept=intercept,
        stock_overhead=slope * target,
        stock_first_batch=intercept + slope * target,
        ours=ours,
        from_stock=from_stock,
        big=big)


def print_summary(args, results) -> None:
    target = args.target_iters
    print(f'\nSummary at N={target} (demo JPEG pipeline, batch '
          f'{args.batch_size}, {args.num_workers} workers; medians of '
          f'{args.repeats} fresh processes; stock EXTRAPOLATED from '
          f'N={args.stock_iters}):\n')
    print('| sampler | resume overhead: stock | ours | ratio | '
          'time to first batch: stock | ours | ratio | ours from a stock '
          'checkpoint (overhead / first batch) |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- |')
    for r in results:
        ours, from_stock = r['ours'], r['from_stock']
        print(f'| {r["sampler"]} | {r["stock_overhead"]:.1f} s '
              f'({1e3 * r["slope"]:.2f} ms/iter) | '
              f'{1e3 * ours["positioning"]:.3f} ms | '
              f'{r["stock_overhead"] / ours["positioning"]:,.0f}x | '
              f'{r["stock_first_batch"]:.1f} s | {ours["seconds"]:.2f} s | '
              f'{r["stock_first_batch"] / ours["seconds"]:,.0f}x | '
              f'{1e3 * from_stock["positioning"]:.3f} ms / '
              f'{from_stock["seconds"]:.2f} s |')
    print(f'\nOurs at N={args.big_iters} iterations of batch '
          f'{args.big_batch_size} over {args.big_dataset_size} samples '
          f'({args.big_iters * args.big_batch_size} samples skipped):\n')
    print('| sampler | resume overhead | time to first batch |')
    print('| --- | --- | --- |')
    for r in results:
        big = r['big']
        print(f'| {r["sampler"]} | {1e3 * big["positioning"]:.3f} ms | '
              f'{big["seconds"]:.2f} s |')


def main():
    args = parse_args()
    if args.child:
        child_main(json.loads(args.child))
    with tempfile.TemporaryDirectory() as tmp:
        data_root = args.data_root
        if data_root is None:
            from mmdata_plugin.utils import make_demo_dataset
            data_root = osp.join(tmp, 'demo')
            print(f'Writing the demo data set to {data_root} ...', flush=True)
            make_demo_dataset(data_root)
        bench = Bench(args, data_root, tmp)
        print('Time from building the train loop to the first batch of a run '
              'resumed at iteration N from a real checkpoint (median of '
              f'{args.repeats} fresh processes; shared machines are noisy, '
              'compare within a run):',
              flush=True)
        results = [bench_sampler(bench, s) for s in args.samplers]
        print_summary(args, results)


if __name__ == '__main__':
    main()
