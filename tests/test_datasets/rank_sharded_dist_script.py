"""Run under torchrun by test_rank_sharded_dist.py: real ranks (gloo), real
DataLoader workers, dataloaders built from config dicts by mmengine's
Runner. Asserts on rank 0 and writes a summary JSON to argv[2]."""
import itertools
import json
import os.path as osp
import sys

import numpy as np
import torch.distributed as dist
from mmengine.runner import Runner

import mmdata_plugin  # noqa: F401
from mmdata_plugin.sample_order import IndexPermutation

N = 101


def loader_cfg(sampler, **dataset):
    return dict(
        batch_size=4,
        num_workers=2,
        persistent_workers=True,
        sampler=sampler,
        dataset=dict(
            type='RankShardedDataset',
            ann_file=sys.argv[1],
            data_prefix=dict(img_path='root'),
            **dataset))


def gather(ids):
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, ids)
    return everyone


def loaded_ids(batches):
    """Sample ids of the batches; checks each path is that sample's line."""
    ids = []
    for batch in batches:
        for idx, path in zip(batch['sample_idx'], batch['img_path']):
            assert path == osp.join('root', f'dir/img_{idx:07d}.jpg'), path
            ids.append(idx)
    return ids


def expected_epoch(seed, epoch, mini_epochs, world_size, per_rank):
    perm_epoch, part = divmod(epoch, mini_epochs)
    lo, hi = part * N // mini_epochs, (part + 1) * N // mini_epochs
    positions = lo + np.arange(per_rank * world_size) % (hi - lo)
    stream = IndexPermutation(N, seed, perm_epoch)(positions).tolist()
    return [stream[rank::world_size] for rank in range(world_size)]


def check_epochs(summary, name, mini_epochs, **dataset):
    loader = Runner.build_dataloader(
        loader_cfg(
            dict(type='RankShardedSampler', mini_epochs=mini_epochs),
            **dataset))
    sampler = loader.sampler
    world_size = dist.get_world_size()
    orders = []
    for perm_epoch in range(2):
        covered = []
        for part in range(mini_epochs):
            epoch = perm_epoch * mini_epochs + part
            sampler.set_epoch(epoch)
            per_rank = gather(loaded_ids(loader))
            # Same seed on all ranks although seed=None (sync_random_seed).
            assert gather(sampler.seed) == [sampler.seed] * world_size
            assert per_rank == expected_epoch(sampler.seed, epoch, mini_epochs,
                                              world_size, len(sampler))
            assert len({len(ids) for ids in per_rank}) == 1
            ids = list(itertools.chain(*per_rank))
            assert len(ids) - len(set(ids)) <= world_size  # padding only
            covered.append(set(ids))
            orders.append(per_rank)
        assert set().union(*covered) == set(range(N))
        assert sum(map(len, covered)) == N  # parts are disjoint
    assert orders[0] != orders[mini_epochs]  # reshuffled next pass
    summary[name] = dict(
        per_rank=len(sampler), epochs=len(orders), seed=sampler.seed)


def check_stock_sampler_pairing(summary):
    loader = Runner.build_dataloader(
        loader_cfg(dict(type='DefaultSampler', shuffle=True)), seed=3)
    per_rank = gather(loaded_ids(loader))
    # The dataset is global, so the stock sampler shards exactly once.
    assert [len(ids) for ids in per_rank] == [(N + 1) // 2] * 2
    assert set(itertools.chain(*per_rank)) == set(range(N))
    summary['DefaultSampler'] = dict(per_rank=len(per_rank[0]))


def check_infinite(summary, **dataset):
    loader = Runner.build_dataloader(
        loader_cfg(dict(type='RankShardedInfiniteSampler'), **dataset),
        seed=5)
    batches = iter(loader)
    per_rank = gather(loaded_ids(next(batches) for _ in range(40)))
    stream = [None] * (2 * len(per_rank[0]))
    stream[0::2], stream[1::2] = per_rank
    for p in range(2):  # consecutive passes, each a permutation
        assert sorted(stream[p * N:(p + 1) * N]) == list(range(N))
    summary[f'infinite{"+shards" if dataset else ""}'] = dict(
        samples=len(stream))


def main():
    dist.init_process_group('gloo')
    summary = {}
    check_epochs(summary, 'epochs', mini_epochs=1)
    check_epochs(summary, 'mini_epochs', mini_epochs=3)
    check_epochs(
        summary, 'mini_epochs+shards', mini_epochs=3, materialize_shards=True)
    check_stock_sampler_pairing(summary)
    check_infinite(summary)
    check_infinite(summary, materialize_shards=True)
    if dist.get_rank() == 0:
        with open(sys.argv[2], 'w') as f:
            json.dump(summary, f)
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
