# Which image decoder is fastest on YOUR files, and how different are they?
import argparse
import copy
import os
import os.path as osp
import random
import statistics
import time
from collections import Counter
from fractions import Fraction
from typing import Dict, List, Optional, Tuple

import cv2
import mmcv
import mmengine.fileio as fileio
import numpy as np
from mmengine.registry import DATASETS

import mmdata_plugin  # noqa: F401  (registers the package's components)
from mmdata_plugin.transforms import (LoadImageFromFileReduced,
                                      decode_target_from_pipeline)
from mmdata_plugin.transforms.decode_target import (LOADER_TYPES,
                                                    UNBOUNDED_SIDE,
                                                    transform_type)
from mmdata_plugin.transforms.image_decoding import (DECODE_BACKENDS,
                                                     available_backends,
                                                     decode_image)
from mmdata_plugin.transforms.jpeg_header import is_jpeg
from mmdata_plugin.utils import pixel_difference
from mmdata_plugin.utils.tool_config import (add_dataloader_arguments,
                                             load_dataloader_config)

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif',
                    '.tiff')
DEFAULT_SHORT_SIDE = 224


def parse_args():
    parser = argparse.ArgumentParser(
        description='Decode your own images with every available backend '
        '(cv2, pillow, turbojpeg when installed) at full size and reduced '
        'to what the pipeline resizes to; print the time per image and the '
        'pixel difference between backends')
    parser.add_argument(
        'source', help='a config file (its dataset is built, no model) or a '
        'folder of images')
    parser.add_argument(
        '--num-files', type=int, default=50, help='files to decode (50)')
    parser.add_argument(
        '--short-side',
        type=int,
        help='reduced variants decode at least this short side; default: '
        'what the pipeline resize needs (config), or '
        f'{DEFAULT_SHORT_SIDE} (folder)')
    parser.add_argument(
        '--repeats',
        type=int,
        default=3,
        help='decodes per file and variant; the median counts (3)')
    parser.add_argument(
        '--exact-shapes',
        action=argparse.BooleanOptionalAction,
        help='reduce only by scales that divide both sides (the loader\'s '
        'default); default: as the config\'s loader or wrapper')
    parser.add_argument(
        '--seed', type=int, default=0, help='seed of the file sample')
    add_dataloader_arguments(parser)
    return parser.parse_args()


def sample(items: List, num: int, seed: int) -> List:
    if len(items) <= num:
        return list(items)
    return random.Random(seed).sample(items, num)


def files_in_folder(folder: str, num: int, seed: int) -> List[str]:
    paths = sorted(
        osp.join(root, name) for root, _, names in os.walk(folder)
        for name in names if name.lower().endswith(IMAGE_EXTENSIONS))
    if not paths:
        raise SystemExit(f'no images ({", ".join(IMAGE_EXTENSIONS)}) under '
                         f'{folder}')
    return sample(paths, num, seed)


def find_pipeline(dataset_cfg: dict) -> Optional[list]:
    """The pipeline of a dataset config, looking into dataset wrappers, a
    CachedPipelineHead at its start and a ReducedDecodePipeline at its start
    (whose ``exact_shapes`` then goes to the loader, as the wrapper does)."""
    while dataset_cfg is not None:
        if dataset_cfg.get('pipeline'):
            pipeline = list(dataset_cfg['pipeline'])
            if pipeline and transform_type(
                    pipeline[0]) == 'CachedPipelineHead':
                pipeline = list(pipeline[0]['transforms']) + pipeline[1:]
            if pipeline and transform_type(
                    pipeline[0]) == 'ReducedDecodePipeline':
                wrapper = pipeline[0]
                pipeline = copy.deepcopy(list(
                    wrapper['transforms'])) + pipeline[1:]
                if 'exact_shapes' in wrapper:
                    loader_cfg(pipeline).setdefault('exact_shapes',
                                                    wrapper['exact_shapes'])
            return pipeline
        dataset_cfg = dataset_cfg.get('dataset')
    return None


def files_from_config(args) -> Tuple[List[str], Optional[list], str]:
    _, dataloader_cfg = load_dataloader_config(args.source, args.split,
                                               args.cfg_options)
    dataset = DATASETS.build(dataloader_cfg.dataset)
    indices = sample(range(len(dataset)), args.num_files, args.seed)
    paths = [dataset.get_data_info(i)['img_path'] for i in indices]
    where = (f'{len(paths)} of {len(dataset)} files of the {args.split} '
             f'dataset of {args.source}')
    return paths, find_pipeline(dataloader_cfg.dataset), where


def loader_cfg(pipeline: Optional[list]) -> dict:
    for cfg in pipeline or []:
        if transform_type(cfg) in LOADER_TYPES:
            return cfg
    return {}


def reduced_target(args, pipeline: Optional[list]) -> Tuple[dict, str]:
    exact = loader_cfg(pipeline).get('exact_shapes', True)
    if args.exact_shapes is not None:
        exact = args.exact_shapes
    target, origin = decode_size(args, pipeline)
    return dict(target, exact_shapes=exact), origin


def decode_size(args, pipeline: Optional[list]) -> Tuple[dict, str]:
    if args.short_side:
        return dict(scale=(args.short_side, UNBOUNDED_SIDE),
                    keep_ratio=True), '--short-side'
    loader = loader_cfg(pipeline)
    if 'scale' in loader:
        return dict(
            scale=tuple(loader['scale']),
            keep_ratio=loader.get('keep_ratio', False)), 'the pipeline loader'
    if pipeline:
        try:
            return decode_target_from_pipeline(pipeline), 'the pipeline resize'
        except ValueError as error:
            print(f'note: no decode size from the pipeline ({error})')
    return dict(scale=(DEFAULT_SHORT_SIDE, UNBOUNDED_SIDE),
                keep_ratio=True), f'default short side {DEFAULT_SHORT_SIDE}'


class Variant:
    """One way of decoding: a backend, at full size or reduced."""

    def __init__(self, backend: str, target: Optional[dict]):
        self.backend = backend
        self.loader = None if target is None else LoadImageFromFileReduced(
            imdecode_backend=backend, **target)
        self.name = backend + (' reduced' if self.loader else '')
        self.times: List[float] = []
        self.scales: Counter = Counter()
        self.errors: List[str] = []
        self.images: Dict[str, np.ndarray] = {}

    def decode(self, content: bytes) -> Tuple[np.ndarray, Fraction]:
        if self.loader is None:
            # Exactly LoadImageFromFile's decode.
            img = mmcv.imfrombytes(content, backend=self.backend)
            if img is None:
                raise ValueError('not decodable')
            return img, Fraction(1)
        decoded = decode_image(content, 'color', self.backend,
                               self.loader.min_decoded_size)
        return decoded.img, decoded.reduction

    def run(self, path: str, content: bytes, repeats: int) -> None:
        spent = []
        try:
            for _ in range(repeats):
                start = time.perf_counter()
                img, scale = self.decode(content)
                spent.append(time.perf_counter() - start)
        except Exception as error:  # report, keep comparing the others
            self.errors.append(f'{path}: {type(error).__name__}: {error}')
            return
        self.times.append(statistics.median(spent))
        self.scales[scale] += 1
        self.images[path] = img


def percentile(values: List[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float('nan')


def print_times(variants: List[Variant], repeats: int) -> None:
    reference = statistics.mean(variants[0].times)
    print(f'\ndecode time per image (each file: median of {repeats} decodes, '
          'bytes already in memory); "vs cv2" compares mean times, i.e. '
          'throughput')
    print(f'{"variant":<18}{"median ms":>10}{"mean ms":>9}{"p90 ms":>9}'
          f'{"vs cv2":>9}   decode scales used (files)')
    for variant in variants:
        if not variant.times:
            print(f'{variant.name:<18}{"all files failed":>37}')
            continue
        mean = statistics.mean(variant.times)
        scales = ', '.join(f'{s}: {n}'
                           for s, n in sorted(variant.scales.items()))
        print(f'{variant.name:<18}'
              f'{statistics.median(variant.times) * 1e3:>10.2f}'
              f'{mean * 1e3:>9.2f}'
              f'{percentile(variant.times, 90) * 1e3:>9.2f}'
              f'{reference / mean:>8.2f}x   {scales}')


def print_differences(variants: List[Variant]) -> None:
    reference = variants[0]
    print('\npixel difference against the cv2 full decode (reduced variants:'
          ' against it shrunk to their size with INTER_AREA)')
    print(f'{"variant":<18}{"mean |d|":>9}{"max |d|":>8}'
          f'{"PSNR median":>13}{"PSNR min":>10}{"files":>7}')
    for variant in variants[1:]:
        diffs = []
        for path, img in variant.images.items():
            ref = reference.images.get(path)
            if ref is None:
                continue
            if variant.loader is not None and ref.shape != img.shape:
                ref = cv2.resize(ref, img.shape[1::-1],
                                 interpolation=cv2.INTER_AREA)
            if ref.shape == img.shape:
                diffs.append(pixel_difference(img, ref))
        if not diffs:
            print(f'{variant.name:<18}  no file with the same shape')
            continue
        psnrs = [d.psnr for d in diffs]
        print(f'{variant.name:<18}'
              f'{statistics.mean(d.mean_abs for d in diffs):>9.2f}'
              f'{max(d.max_abs for d in diffs):>8d}'
              f'{statistics.median(psnrs):>13.1f}{min(psnrs):>10.1f}'
              f'{len(diffs):>7d}')


def main():
    args = parse_args()
    pipeline = None
    if osp.isdir(args.source):
        paths = files_in_folder(args.source, args.num_files, args.seed)
        where = f'{len(paths)} files under {args.source}'
    else:
        paths, pipeline, where = files_from_config(args)
    target, origin = reduced_target(args, pipeline)
    backend_args = loader_cfg(pipeline).get('backend_args')

    backends = available_backends()
    if 'turbojpeg' in backends:
        mmcv.use_backend('turbojpeg')  # mmcv's turbojpeg reads a global
        mmcv.use_backend('cv2')
    variants = [Variant(b, None) for b in backends]
    variants += [Variant(b, target) for b in backends]

    read_times, contents = [], []
    for path in paths:
        start = time.perf_counter()
        contents.append(fileio.get(path, backend_args=backend_args))
        read_times.append(time.perf_counter() - start)
    jpegs = sum(is_jpeg(content) for content in contents)
    for path, content in zip(paths, contents):
        for variant in variants:
            variant.run(path, content, args.repeats)

    print(f'compare_decoders: {where} ({jpegs} JPEG, {len(paths) - jpegs} '
          f'other)')
    print(f'reduced variants decode at least scale={target["scale"]}, '
          f'keep_ratio={target["keep_ratio"]} (from {origin}), '
          f'exact_shapes={target["exact_shapes"]}')
    print(f'median read time (mmengine.fileio.get): '
          f'{statistics.median(read_times) * 1e3:.2f} ms per file')
    missing = [b for b in DECODE_BACKENDS if b not in backends]
    if missing:
        print('not available: turbojpeg (pip install PyTurboJPEG; it needs '
              'the libturbojpeg library)')
    print_times(variants, args.repeats)
    print_differences(variants)
    for variant in variants:
        for error in variant.errors[:3]:
            print(f'{variant.name} failed on {error}')
        if len(variant.errors) > 3:
            print(f'{variant.name}: {len(variant.errors) - 3} more failures')
    timed = [v for v in variants if v.times]
    fastest = min(timed, key=lambda v: statistics.mean(v.times))
    print(f'\nfastest: {fastest.name}. Full-size decoding is '
          "LoadImageFromFile(imdecode_backend=...); the reduced variants are "
          'LoadImageFromFileReduced / ReducedDecodePipeline '
          '(docs/input_bottlenecks.md).')


if __name__ == '__main__':
    main()
