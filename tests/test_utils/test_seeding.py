import random

import numpy as np
import torch

from mmdata_plugin.utils import (mix_seed, preserved_global_rngs,
                                 seed_global_rngs)


def test_mix_seed_depends_on_every_value_and_their_order():
    seeds = {
        mix_seed(0, epoch, position)
        for epoch in range(20) for position in range(500)
    }
    assert len(seeds) == 20 * 500
    assert mix_seed(1, 0) != mix_seed(0, 1)
    assert mix_seed(5, -1, 3) == mix_seed(5, 2**64 - 1, 3)
    assert all(0 <= seed < 2**64 for seed in seeds)


def test_seed_global_rngs_uses_all_64_bits():

    def draws(seed):
        seed_global_rngs(seed)
        return random.random(), np.random.rand(), torch.rand(1).item()

    assert draws(2**40) == draws(2**40)
    assert draws(2**40)[1] != draws(2**41)[1]


def test_preserved_global_rngs():
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    with preserved_global_rngs():
        seed_global_rngs(123)
        torch.rand(5), random.random(), np.random.rand()
    assert torch.equal(torch.rand(2), expected)
