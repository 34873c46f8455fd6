"""A dataset index that carries per-sample data to the DataLoader workers.

The DataLoader sends each worker only the indices its sampler produced; any
state set on the dataset in the main process never reaches already-running
(e.g. persistent) workers. Data that belongs to one sample draw -- its RNG
seed, the per-epoch shard file it lives in -- therefore travels *with* the
index. ``SampleIndex`` is an ``int``, so datasets that know nothing about it
keep working.
"""
from typing import Optional


class SampleIndex(int):
    """An ``int`` dataset index with optional per-sample fields.

    Args:
        index (int): The dataset index.
        seed (int, optional): Seed for the RNGs while this sample is loaded
            and transformed (set by the fast-resume loops so that random
            augmentations depend only on the sample's stream position).
        shard (str, optional): Which per-epoch shard file holds the sample
            (set by rank-sharded samplers that materialise their share).
    """

    def __new__(cls,
                index: int,
                seed: Optional[int] = None,
                shard: Optional[str] = None) -> 'SampleIndex':
        obj = super().__new__(cls, index)
        obj.seed = seed
        obj.shard = shard
        return obj

    def __reduce__(self):
        # Workers receive indices by pickle; keep the fields on the way.
        return SampleIndex, (int(self), self.seed, self.shard)

    def __repr__(self) -> str:
        return (f'SampleIndex({int(self)}, seed={self.seed}, '
                f'shard={self.shard!r})')


def with_fields(index: int, **fields) -> SampleIndex:
    """``index`` as a :class:`SampleIndex`, keeping fields it already has.

    Args:
        index (int): A plain ``int`` or a :class:`SampleIndex`.
        **fields: ``seed`` and/or ``shard`` to set.
    """
    current = dict(
        seed=getattr(index, 'seed', None), shard=getattr(index, 'shard',
                                                         None))
    current.update(fields)
    return SampleIndex(int(index), **current)
