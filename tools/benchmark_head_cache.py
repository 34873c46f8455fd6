# Decode once: the cached pipeline head against decoding every epoch.
import argparse
import os
import statistics
import tempfile
import time
from typing import Dict, List

import cv2
import mmcv
from mmcv.transforms import Compose

import mmdata_plugin  # noqa: F401  (registers the package's components)
from mmdata_plugin.cache import format_size
from mmdata_plugin.transforms.decode_target import UNBOUNDED_SIDE
from mmdata_plugin.utils import pixel_difference

from benchmark_decode import write_frames  # noqa: E402 (tools/ sibling)

GOAL = dict(epoch2_speedup=5.0, jpeg_psnr=35.0, epoch1_slowdown=0.10)
VARIANTS = ('a', 'b', 'c', 'd')
LABELS = dict(
    a='(a) LoadImageFromFile + Resize',
    b='(b) reduced decode',
    c='(c) cached head, raw',
    d='(d) cached head, JPEG q95')


def parse_args():
    parser = argparse.ArgumentParser(
        description='Per-sample time of epoch 1 and epoch 2 for (a) '
        'LoadImageFromFile + Resize, (b) the same in ReducedDecodePipeline, '
        '(c) (b) in CachedPipelineHead with raw storage and (d) with JPEG '
        'q95 storage, each followed by the demo\'s RandomImageCrop and '
        'RandomFlip; PSNR against the full decode shrunk by area '
        'averaging; bytes on disk per sample.')
    parser.add_argument(
        '--sets',
        default='3840x2160:8,500x375:48',
        help='image sets WxH:count, comma separated (3840x2160:8,'
        '500x375:48)')
    parser.add_argument('--short-side', type=int, default=224)
    parser.add_argument('--quality', type=int, default=90,
                        help='quality of the source JPEGs (90)')
    parser.add_argument(
        '--repeats', type=int, default=3,
        help='cold+warm epoch pairs per variant, each with an empty cache; '
        'medians are reported (3)')
    parser.add_argument('--work-dir', help='where images and caches go '
                        '(a temporary directory)')
    parser.add_argument(
        '--clock', choices=('cpu', 'wall'), default='cpu',
        help='cpu: process time (what a sample costs a worker; steady on a '
        'shared machine), wall: elapsed time (includes waiting for the disk '
        'and for other processes) (cpu)')
    return parser.parse_args()


def build(variant: str, short: int, cache_dir: str) -> Compose:
    head = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=(short, UNBOUNDED_SIDE), keep_ratio=True)
    ]
    if variant != 'a':
        head = [dict(type='ReducedDecodePipeline', transforms=head)]
    if variant in ('c', 'd'):
        head = [
            dict(type='CachedPipelineHead', transforms=head,
                 cache_dir=cache_dir, cache_limit='20GB',
                 storage='raw' if variant == 'c' else 'jpeg', quality=95)
        ]
    tail = [
        dict(type='RandomImageCrop', crop_size=short),
        dict(type='RandomFlip', prob=0.5, direction='horizontal')
    ]
    return Compose([Compose(head)] + tail)  # transforms[0]: the head


def epoch_ms(pipeline: Compose, paths: List[str], clock) -> float:
    start = clock()
    for index, path in enumerate(paths):
        pipeline(dict(img_path=path, sample_idx=index))
    return (clock() - start) * 1e3 / len(paths)


def measure(paths: List[str], short: int, repeats: int, work_dir: str,
            clock) -> Dict[str, dict]:
    times = {v: dict(epoch1=[], epoch2=[]) for v in VARIANTS}
    rows = {}
    for repeat in range(repeats):
        # rotate the order so no variant always runs first
        for variant in VARIANTS[repeat % 4:] + VARIANTS[:repeat % 4]:
            cache_dir = tempfile.mkdtemp(dir=work_dir)
            pipeline = build(variant, short, cache_dir)
            times[variant]['epoch1'].append(epoch_ms(pipeline, paths, clock))
            times[variant]['epoch2'].append(epoch_ms(pipeline, paths, clock))
            rows[variant] = dict(pipeline=pipeline)
    for variant in VARIANTS:
        head = rows[variant]['pipeline'].transforms[0]
        psnr, stored = [], 0
        for index, path in enumerate(paths):
            out = head(dict(img_path=path, sample_idx=index))['img']
            ideal = cv2.resize(mmcv.imread(path), out.shape[1::-1],
                               interpolation=cv2.INTER_AREA)
            psnr.append(pixel_difference(out, ideal).psnr)
        cached = head.transforms[0]
        if hasattr(cached, 'store'):
            stored = cached.store.usage().committed_bytes / len(paths)
        rows[variant] = dict(
            epoch1=statistics.median(times[variant]['epoch1']),
            epoch2=statistics.median(times[variant]['epoch2']),
            psnr=statistics.median(psnr),
            bytes=stored)
    return rows


def print_table(title: str, rows: Dict[str, dict], file_bytes: float):
    print(title)
    print(f'{"variant":<32}{"epoch 1":>10}{"epoch 2":>10}{"ep2 vs (a)":>12}'
          f'{"ep1 vs (b)":>12}{"PSNR dB":>9}{"bytes/sample":>20}')
    a, b = rows['a'], rows['b']
    for variant in VARIANTS:
        row = rows[variant]
        stored = format_size(row['bytes']) if row['bytes'] else (
            f'{format_size(file_bytes)} (JPEG)')
        print(f'{LABELS[variant]:<32}{row["epoch1"]:>8.2f}ms'
              f'{row["epoch2"]:>8.2f}ms{a["epoch2"] / row["epoch2"]:>11.1f}x'
              f'{100 * (row["epoch1"] / b["epoch1"] - 1):>+11.0f}%'
              f'{row["psnr"]:>9.1f}{stored:>20}')


def print_goal(rows: Dict[str, dict]) -> None:
    a, b, c, d = (rows[v] for v in VARIANTS)
    fast = min(a['epoch2'] / c['epoch2'], a['epoch2'] / d['epoch2'])
    met1 = (fast >= GOAL['epoch2_speedup']
            and d['psnr'] >= GOAL['jpeg_psnr'])
    slow = max(c['epoch1'], d['epoch1']) / b['epoch1'] - 1
    met2 = slow <= GOAL['epoch1_slowdown']
    print(f'goal: epoch 2 >= {GOAL["epoch2_speedup"]:.0f}x (a) with (d) >= '
          f'{GOAL["jpeg_psnr"]:.0f} dB: (c) {a["epoch2"] / c["epoch2"]:.1f}x,'
          f' (d) {a["epoch2"] / d["epoch2"]:.1f}x at {d["psnr"]:.1f} dB -> '
          f'{"met" if met1 else "missed"}')
    print(f'goal: epoch 1 within {100 * GOAL["epoch1_slowdown"]:.0f}% of (b):'
          f' (c) {100 * (c["epoch1"] / b["epoch1"] - 1):+.0f}%, (d) '
          f'{100 * (d["epoch1"] / b["epoch1"] - 1):+.0f}% -> '
          f'{"met" if met2 else "missed"}')


def main():
    args = parse_args()
    cv2.setNumThreads(1)  # as in a DataLoader worker; CPU time = work done
    with tempfile.TemporaryDirectory(dir=args.work_dir) as work_dir:
        print(f'benchmark_head_cache: short side {args.short_side}, then '
              f'RandomImageCrop({args.short_side}) + RandomFlip; one '
              f'process, {args.repeats} cold/warm epoch pairs per variant '
              f'(medians); {os.cpu_count()} CPUs. PSNR: the head\'s output '
              'vs the full decode shrunk by area averaging (alias-free).')
        for spec in args.sets.split(','):
            size, count = spec.split(':')
            paths = write_frames(work_dir, [size], int(count),
                                 args.quality)[size]
            file_bytes = statistics.mean(os.path.getsize(p) for p in paths)
            clock = (time.process_time
                     if args.clock == 'cpu' else time.perf_counter)
            rows = measure(paths, args.short_side, args.repeats, work_dir,
                           clock)
            print()
            print_table(
                f'{size} photo-like JPEGs, quality {args.quality}, '
                f'{len(paths)} files ({args.clock} ms per sample):', rows,
                file_bytes)
            print_goal(rows)


if __name__ == '__main__':
    main()
