# The main job of the README: demo data, an interrupted training, its resume.
import argparse
import glob
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import time

from mmdata_plugin.testing import run_until_checkpoint_then_kill
from mmdata_plugin.utils import make_demo_dataset

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(ROOT, 'configs', 'demo', 'tinycnn_demo-jpeg.py')


def parse_args():
    parser = argparse.ArgumentParser(
        description='Generate the demo data, train the demo config, kill the '
        'run (SIGKILL) after a checkpoint and resume it to the end')
    parser.add_argument('--data-root', default=osp.join(ROOT, 'data', 'demo'))
    parser.add_argument(
        '--work-dir', default=osp.join(ROOT, 'work_dirs', 'demo'))
    parser.add_argument(
        '--kill-after',
        default='iter_150.pth',
        help='checkpoint after which the first run is killed')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch'],
        default='none',
        help='pytorch: run both phases with torchrun on --nproc ranks')
    parser.add_argument('--nproc', type=int, default=2)
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        default=[],
        help='passed on to tools/train.py (key=value pairs)')
    return parser.parse_args()


def banner(text: str) -> None:
    print(f'\n{"=" * 78}\n== {text}\n{"=" * 78}', flush=True)


def train_command(args, *extra):
    script = osp.join(ROOT, 'tools', 'train.py')
    if args.launcher == 'pytorch':
        launch = [
            sys.executable, '-m', 'torch.distributed.run',
            f'--nproc_per_node={args.nproc}', script
        ]
    else:
        launch = [sys.executable, script]
    options = ['--cfg-options', *args.cfg_options] if args.cfg_options else []
    return launch + [
        CONFIG, '--work-dir', args.work_dir, '--launcher', args.launcher,
        *extra, *options
    ]


def scalar_files(work_dir: str) -> list:
    """The scalars.json of each run (killed and resumed), oldest first."""
    return sorted(
        glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))


def last_val_metrics(work_dir: str) -> dict:
    metrics = {}
    for path in scalar_files(work_dir):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if 'cls/top1' in record:
                    metrics = record
    return metrics


def log_lines_with(logs, *markers):
    """The lines of the logs that start with one of ``markers`` (after the
    mmengine prefix), in order."""
    found = []
    for log in logs:
        with open(log, encoding='utf-8') as f:
            for line in f:
                text = line.split(' - mmengine - INFO - ', 1)[-1].strip()
                if text.startswith(markers):
                    found.append(text)
    return found


def main():
    args = parse_args()
    env = dict(os.environ, MMDATA_DEMO_ROOT=args.data_root, PYTHONUNBUFFERED='1')
    start = time.perf_counter()
    if not osp.isfile(osp.join(args.data_root, 'train.txt')):
        banner(f'Writing the demo data set to {args.data_root}')
        make_demo_dataset(args.data_root)
    shutil.rmtree(args.work_dir, ignore_errors=True)

    banner(f'Training; the run is killed (SIGKILL) after {args.kill_after}')
    code = run_until_checkpoint_then_kill(
        train_command(args), args.work_dir, args.kill_after, env=env)
    banner(f'Training killed (exit code {code}). Resuming from the last '
           'checkpoint')
    subprocess.run(train_command(args, '--resume'), env=env, check=True)

    metrics = last_val_metrics(args.work_dir)
    checkpoints = sorted(glob.glob(osp.join(args.work_dir, '*.pth')))
    logs = sorted(glob.glob(osp.join(args.work_dir, '*', '*.log')))
    banner(f'Done in {time.perf_counter() - start:.0f} s. Outputs:')
    print(f'  data set     : {args.data_root}')
    print(f'  work dir     : {args.work_dir}')
    print(f'  checkpoints  : {", ".join(map(osp.basename, checkpoints))}')
    for log in logs:
        print(f'  log          : {log}')
    for scalars in scalar_files(args.work_dir):
        print(f'  scalars      : {scalars}')
    for report in sorted(
            glob.glob(osp.join(args.work_dir, '*', 'data_monitor.*'))):
        print(f'  data monitor : {report}')
    if metrics:
        print(f'  val top-1    : {metrics["cls/top1"]:.1f}% (final)')
    for line in log_lines_with(logs, 'Fast resume:'):
        print(f'  {line}')
    verdicts = log_lines_with(logs[-1:], 'Input-bound:')
    if verdicts:
        print(f'  Data monitor, whole resumed run: {verdicts[-1]}')
    head_cache = log_lines_with(logs[-1:], 'Head cache (')
    if head_cache:
        print(f'  {head_cache[-1]}')


if __name__ == '__main__':
    main()
