"""Seeds derived from positions, and (re)seeding of the global RNGs.

Exact resume replays randomness by *deriving* it instead of saving it: a
sample's augmentations are seeded from its position in the sample stream,
an iteration's main-process randomness from the iteration number. Nothing
then depends on which worker loaded a sample, how many workers there are,
or how far the run got before it was interrupted.
"""
import contextlib
import random
from typing import Iterator

import numpy as np
import torch

MASK64 = (1 << 64) - 1


def splitmix64(value: int) -> int:
    """One step of Steele et al.'s SplitMix64 (increment and finaliser).

    Every input bit affects every output bit, so nearby positions get
    unrelated outputs. Shared by the per-sample seeds and the keys of
    :class:`~mmdata_plugin.sample_order.IndexPermutation`.
    """
    value = (value + 0x9E3779B97F4A7C15) & MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK64
    return value ^ (value >> 31)


def mix_seed(*values: int) -> int:
    """A 64-bit seed that depends on every value and on their order.

    Unlike ``seed + position`` (Megatron's ``RandomSeedDataset``), distinct
    tuples do not collide in practice: ``mix_seed(s, 1, 0)`` and
    ``mix_seed(s, 0, 1)`` are unrelated.

    Args:
        *values (int): E.g. ``(base_seed, epoch, position)``; negative
            values are taken modulo 2**64.

    Returns:
        int: A seed in ``[0, 2**64)``.
    """
    state = 0
    for value in values:
        state = splitmix64(state ^ (int(value) & MASK64))
    return state


def seed_global_rngs(seed: int, all_devices: bool = False) -> None:
    """Seed Python's ``random``, ``numpy.random`` and torch's generator.

    Args:
        seed (int): A seed in ``[0, 2**64)`` (e.g. from :func:`mix_seed`).
        all_devices (bool): Also seed the accelerators' generators
            (``torch.manual_seed``). False seeds only the CPU generator,
            which is what data pipelines draw from, so reseeding per sample
            never touches (or initialises) a GPU.
    """
    random.seed(seed)
    # The legacy numpy seed takes 32-bit words; keep all 64 bits.
    np.random.seed([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF])
    if all_devices:
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def global_rng_states() -> tuple:
    """The CPU states of ``random``, ``numpy.random`` and torch."""
    return (random.getstate(), np.random.get_state(),
            torch.default_generator.get_state())


def same_global_rng_states(first: tuple, second: tuple) -> bool:
    """Whether two :func:`global_rng_states` are equal."""
    (py_a, np_a, torch_a), (py_b, np_b, torch_b) = first, second
    # numpy's state is (name, key array, pos, has_gauss, cached_gaussian).
    # torch's is compared as bytes: a torch op here could start torch's
    # intra-op thread pool in the main process, and DataLoader workers
    # forked after that hang at exit.
    return (py_a == py_b and np_a[0] == np_b[0]
            and np.array_equal(np_a[1], np_b[1]) and np_a[2:] == np_b[2:]
            and torch_a.numpy().tobytes() == torch_b.numpy().tobytes())


@contextlib.contextmanager
def preserved_global_rngs() -> Iterator[None]:
    """Restore the CPU states of ``random``, ``numpy`` and torch on exit."""
    py_state, np_state, torch_state = global_rng_states()
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.default_generator.set_state(torch_state)
