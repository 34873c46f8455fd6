"""mmengine's sampler index streams, started at any global position.

Both functions return ``(global position, dataset index)`` pairs of one
rank's share, where the global position counts samples across all ranks
(rank ``r`` of ``W`` holds positions ``start + r``, ``start + r + W`` ...).
Started at position 0 they yield exactly what ``InfiniteSampler`` and
``DefaultSampler`` yield; started elsewhere they cost index arithmetic only.
"""
from typing import Iterator, Optional, Tuple

import torch

Pairs = Iterator[Tuple[int, int]]


def infinite_sampler_stream(size: int, seed: int, shuffle: bool, start: int,
                            rank: int, world_size: int) -> Pairs:
    """Rank ``rank``'s share of ``InfiniteSampler``'s stream from ``start``.

    The stream is ``randperm(size)`` drawn again and again from one
    generator seeded with ``seed`` (``arange`` without shuffle). Whole
    permutations before ``start`` are drawn and discarded right here, at C
    speed and without materialising any index list, so the returned
    iterator is already positioned.

    Args:
        size (int): Dataset length.
        seed (int): The sampler's seed.
        shuffle (bool): The sampler's ``shuffle``.
        start (int): First global position of the stream to serve.
        rank (int): This rank.
        world_size (int): Number of ranks sharing the stream.
    """
    generator = None
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed)
        for _ in range(start // size):
            torch.randperm(size, generator=generator)
    return _infinite_pairs(size, generator, start // size, start + rank,
                           world_size)


def _infinite_pairs(size: int, generator: Optional[torch.Generator],
                    chunk: int, first: int, step: int) -> Pairs:
    while True:
        base = chunk * size
        if generator is None:
            order = torch.arange(size)
        else:
            order = torch.randperm(size, generator=generator)
        offset = first - base
        if offset < size:
            indices = order[offset::step].tolist()
            yield from zip(range(first, base + size, step), indices)
            first += len(indices) * step
        chunk += 1


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
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        order = torch.randperm(size, generator=generator)
    else:
        order = torch.arange(size)
    rest = order[start:]
    pad = -len(rest) % world_size if round_up else 0
    if pad:
        rest = torch.cat([rest, order.repeat(pad // size + 1)[:pad]])
    indices = rest[rank::world_size].tolist()
    return zip(range(start + rank, start + len(rest), world_size), indices)
