# Raw arrays delivered to the training process: LoadNumpyFromFile against
# np.load / pickle in DataLoader workers, MB/s of sample bytes. The row
# "LoadNumpyFromFile, node cache" reads remote paths whose copies the node
# cache holds (the remote, a closed port on 127.0.0.1, is never asked: a
# miss would fail the run), through the node_cache fileio backend.
import argparse
import os
import os.path as osp
import pickle
import resource
import statistics
import tempfile
import time
from typing import Callable, Dict, List

import numpy as np
import torch
from mmengine.dataset import pseudo_collate
from torch.utils.data import DataLoader

import mmdata_plugin  # noqa: F401  (registers the package's components)
from mmdata_plugin.cache.node_store import NodeStore
from mmdata_plugin.datasets import ImageListDataset
from mmdata_plugin.remote_cache.node_cache_backend import NAMESPACE
from mmdata_plugin.transforms import LoadNumpyFromFile

GOAL_MB_S = 600.0
PAGE = 4096
# Where the cached copies claim to come from: nothing listens there.
REMOTE = 'http://127.0.0.1:9/raw'
NODE_CACHE = 'LoadNumpyFromFile, node cache'


def parse_args():
    parser = argparse.ArgumentParser(
        description='MB/s of raw array bytes delivered to the training '
        'process by DataLoader workers: LoadNumpyFromFile (read into shared '
        'memory) against np.load and pickle.load returning numpy arrays '
        '(pickled through the worker queue) and np.load + torch.from_numpy '
        '(copied into shared memory by the DataLoader)')
    parser.add_argument('--samples', type=int, default=160,
                        help='array files (160)')
    parser.add_argument('--shape', default='512,512,4',
                        help='array shape, comma separated (512,512,4)')
    parser.add_argument('--dtype', default='float32')
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=3,
                        help='passes per loader, interleaved (3)')
    parser.add_argument('--work-dir', default=None,
                        help='where to write the files (a temporary '
                        'directory, removed afterwards)')
    return parser.parse_args()


class NumpyLoad:
    """The naive baseline: ``np.load`` in the worker, a numpy array out."""

    def __call__(self, results: dict) -> dict:
        results['img'] = np.load(results['img_path'])
        return results


class PickleLoad:
    """The other naive baseline: one pickled array per sample."""

    def __call__(self, results: dict) -> dict:
        with open(results['img_path'][:-len('.npy')] + '.pkl', 'rb') as f:
            results['img'] = pickle.load(f)
        return results


class NumpyLoadToTensor:
    """``np.load`` + ``torch.from_numpy``: the DataLoader copies the tensor
    into shared memory when the worker sends it."""

    def __call__(self, results: dict) -> dict:
        results['img'] = torch.from_numpy(np.load(results['img_path']))
        return results


def pack(results: dict) -> dict:
    return dict(inputs=results['img'])


LOADERS: Dict[str, Callable[[], Callable]] = {
    'LoadNumpyFromFile': LoadNumpyFromFile,
    'np.load': NumpyLoad,
    'pickle.load': PickleLoad,
    'np.load+from_numpy': NumpyLoadToTensor,
}


def write_arrays(folder: str, count: int, shape, dtype) -> str:
    """``count`` incompressible arrays as .npy and .pkl; the list file."""
    rng = np.random.default_rng(0)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    lines = []
    for i in range(count):
        array = np.frombuffer(rng.bytes(nbytes), dtype).reshape(shape)
        name = f'arr_{i:05d}'
        np.save(osp.join(folder, name + '.npy'), array)
        with open(osp.join(folder, name + '.pkl'), 'wb') as f:
            pickle.dump(array, f)
        lines.append(f'{name}.npy {i % 10}\n')
    ann = osp.join(folder, 'list.txt')
    with open(ann, 'w') as f:
        f.writelines(lines)
    return ann


def fill_node_cache(folder: str, ann: str) -> dict:
    """Publish every array into a node cache under its remote URL; the
    ``backend_args`` that read them from there."""
    cache_dir = osp.join(folder, 'node_cache')
    args = dict(backend='node_cache', cache_dir=cache_dir,
                cache_limit=2**40, remote=dict(backend='remote_http'))
    store = NodeStore(cache_dir, args['cache_limit'])
    with open(ann) as f:
        for line in f:
            name = line.split()[0]
            with open(osp.join(folder, name), 'rb') as array:
                store.publish_bytes(NAMESPACE, f'{REMOTE}/{name}',
                                    array.read())
    return args


def build_datasets(folder: str, ann: str) -> Dict[str, ImageListDataset]:
    datasets = {
        name: ImageListDataset(
            ann_file=ann,
            data_prefix=dict(img_path=folder),
            pipeline=[make(), pack],
            serialize_data=True)
        for name, make in LOADERS.items()
    }
    datasets[NODE_CACHE] = ImageListDataset(
        ann_file=ann,
        data_prefix=dict(img_path=REMOTE),
        pipeline=[
            LoadNumpyFromFile(backend_args=fill_node_cache(folder, ann)), pack
        ],
        serialize_data=True)
    return datasets


def as_bytes(sample) -> torch.Tensor:
    tensor = sample if isinstance(sample, torch.Tensor) else \
        torch.from_numpy(np.ascontiguousarray(sample))
    return tensor.contiguous().view(-1).view(torch.uint8)


def cpu_seconds() -> float:
    """CPU time of this process and of its finished (joined) children."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def one_pass(dataset, batch_size: int, workers: int) -> tuple:
    """Wall and CPU seconds of a pass (worker start included), and bytes
    delivered.

    The training process reads one byte per 4 KiB page of every sample, so
    a delivered array is really mapped there, not just announced. CPU time
    counts the training process and the workers (joined at the end), so it
    says what the pass costs whatever else runs on the machine.
    """
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=pseudo_collate,
        shuffle=False)
    start, cpu = time.perf_counter(), cpu_seconds()
    delivered = 0
    batches = iter(loader)
    for batch in batches:
        for sample in batch['inputs']:
            data = as_bytes(sample)
            int(data[::PAGE].sum())
            delivered += data.numel()
    seconds = time.perf_counter() - start
    del batches  # joins the workers, so that their CPU time is counted
    return seconds, cpu_seconds() - cpu, delivered


def check_first_batch(datasets: Dict[str, ImageListDataset], folder: str,
                      workers: int) -> None:
    """Every loader delivers the bytes of the source files."""
    for name, dataset in datasets.items():
        loader = DataLoader(dataset, batch_size=2, num_workers=workers,
                            collate_fn=pseudo_collate)
        batch = next(iter(loader))
        for i, sample in enumerate(batch['inputs']):
            expected = np.load(
                osp.join(folder,
                         osp.basename(dataset.get_data_info(i)['img_path'])))
            # Bytes, not values: random float bytes hold NaNs.
            if not torch.equal(as_bytes(sample), as_bytes(expected)):
                raise AssertionError(f'{name} delivered wrong bytes for '
                                     f'sample {i}')


def main():
    args = parse_args()
    shape = tuple(int(s) for s in args.shape.split(','))
    tmp = None
    if args.work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix='raw_arrays_')
        folder = tmp.name
    else:
        folder = args.work_dir
        os.makedirs(folder, exist_ok=True)
    try:
        ann = write_arrays(folder, args.samples, shape, args.dtype)
        datasets = build_datasets(folder, ann)
        check_first_batch(datasets, folder, args.workers)
        report(datasets, args, shape)
    finally:
        if tmp is not None:
            tmp.cleanup()


def report(datasets: Dict[str, ImageListDataset], args, shape) -> None:
    rates: Dict[str, List[float]] = {name: [] for name in datasets}
    cpu_rates: Dict[str, List[float]] = {name: [] for name in datasets}
    total = 0
    for _ in range(args.repeats):
        # Interleaved, so that load from other jobs on a shared machine
        # falls on every loader alike.
        for name, dataset in datasets.items():
            seconds, cpu, total = one_pass(dataset, args.batch_size,
                                           args.workers)
            rates[name].append(total / seconds / 1e6)
            cpu_rates[name].append(total / cpu / 1e6)
    sample_mb = total / args.samples / 1e6
    print(f'benchmark_raw_arrays: {args.samples} arrays of {args.dtype} '
          f'{shape} ({sample_mb:.2f} MB each, {total / 1e6:.0f} MB a pass, '
          'incompressible, read from the page cache), batch '
          f'{args.batch_size}, {args.workers} workers, mmengine '
          f'pseudo_collate; {args.repeats} passes per loader, interleaved; '
          f'{os.cpu_count()} CPUs (a shared machine: medians).')
    print('MB/s = sample bytes delivered to the training process (one byte '
          'per 4 KiB page read there) / wall time of the pass, worker start '
          'included.')
    print('MB per CPU-second = the same bytes / CPU time of the training '
          'process and the workers: what a pass costs, whatever else runs '
          'on the machine.')
    base = statistics.median(rates['np.load'])
    cpu_base = statistics.median(cpu_rates['np.load'])
    print(f'{"loader":<31}{"median MB/s":>12}{"min":>9}{"max":>9}'
          f'{"vs np.load":>12}{"MB/CPU-s":>10}{"vs np.load":>12}')
    for name, values in rates.items():
        median = statistics.median(values)
        per_cpu = statistics.median(cpu_rates[name])
        print(f'{name:<31}{median:>12.1f}{min(values):>9.1f}'
              f'{max(values):>9.1f}{median / base:>11.2f}x'
              f'{per_cpu:>10.0f}{per_cpu / cpu_base:>11.2f}x')
    ours = statistics.median(rates['LoadNumpyFromFile'])
    cached = statistics.median(rates[NODE_CACHE])
    verdict = 'met' if min(ours, cached) >= GOAL_MB_S else 'NOT met'
    print(f'goal: >= {GOAL_MB_S:.0f} MB/s with {args.workers} workers -> '
          f'{ours:.0f} MB/s from local files, {cached:.0f} MB/s from the '
          f'node cache, {verdict}; at '
          f'{statistics.median(cpu_rates["LoadNumpyFromFile"]):.0f} MB per '
          f'CPU-second, {os.cpu_count()} idle CPUs would bound it at '
          f'{statistics.median(cpu_rates["LoadNumpyFromFile"]) * os.cpu_count():.0f}'
          ' MB/s')


if __name__ == '__main__':
    main()
