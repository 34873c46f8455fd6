# Reduced-size JPEG decoding vs LoadImageFromFile + Resize on camera frames.
import argparse
import os
import os.path as osp
import statistics
import tempfile
import time
from fractions import Fraction
from typing import Dict, List

import cv2
import mmcv
from mmcv.transforms import Compose

import mmdata_plugin  # noqa: F401  (registers the package's components)
from mmdata_plugin.transforms import ReducedDecodePipeline
from mmdata_plugin.transforms.decode_target import UNBOUNDED_SIDE
from mmdata_plugin.transforms.image_decoding import (DECODE_BACKENDS,
                                                     available_backends)
from mmdata_plugin.utils import (camera_like_image, encode_jpeg,
                                 pixel_difference)

GOAL = dict(size='3840x2160', short_side=224, speedup=3.0, psnr=30.0)


def parse_args():
    parser = argparse.ArgumentParser(
        description='Time LoadImageFromFile + Resize against the same '
        'pipeline wrapped in ReducedDecodePipeline on generated camera-like '
        'JPEGs, per decode backend; print the median speed-up and the PSNR '
        'of the reduced path against the full decode')
    parser.add_argument(
        '--sizes',
        default='3840x2160,1920x1080',
        help='frame sizes WxH, comma separated (3840x2160,1920x1080)')
    parser.add_argument(
        '--short-sides',
        default='224,640',
        help='short side after the resize, comma separated (224,640)')
    parser.add_argument(
        '--backends',
        default=','.join(DECODE_BACKENDS),
        help='decode backends; unavailable ones are skipped')
    parser.add_argument(
        '--images', type=int, default=3, help='frames per size (3)')
    parser.add_argument(
        '--repeats', type=int, default=5, help='passes over the frames (5)')
    parser.add_argument('--quality', type=int, default=90)
    parser.add_argument(
        '--interpolation',
        default='bilinear',
        help="the Resize's interpolation (mmcv's default: bilinear)")
    parser.add_argument(
        '--exact-shapes',
        action=argparse.BooleanOptionalAction,
        default=True,
        help='ReducedDecodePipeline(exact_shapes=...): with '
        '--no-exact-shapes frames whose sides do not divide by the decode '
        'scale are reduced too (default: only exact scales)')
    return parser.parse_args()


def write_frames(folder: str, sizes: List[str], count: int,
                 quality: int) -> Dict[str, List[str]]:
    frames = {}
    for size in sizes:
        width, height = (int(side) for side in size.split('x'))
        frames[size] = []
        for seed in range(count):
            path = osp.join(folder, f'{size}_{seed}.jpg')
            with open(path, 'wb') as f:
                f.write(
                    encode_jpeg(
                        camera_like_image(width, height, seed), quality))
            frames[size].append(path)
    return frames


def time_call(pipeline, path: str):
    start = time.perf_counter()
    results = pipeline(dict(img_path=path))
    return time.perf_counter() - start, results


def measure(paths: List[str], baseline, ours, repeats: int) -> dict:
    base_times, our_times = [], []
    outputs = {}
    for repeat in range(repeats):
        for path in paths:
            # Alternate the order so neither path always runs on a warm
            # cache left by the other.
            order = ((baseline, base_times), (ours, our_times))
            for pipeline, times in order[::1 if repeat % 2 else -1]:
                spent, results = time_call(pipeline, path)
                times.append(spent)
                outputs[(path, pipeline is ours)] = results
    psnr_base, psnr_ideal, psnr_base_ideal, scales = [], [], [], set()
    for path in paths:
        full = outputs[(path, False)]
        reduced = outputs[(path, True)]
        if reduced['img'].shape != full['img'].shape:
            raise RuntimeError(
                f'{path}: the reduced path output {reduced["img"].shape}, '
                f'the baseline {full["img"].shape}; ReducedDecodePipeline '
                'must give the same shape (a bug: please report it)')
        psnr_base.append(pixel_difference(reduced['img'], full['img']).psnr)
        # Alias-free reference: the full decode shrunk by area averaging.
        ideal = cv2.resize(
            mmcv.imread(path), full['img'].shape[1::-1],
            interpolation=cv2.INTER_AREA)
        psnr_ideal.append(pixel_difference(reduced['img'], ideal).psnr)
        psnr_base_ideal.append(pixel_difference(full['img'], ideal).psnr)
        loaded = ours.transforms[0](dict(img_path=path))
        scales.add(Fraction(loaded['scale_factor'][0]))
    base, our = statistics.median(base_times), statistics.median(our_times)
    return dict(
        base_ms=base * 1e3,
        ours_ms=our * 1e3,
        speedup=base / our,
        decode_scale=','.join(str(scale) for scale in sorted(scales)),
        psnr=statistics.median(psnr_base),
        psnr_min=min(psnr_base),
        psnr_ideal=statistics.median(psnr_ideal),
        psnr_base_ideal=statistics.median(psnr_base_ideal))


def main():
    args = parse_args()
    sizes = args.sizes.split(',')
    short_sides = [int(side) for side in args.short_sides.split(',')]
    available = available_backends()
    backends = [b for b in args.backends.split(',') if b in available]
    skipped = [b for b in args.backends.split(',') if b not in available]
    if 'turbojpeg' in backends:
        mmcv.use_backend('turbojpeg')  # mmcv's turbojpeg reads a global
        mmcv.use_backend('cv2')

    with tempfile.TemporaryDirectory() as folder:
        frames = write_frames(folder, sizes, args.images, args.quality)
        file_mb = {
            size: statistics.mean(osp.getsize(p) for p in paths) / 1e6
            for size, paths in frames.items()
        }
        print(f'benchmark_decode: {args.images} camera-like JPEG(s) per size '
              f'(quality {args.quality}; ' + ', '.join(
                  f'{s}: {mb:.2f} MB'
                  for s, mb in file_mb.items()) + f'), {args.repeats} passes;'
              f' {os.cpu_count()} CPUs. Timings are medians over all '
              'frames and passes; on a shared machine compare the ratios.')
        print('baseline: LoadImageFromFile + Resize(scale=(S, '
              f'{UNBOUNDED_SIDE}), keep_ratio=True, interpolation='
              f"'{args.interpolation}'); ours: the same list in "
              f'ReducedDecodePipeline(exact_shapes={args.exact_shapes})')
        if skipped:
            print(f'skipped (not installed): {", ".join(skipped)}')
        print('PSNR: ours vs the baseline output; "vs area" compares with the'
              ' full decode shrunk by area averaging (alias-free), for ours /'
              ' for the baseline')
        header = (f'{"frame":<11}{"short":>6}  {"backend":<10}'
                  f'{"base ms":>9}{"ours ms":>9}{"speed-up":>10}'
                  f'{"decode":>8}{"PSNR":>8}{"min":>7}{"vs area":>16}')
        print(header)
        rows = []
        for size in sizes:
            for short in short_sides:
                resize = dict(
                    type='Resize',
                    scale=(short, UNBOUNDED_SIDE),
                    keep_ratio=True,
                    interpolation=args.interpolation)
                for backend in backends:
                    pipeline = [
                        dict(
                            type='LoadImageFromFile',
                            imdecode_backend=backend), resize
                    ]
                    row = measure(
                        frames[size], Compose(pipeline),
                        ReducedDecodePipeline(
                            pipeline, exact_shapes=args.exact_shapes),
                        args.repeats)
                    row.update(size=size, short=short, backend=backend)
                    rows.append(row)
                    print(f'{size:<11}{short:>6}  {backend:<10}'
                          f'{row["base_ms"]:>9.1f}{row["ours_ms"]:>9.1f}'
                          f'{row["speedup"]:>9.2f}x{row["decode_scale"]:>8}'
                          f'{row["psnr"]:>8.1f}{row["psnr_min"]:>7.1f}'
                          f'{row["psnr_ideal"]:>8.1f} / '
                          f'{row["psnr_base_ideal"]:.1f}')
    print_goal(rows)


def print_goal(rows: List[dict]) -> None:
    goal_rows = [
        r for r in rows
        if r['size'] == GOAL['size'] and r['short'] == GOAL['short_side']
    ]
    if not goal_rows:
        return
    print(f'goal: >= {GOAL["speedup"]:.0f}x on {GOAL["size"]} -> '
          f'{GOAL["short_side"]} with PSNR >= {GOAL["psnr"]:.0f} dB '
          '(medians over the frames)')
    for r in goal_rows:
        missed = [
            what for what, ok in (('speed-up', r['speedup'] >= GOAL['speedup']),
                                  ('PSNR', r['psnr'] >= GOAL['psnr']))
            if not ok
        ]
        verdict = f'missed: {", ".join(missed)}' if missed else 'met'
        print(f'  {r["backend"]:<10}{r["speedup"]:.2f}x, PSNR '
              f'{r["psnr"]:.1f} dB (min {r["psnr_min"]:.1f}): {verdict}')


if __name__ == '__main__':
    main()
