import itertools
from unittest import mock

import pytest
import torch
from mmengine.dataset import DefaultSampler, InfiniteSampler

from mmdata_plugin.sample_order import index_streams
from mmdata_plugin.sample_order.index_streams import (default_sampler_stream,
                                                      infinite_sampler_stream)


def build(cls, size, rank, world_size, **kwargs):
    with mock.patch('mmengine.dataset.sampler.get_dist_info',
                    return_value=(rank, world_size)):
        return cls(list(range(size)), seed=7, **kwargs)


@pytest.mark.parametrize('size', [1, 5, 13])
@pytest.mark.parametrize('world_size', [1, 2, 3])
@pytest.mark.parametrize('shuffle', [True, False])
@pytest.mark.parametrize('words', [True, False])
def test_infinite_stream_equals_infinite_sampler(size, world_size, shuffle,
                                                 words, monkeypatch):
    # Both ways of skipping whole permutations must agree with randperm.
    monkeypatch.setattr(index_streams, '_random_words_advance_like_randperm',
                        lambda: words)
    for rank in range(world_size):
        expected = list(
            itertools.islice(
                build(InfiniteSampler, size, rank, world_size,
                      shuffle=shuffle), 80))
        for local_start in (0, 3, 7, 30):
            stream = infinite_sampler_stream(size, 7, shuffle,
                                             local_start * world_size, rank,
                                             world_size)
            pairs = list(itertools.islice(stream, 80 - local_start))
            assert [index for _, index in pairs] == expected[local_start:]
            assert [position for position, _ in pairs] == list(
                range(local_start * world_size + rank,
                      80 * world_size, world_size))


@pytest.mark.parametrize('size', [1, 5, 13])
@pytest.mark.parametrize('world_size', [1, 2, 3])
@pytest.mark.parametrize('round_up', [True, False])
def test_default_stream_equals_default_sampler(size, world_size, round_up):
    for rank, shuffle, epoch in itertools.product(
            range(world_size), (True, False), (0, 2)):
        sampler = build(DefaultSampler, size, rank, world_size,
                        shuffle=shuffle, round_up=round_up)
        sampler.set_epoch(epoch)
        expected = list(sampler)
        for local_start in (0, 1, 2, 4, 9):
            pairs = default_sampler_stream(size, 7, epoch, shuffle, round_up,
                                           local_start * world_size, rank,
                                           world_size)
            assert [index for _, index in pairs] == expected[local_start:]


def test_default_stream_re_splits_the_rest_of_an_epoch():
    """World size 2 -> 3 after 6 of 10 samples: each new rank gets an equal
    share of the remaining positions, padded like DefaultSampler."""
    order = torch.randperm(
        10, generator=torch.Generator().manual_seed(7 + 1)).tolist()
    shares = [
        list(default_sampler_stream(10, 7, 1, True, True, 6, rank, 3))
        for rank in range(3)
    ]
    assert [len(share) for share in shares] == [2, 2, 2]
    served = sorted(pair for share in shares for pair in share)
    assert [p for p, _ in served] == list(range(6, 12))
    assert [i for _, i in served] == order[6:] + order[:2]


def test_large_skip_is_cheap():
    # 25 whole permutations of 1.28e6 are skipped without listing them.
    stream = infinite_sampler_stream(1_280_000, 0, True, 32_000_000, 0, 1)
    assert next(stream)[0] == 32_000_000
