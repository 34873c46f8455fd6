# Fill the CachedPipelineHead cache of a config ahead of a job, so that its
# first epoch already reads decoded images back.
import argparse
import multiprocessing
import os
import sys
import time
from typing import List

from mmengine.registry import DATASETS

from mmdata_plugin.cache import format_size
from mmdata_plugin.data_monitor.instrument import iter_pipelines
from mmdata_plugin.transforms import CachedPipelineHead
from mmdata_plugin.utils.tool_config import (add_dataloader_arguments,
                                             load_dataloader_config)


def parse_args():
    parser = argparse.ArgumentParser(
        description='Run the CachedPipelineHead of a config over every '
        'sample of its dataset once and store what it outputs in the node '
        'cache (the one the training job will read: same cache_dir, '
        'cache_limit and $MMDATA_CACHE_DIR), in parallel processes. '
        'Samples already cached are skipped.')
    parser.add_argument('config', help='config file')
    add_dataloader_arguments(parser)
    parser.add_argument(
        '--workers',
        type=int,
        default=os.cpu_count() or 1,
        help='processes filling in parallel (all cores)')
    parser.add_argument(
        '--limit',
        type=int,
        help='fill only the first N samples (a trial run)')
    return parser.parse_args()


class HeadFiller:
    """Runs a dataset's pipeline up to its cached head, and the head's
    ``fill``: the sample reaches the head exactly as in training (the
    dataset's own ``prepare_data``), then stops."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.head = None
        self.produced = 0
        for _, _, transforms in iter_pipelines(dataset):
            for index, transform in enumerate(transforms):
                if isinstance(transform, CachedPipelineHead):
                    self.head = transform
                    # everything after the head is cut off for filling
                    del transforms[index + 1:]
                    transforms[index] = self._fill
                    break
            if self.head is not None:
                break
        if self.head is None:
            raise SystemExit('the pipeline has no CachedPipelineHead at its '
                             'top level: nothing to fill')

    def _fill(self, results: dict) -> dict:
        self.produced += self.head.fill(results)
        return results

    def run(self, indices: List[int]) -> int:
        prepare = getattr(self.dataset, 'prepare_data', None)
        for index in indices:
            prepare(index) if prepare else self.dataset[index]
        return self.produced


_filler = None


def _fill_share(args) -> int:
    share, shares, total = args
    return _filler.run(list(range(share, total, shares)))


def main():
    global _filler
    args = parse_args()
    _, loader_cfg = load_dataloader_config(args.config, args.split,
                                           args.cfg_options)
    dataset = DATASETS.build(loader_cfg.dataset)
    _filler = HeadFiller(dataset)
    store = _filler.head.store
    total = len(dataset) if args.limit is None else min(
        args.limit, len(dataset))
    shares = max(1, min(args.workers, total))
    print(f'fill_head_cache: {total} samples of the {args.split} dataset of '
          f'{args.config} into {store.cache_dir} ({shares} processes)')
    start = time.perf_counter()
    if shares == 1:
        produced = _filler.run(list(range(total)))
    else:
        with multiprocessing.get_context('fork').Pool(shares) as pool:
            produced = sum(
                pool.map(_fill_share, [(s, shares, total)
                                       for s in range(shares)]))
    seconds = time.perf_counter() - start
    usage = store.usage()
    counts = _filler.head.counters()
    print(f'stored {produced} new entries, {total - produced} were already '
          f'there; {counts.get("bypassed", 0)} did not fit the budget and '
          f'{counts.get("evicted_entries", 0)} were evicted; '
          f'{seconds:.1f} s ({total / seconds:.0f} samples/s)')
    print(f'node store: {usage.entries} entries, '
          f'{format_size(usage.committed_bytes)} of '
          f'{format_size(usage.limit)}')
    if counts.get('bypassed'):
        print('warning: the cache is smaller than the dataset; raise '
              'cache_limit to hold every sample', file=sys.stderr)


if __name__ == '__main__':
    main()
