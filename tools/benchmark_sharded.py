# Memory and startup of RankShardedDataset vs. the usual ways to feed a
# 1e7-line annotation list to W ranks x K DataLoader workers.
#
#   python tools/benchmark_sharded.py                # 1e7 lines, 2 x 4
#   python tools/benchmark_sharded.py --lines 1000000 --workers 2
#
# Each approach runs W real ranks (gloo) with K workers that iterate one
# epoch of indices and metas (no images), then time the start of a few more
# epochs. A monitor sums PSS and USS (from /proc/<pid>/smaps_rollup) over all
# rank and worker processes every 0.2 s; the peak of each sum is reported,
# also net of a baseline run (the same processes and the same stream of
# metas, made up from the index alone: interpreter, torch, DataLoader
# transport), and as a ratio of the BaseDataset figure.
# Times are medians; the machine may be shared, so compare ratios measured
# in the same run.
import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
APPROACHES = ('ours', 'ours+shards', 'basedataset', 'rank_dataset')


def parse_args():
    parser = argparse.ArgumentParser(
        description='Memory (summed PSS/USS) and startup of '
        'RankShardedDataset vs BaseDataset+DefaultSampler vs the '
        'rank_dataset approach, W ranks x K workers')
    parser.add_argument('--lines', type=float, default=1e7)
    parser.add_argument('--ranks', type=int, default=2)
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--batch-size', type=int, default=1000)
    parser.add_argument(
        '--epoch-starts',
        type=int,
        default=3,
        help='epochs whose start is timed after the full first epoch')
    parser.add_argument(
        '--approaches',
        default=','.join(APPROACHES),
        help=f'comma-separated subset of {APPROACHES}')
    parser.add_argument(
        '--work-dir',
        default=osp.join(tempfile.gettempdir(), 'mmdata_benchmark_sharded'))
    parser.add_argument('--index-repeats', type=int, default=3)
    parser.add_argument('--rank-run', help=argparse.SUPPRESS)
    parser.add_argument('--ann-file', help=argparse.SUPPRESS)
    return parser.parse_args()


# ---------------------------------------------------------------- data
def write_annotations(path: str, lines: int) -> None:
    """``train/n<class>/img_<i>.JPEG <class>`` lines, ImageNet-like."""
    rng = np.random.default_rng(0)
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        for start in range(0, lines, 1_000_000):
            stop = min(lines, start + 1_000_000)
            labels = rng.integers(0, 1000, stop - start).tolist()
            f.write(''.join(f'train/n{label:08d}/img_{i:09d}.JPEG {label}\n'
                            for i, label in zip(range(start, stop), labels)))
    os.replace(tmp, path)


def benchmark_index_build(ann_file: str, repeats: int) -> dict:
    from mmdata_plugin.datasets.line_index import (build_line_index,
                                                   ensure_line_index)
    index_file = ann_file + '.idx'
    seconds = []
    for _ in range(repeats):
        if osp.exists(index_file):
            os.remove(index_file)
        seconds.append(
            build_line_index(ann_file, index_file, 'lines')['seconds'])
    start = time.perf_counter()
    ensure_line_index(ann_file, index_file, 'lines')
    reuse = time.perf_counter() - start
    size = osp.getsize(ann_file)
    build = statistics.median(seconds)
    return dict(
        seconds=build, mb_per_s=size / 1e6 / build, reuse_seconds=reuse,
        file_mb=size / 1e6, index_mb=osp.getsize(index_file) / 1e6)


# ------------------------------------------------------ one rank's run
def collate_list(batch):
    return batch


class SyntheticDataset:
    """The baseline: metas made up from the index, nothing stored."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        label = idx % 1000
        return dict(
            img_path=f'train/n{label:08d}/img_{idx:09d}.JPEG',
            gt_label=label,
            sample_idx=idx)


class _ListDataset:
    """rank_dataset's per-rank store: its share as Python objects."""

    def __init__(self, metas):
        self.metas = metas

    def __len__(self):
        return len(self.metas)

    def __getitem__(self, idx):
        path, label, sample_idx = self.metas[idx]
        return dict(img_path=path, gt_label=label, sample_idx=sample_idx)


class RankDatasetApproach:
    """A re-implementation of rank_dataset's RankDataset, parse bugs fixed.

    Per (mini-)epoch every rank counts the file's lines, draws a Python list
    of the whole permutation, keeps a contiguous slice in a set, scans the
    whole file keeping its lines as Python objects, and builds a new
    DataLoader (new workers) on them.
    """

    def __init__(self, ann_file, rank, world_size, loader_kwargs):
        self.ann_file = ann_file
        self.rank = rank
        self.world_size = world_size
        self.loader_kwargs = loader_kwargs

    def _count_lines(self):
        count = 0
        with open(self.ann_file, 'rb') as f:
            for block in iter(lambda: f.read(1 << 20), b''):
                count += block.count(b'\n')
        return count

    def loader(self, epoch):
        from torch.utils.data import DataLoader, RandomSampler
        import torch
        size = self._count_lines()
        np.random.seed(epoch)
        indices = np.random.permutation(size).tolist()
        per_rank = -(-size // self.world_size)
        indices += indices[:per_rank * self.world_size - size]
        mine = set(indices[self.rank * per_rank:(self.rank + 1) * per_rank])
        metas = []
        with open(self.ann_file) as f:
            for i, line in enumerate(f):
                if i in mine:
                    path, label = line.rstrip().rsplit(maxsplit=1)
                    metas.append((path, int(label), i))
        del indices, mine
        dataset = _ListDataset(metas)
        generator = torch.Generator()
        generator.manual_seed(epoch)
        return DataLoader(
            dataset,
            sampler=RandomSampler(dataset, generator=generator),
            **self.loader_kwargs)


def run_rank(args) -> None:
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    dist.init_process_group('gloo')
    rank, world_size = dist.get_rank(), dist.get_world_size()
    loader_kwargs = dict(
        batch_size=args.batch_size,
        num_workers=args.workers,
        collate_fn=collate_list)
    start = time.perf_counter()
    if args.rank_run == 'rank_dataset':
        approach = RankDatasetApproach(args.ann_file, rank, world_size,
                                       loader_kwargs)
        make_loader = approach.loader
    else:
        dataset, sampler = build_dataset_and_sampler(args.rank_run,
                                                     args.ann_file)
        loader = DataLoader(
            dataset, sampler=sampler, persistent_workers=True,
            **loader_kwargs)

        def make_loader(epoch):
            sampler.set_epoch(epoch)
            return loader

    setup = time.perf_counter() - start
    dist.barrier()
    epoch_seconds, starts, samples = None, [], 0
    for epoch in range(args.epoch_starts + 1):
        start = time.perf_counter()
        batches = iter(make_loader(epoch))
        first = next(batches)
        starts.append(time.perf_counter() - start)
        if epoch == 0:
            samples = len(first) + sum(len(batch) for batch in batches)
            epoch_seconds = time.perf_counter() - start
        del batches
        dist.barrier()
    print('RESULT ' + json.dumps(
        dict(
            rank=rank,
            setup=setup,
            epoch=epoch_seconds,
            epoch_start=statistics.median(starts[1:] or starts),
            samples=samples)),
          flush=True)
    dist.destroy_process_group()


def build_dataset_and_sampler(name, ann_file):
    from mmengine.dataset import DefaultSampler

    from mmdata_plugin.datasets import (ImageListDataset, RankShardedDataset,
                                        RankShardedSampler)
    if name == 'basedataset':
        dataset = ImageListDataset(ann_file=ann_file, serialize_data=True)
        return dataset, DefaultSampler(dataset, seed=0)
    if name == 'baseline':
        with open(ann_file, 'rb') as f:
            size = sum(block.count(b'\n')
                       for block in iter(lambda: f.read(1 << 20), b''))
        dataset = SyntheticDataset(size)
        return dataset, RankShardedSampler(dataset, seed=0)
    dataset = RankShardedDataset(
        ann_file=ann_file, materialize_shards=name == 'ours+shards')
    return dataset, RankShardedSampler(dataset, seed=0)


# --------------------------------------------------------------- driver
def run_approach(name, ann_file, args) -> dict:
    """Launch the ranks of one approach; watch their memory."""
    from mmdata_plugin.testing import (cpu_env, find_free_port, python_path,
                                       total_memory)
    port = find_free_port()
    procs = []
    for rank in range(args.ranks):
        env = cpu_env(
            dict(
                PYTHONPATH=python_path(ROOT),
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(args.ranks),
                MASTER_ADDR='127.0.0.1',
                MASTER_PORT=str(port)))
        cmd = [
            sys.executable, __file__, '--rank-run', name, '--ann-file',
            ann_file, '--workers',
            str(args.workers), '--batch-size',
            str(args.batch_size), '--epoch-starts',
            str(args.epoch_starts)
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True))
    peak = dict(pss=0, uss=0)
    done = threading.Event()

    def watch():
        while not done.is_set():
            now = total_memory(p.pid for p in procs)
            for key in peak:
                peak[key] = max(peak[key], now[key])
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    outputs = [proc.communicate()[0] for proc in procs]
    done.set()
    watcher.join()
    results = []
    for proc, output in zip(procs, outputs):
        if proc.returncode != 0:
            raise RuntimeError(f'{name} rank failed:\n{output[-5000:]}')
        results += [
            json.loads(line[len('RESULT '):]) for line in output.splitlines()
            if line.startswith('RESULT ')
        ]

    def median(key):
        return statistics.median(r[key] for r in results)

    return dict(
        setup=median('setup'),
        epoch=median('epoch'),
        epoch_start=median('epoch_start'),
        samples=sum(r['samples'] for r in results),
        pss_mb=peak['pss'] / 2**20,
        uss_mb=peak['uss'] / 2**20)


def main():
    args = parse_args()
    if args.rank_run:
        run_rank(args)
        return
    lines = int(args.lines)
    os.makedirs(args.work_dir, exist_ok=True)
    ann_file = osp.join(args.work_dir, f'train_{lines}.txt')
    if not osp.exists(ann_file):
        print(f'Writing {lines} annotation lines to {ann_file} ...')
        write_annotations(ann_file, lines)
    index = benchmark_index_build(ann_file, args.index_repeats)
    print(f'\nIndex build: {index["file_mb"]:.0f} MB in '
          f'{index["seconds"]:.2f} s = {index["mb_per_s"]:.0f} MB/s (median '
          f'of {args.index_repeats}); reusing it: '
          f'{index["reuse_seconds"] * 1e3:.0f} ms; index '
          f'{index["index_mb"]:.0f} MB\n')

    results = {}
    for name in ['baseline'] + args.approaches.split(','):
        print(f'running {name} ({args.ranks} ranks x {args.workers} '
              'workers) ...', flush=True)
        results[name] = run_approach(name, ann_file, args)
    report(results, index, lines, args)


def report(results, index, lines, args):
    base = results['baseline']
    reference = results.get('basedataset')
    print(f'\n{lines} lines, {args.ranks} ranks x {args.workers} workers, '
          f'batch {args.batch_size}; memory = peak of the sum over all '
          'processes; "net" = minus the baseline (same stream of metas, '
          'none stored).')
    header = (f'{"approach":<13}{"setup s":>9}{"epoch s":>9}'
              f'{"ep.start s":>11}{"PSS MB":>9}{"USS MB":>9}'
              f'{"net PSS":>9}{"net USS":>9}{"PSS/base":>10}{"USS/base":>10}')
    print(header)
    print('-' * len(header))
    for name, r in results.items():
        r['net_pss_mb'] = max(r['pss_mb'] - base['pss_mb'], 0.0)
        r['net_uss_mb'] = max(r['uss_mb'] - base['uss_mb'], 0.0)
        ratios = ('', '')
        if reference is not None and name != 'baseline':
            ref_pss = max(reference['pss_mb'] - base['pss_mb'], 1e-9)
            ref_uss = max(reference['uss_mb'] - base['uss_mb'], 1e-9)
            r['pss_ratio'] = r['net_pss_mb'] / ref_pss
            r['uss_ratio'] = r['net_uss_mb'] / ref_uss
            ratios = (f'{100 * r["pss_ratio"]:.1f}%',
                      f'{100 * r["uss_ratio"]:.1f}%')
        print(f'{name:<13}{r["setup"]:>9.2f}{r["epoch"]:>9.1f}'
              f'{r["epoch_start"]:>11.3f}{r["pss_mb"]:>9.0f}'
              f'{r["uss_mb"]:>9.0f}{r["net_pss_mb"]:>9.0f}'
              f'{r["net_uss_mb"]:>9.0f}{ratios[0]:>10}{ratios[1]:>10}')
    print(f'\nPage cache (shared by the node, evictable, not in PSS when '
          f'read with pread): annotation file {index["file_mb"]:.0f} MB + '
          f'index {index["index_mb"]:.0f} MB.')
    out = osp.join(args.work_dir, 'results.json')
    with open(out, 'w') as f:
        json.dump(dict(index=index, results=results, lines=lines,
                       ranks=args.ranks, workers=args.workers), f, indent=2)
    print(f'Results: {out}')


if __name__ == '__main__':
    main()
