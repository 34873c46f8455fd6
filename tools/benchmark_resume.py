# Resume cost of mmengine's IterBasedTrainLoop vs FastResumeIterBasedTrainLoop.
"""Measure how long a resumed run waits for its first batch.

Each measurement runs in a fresh process: the demo config
(configs/demo/tinycnn_demo-jpeg.py: real JPEGs, random resize/crop/flip,
InfiniteSampler) is built into a Runner, the train loop is told it resumes at
iteration N (what ``Runner.resume`` sets), and the time is taken from the
loop's construction (mmengine's loop starts its workers there) to the first
``before_train_iter`` -- model and optimizer building excluded. For the
fast-resume loop the time the positioning itself took is reported too.

The stock loop loads N batches, so it is measured at a few small N and its
cost at the target N is extrapolated with a least-squares line (said so in
the output). Usage:

    python tools/benchmark_resume.py            # writes demo data to a tmp dir
    python tools/benchmark_resume.py --data-root data/demo --repeats 5
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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--data-root',
        help='demo data (tools/make_demo_data.py); default: written to a '
        'temporary directory')
    parser.add_argument('--num-workers', type=int, default=2)
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument(
        '--stock-iters',
        type=int,
        nargs='+',
        default=[25, 50, 100],
        help='N at which the stock loop is measured')
    parser.add_argument('--target-iters', type=int, default=10_000)
    parser.add_argument('--big-iters', type=int, default=1_000_000)
    parser.add_argument('--big-batch-size', type=int, default=32)
    parser.add_argument('--big-dataset-size', type=int, default=1_280_000)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--measure', help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def measure(spec: dict) -> dict:
    """One measurement, in this (fresh) process."""
    from mmengine.config import Config
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    import mmdata_plugin  # noqa: F401

    class FirstBatch(Exception):
        pass

    class Clock(Hook):
        priority = 'VERY_HIGH'

        def before_run(self, runner):
            runner.train_loop._iter = spec['iters']  # as Runner.resume does

        def before_train(self, runner):
            self.start = time.perf_counter()

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            self.first_batch = time.perf_counter()
            raise FirstBatch

    cfg = Config.fromfile(CONFIG)
    cfg.work_dir = spec['work_dir']
    cfg.log_level = 'WARNING'
    cfg.train_cfg = dict(
        type=spec['loop'], max_iters=spec['iters'] + 1, val_begin=2**62)
    loader = cfg.train_dataloader
    loader.batch_size = spec['batch_size']
    loader.num_workers = spec['num_workers']
    if spec.get('dataset_size'):
        repeats = -(-spec['dataset_size'] // 512)
        loader.dataset = dict(
            type='RepeatDataset', times=repeats, dataset=loader.dataset)
    runner = Runner.from_cfg(cfg)
    clock = Clock()
    runner.register_hook(clock)
    start = time.perf_counter()
    runner._train_loop = runner.build_train_loop(runner._train_loop)
    build = time.perf_counter() - start
    try:
        runner.train()
    except FirstBatch:
        pass
    report = getattr(runner.train_loop, 'resume_report', None)
    return dict(
        seconds=build + clock.first_batch - clock.start,
        positioning=report.seconds if report else None,
        dataset_size=len(runner.train_loop.dataloader.dataset))


def run_child(spec: dict, data_root: str) -> dict:
    env = dict(
        os.environ,
        MMDATA_DEMO_ROOT=data_root,
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]))
    out = subprocess.run(
        [sys.executable, __file__, '--measure',
         json.dumps(spec)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True)
    for line in out.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[len('RESULT '):])
    raise RuntimeError(f'measurement {spec} failed:\n{out.stdout[-5000:]}')


def median_of(args, data_root, work_dir, loop, iters, **extra) -> dict:
    spec = dict(
        loop=loop,
        iters=iters,
        work_dir=work_dir,
        batch_size=args.batch_size,
        num_workers=args.num_workers)
    spec.update(extra)
    runs = [run_child(spec, data_root) for _ in range(args.repeats)]
    seconds = [r['seconds'] for r in runs]
    positioning = [r['positioning'] for r in runs if r['positioning']]
    result = dict(runs[0], seconds=statistics.median(seconds), all=seconds)
    if positioning:
        result['positioning'] = statistics.median(positioning)
    print(f'  {loop:<30} N={iters:<9} median {result["seconds"]:8.3f} s  '
          f'(runs: {", ".join(f"{s:.3f}" for s in seconds)})' +
          (f'  positioning {1e3 * result["positioning"]:.2f} ms'
           if positioning else ''),
          flush=True)
    return result


def fit_line(points):
    """Least-squares ``seconds = a + b * N``."""
    xs, ys = zip(*points)
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum(
        (x - mean_x)**2 for x in xs)
    return mean_y - slope * mean_x, slope


def main():
    args = parse_args()
    if args.measure:
        result = measure(json.loads(args.measure))
        print('RESULT ' + json.dumps(result), flush=True)
        # Skip interpreter teardown (DataLoader workers shut down slowly).
        os._exit(0)
    with tempfile.TemporaryDirectory() as tmp:
        data_root = args.data_root
        if data_root is None:
            from mmdata_plugin.utils import make_demo_dataset
            data_root = osp.join(tmp, 'demo')
            print(f'Writing the demo data set to {data_root} ...', flush=True)
            make_demo_dataset(data_root)
        work_dir = osp.join(tmp, 'work')
        print(f'Time from building the train loop to the first batch of a '
              f'run resumed at iteration N (demo JPEG pipeline, batch '
              f'{args.batch_size}, {args.num_workers} workers, median of '
              f'{args.repeats} fresh processes; shared machines are noisy):',
              flush=True)
        stock = [(n, median_of(args, data_root, work_dir, STOCK, n))
                 for n in args.stock_iters]
        ours = [(n, median_of(args, data_root, work_dir, OURS, n))
                for n in args.stock_iters + [args.target_iters]]
        base, per_iter = fit_line([(n, r['seconds']) for n, r in stock])
        target = args.target_iters
        stock_target = base + per_iter * target
        ours_target = ours[-1][1]
        print(f'\nStock loop: {per_iter * 1e3:.1f} ms per skipped iteration '
              f'(+ {base:.2f} s); at N={target} EXTRAPOLATED from N='
              f'{args.stock_iters}: {stock_target:.0f} s.')
        print(f'Fast resume at N={target}: {ours_target["seconds"]:.3f} s '
              f'to the first batch, of which '
              f'{1e3 * ours_target["positioning"]:.2f} ms positioning.')
        first_batch_ratio = stock_target / ours_target['seconds']
        skip_ratio = (stock_target - base) / ours_target['positioning']
        print(f'Speed-up at N={target}: {first_batch_ratio:.0f}x on the time '
              'to the first batch (worker start-up and one batch included on '
              f'both sides); {skip_ratio:.0f}x on the skipping alone (stock '
              'minus its N=0 intercept vs our positioning).')
        big = median_of(
            args,
            data_root,
            work_dir,
            OURS,
            args.big_iters,
            batch_size=args.big_batch_size,
            dataset_size=args.big_dataset_size)
        print(f'\nFast resume at N={args.big_iters} iterations of batch '
              f'{args.big_batch_size} over {big["dataset_size"]} samples '
              f'({args.big_iters * args.big_batch_size} skipped samples): '
              f'{big["seconds"]:.3f} s to the first batch, '
              f'{big["positioning"]:.3f} s positioning.')


if __name__ == '__main__':
    main()
