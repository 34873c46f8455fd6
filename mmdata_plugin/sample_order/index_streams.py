"""mmengine's sampler index streams, started at any global position.

Both functions return ``(global position, dataset index)`` pairs of one
rank's share, where the global position counts samples across all ranks
(rank ``r`` of ``W`` holds positions ``start + r``, ``start + r + W`` ...).
Started at position 0 they yield exactly what ``InfiniteSampler`` and
``DefaultSampler`` yield; started elsewhere they cost index arithmetic only.
"""
import functools
from typing import Iterator, Optional, Tuple

import torch

Pairs = Iterator[Tuple[int, int]]

_BLOCK = 8192

# torch's CPU randperm(n) shuffles with n - 1 32-bit draws below this size
# and with 64-bit draws above it (aten/src/ATen/native/TensorFactories.cpp).
_RANDPERM_32BIT_LIMIT = (2**32 - 1) // 20


@functools.lru_cache(maxsize=None)
def _random_words_advance_like_randperm() -> bool:
    """Whether drawing n - 1 int32 words moves a generator as randperm(n).

    True for the torch builds we know; checked once per process so that a
    torch that shuffles differently falls back to real ``randperm`` calls
    instead of silently diverging from ``InfiniteSampler``.
    """
    by_randperm, by_words = torch.Generator(), torch.Generator()
    by_randperm.manual_seed(0)
    by_words.manual_seed(0)
    torch.randperm(1000, generator=by_randperm)
    torch.empty(999, dtype=torch.int32).random_(generator=by_words)
    return torch.equal(by_randperm.get_state(), by_words.get_state())


def skip_permutations(generator: torch.Generator, size: int,
                      count: int) -> None:
    """Advance ``generator`` as ``count`` calls of ``randperm(size)`` would.

    Drawing the random words without the shuffle's scattered swaps is 10-40x
    faster than ``randperm`` on large datasets.
    """
    if (size < _RANDPERM_32BIT_LIMIT
            and _random_words_advance_like_randperm()):
        words = torch.empty(max(size - 1, 0), dtype=torch.int32)
        for _ in range(count):
            words.random_(generator=generator)
    else:
        for _ in range(count):
            torch.randperm(size, generator=generator)


def infinite_sampler_stream(size: int, seed: int, shuffle: bool, start: int,
                            rank: int, world_size: int) -> Pairs:
    """Rank ``rank``'s share of ``InfiniteSampler``'s stream from ``start``.

    The stream is ``randperm(size)`` drawn again and again from one
    generator seeded with ``seed`` (``arange`` without shuffle). The
    generator is advanced past the whole permutations before ``start``
    right here, at C speed and without materialising any of them, so the
    returned iterator is already positioned.

    Args:
        size (int): Dataset length.
        seed (int): The sampler's seed.
        shuffle (bool): The sampler's ``shuffle``.
        start (int): First global position of the stream to serve.
        rank (int): This rank.
        world_size (int): Number of ranks sharing the stream.
    """
    return _infinite_pairs(
        infinite_sampler_passes(size, seed, shuffle, start // size),
        size, start // size, start + rank, world_size)


def infinite_sampler_passes(size: int, seed: int, shuffle: bool,
                            first_pass: int) -> Iterator[torch.Tensor]:
    """``InfiniteSampler``'s whole passes from pass ``first_pass`` on.

    Pass ``p`` covers global positions ``p * size`` to ``(p + 1) * size``;
    the passes before ``first_pass`` are skipped without being drawn.
    """
    generator = None
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed)
        skip_permutations(generator, size, first_pass)
    while True:
        if generator is None:
            yield torch.arange(size)
        else:
            yield torch.randperm(size, generator=generator)


def _infinite_pairs(passes: Iterator[torch.Tensor], size: int, chunk: int,
                    first: int, step: int) -> Pairs:
    for order in passes:
        offset = first - chunk * size
        if offset < size:
            indices = order[offset::step]
            yield from _pairs(indices, first, step)
            first += len(indices) * step
        chunk += 1


def _pairs(indices: torch.Tensor, first: int, step: int) -> Pairs:
    # Python ints are made block by block: a resumed run gets its first
    # batch without converting a whole (possibly huge) permutation first.
    for start in range(0, len(indices), _BLOCK):
        block = indices[start:start + _BLOCK].tolist()
        yield from zip(range(first + start * step, 2**62, step), block)


def default_sampler_stream(size: int, seed: int, epoch: int, shuffle: bool,
                           round_up: bool, start: int, rank: int,
                           world_size: int) -> Pairs:
    """Rank ``rank``'s share of ``DefaultSampler``'s epoch from ``start``.

    The epoch is ``randperm(size)`` seeded with ``seed + epoch`` (``arange``
    without shuffle). With ``round_up`` the positions still to serve are
    padded to a multiple of ``world_size`` by repeating the epoch's first
    indices, as ``DefaultSampler`` does, so every rank gets the same number
    of samples. For an unchanged world size this is exactly the sampler's
    own padding; after a world-size change it re-splits the rest of the
    epoch among the new ranks.

    Args:
        size (int): Dataset length.
        seed (int): The sampler's seed.
        epoch (int): The epoch (as given to ``set_epoch``).
        shuffle (bool): The sampler's ``shuffle``.
        round_up (bool): The sampler's ``round_up``.
        start (int): First global position within the epoch to serve.
        rank (int): This rank.
        world_size (int): Number of ranks sharing the epoch.
    """
    order = _default_sampler_order(size, seed, epoch, shuffle)
    rest = _padded(order[start:], order, world_size, round_up)
    return _pairs(rest[rank::world_size], start + rank, world_size)


def default_sampler_epoch(size: int, seed: int, epoch: int, shuffle: bool,
                          round_up: bool, world_size: int) -> torch.Tensor:
    """``DefaultSampler``'s whole epoch as one global stream.

    Position ``p`` of the result is what rank ``p % world_size`` yields as
    its ``p // world_size``-th index (padding included), i.e. the stream
    :func:`default_sampler_stream` serves from ``start=0``.
    """
    order = _default_sampler_order(size, seed, epoch, shuffle)
    return _padded(order, order, world_size, round_up)


def _default_sampler_order(size: int, seed: int, epoch: int,
                           shuffle: bool) -> torch.Tensor:
    if not shuffle:
        return torch.arange(size)
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(size, generator=generator)


def _padded(rest: torch.Tensor, order: torch.Tensor, world_size: int,
            round_up: bool) -> torch.Tensor:
    pad = -len(rest) % world_size if round_up else 0
    if not pad:
        return rest
    return torch.cat([rest, order.repeat(pad // len(order) + 1)[:pad]])
