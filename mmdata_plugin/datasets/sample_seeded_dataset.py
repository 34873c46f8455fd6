"""Reseed the global RNGs from the index's seed before each sample loads."""
from typing import Any, Union

from mmengine.registry import DATASETS
from torch.utils.data import get_worker_info

from ..utils.seeding import preserved_global_rngs, seed_global_rngs


@DATASETS.register_module()
class SampleSeededDataset:
    """Makes a sample's random augmentations a function of its seed only.

    Before ``dataset[index]`` loads and transforms a sample, Python's
    ``random``, ``numpy.random`` and torch's CPU generator are seeded with
    ``index.seed`` (a :class:`~mmdata_plugin.sample_order.SampleIndex`
    field). Which worker loads the sample, how many workers exist, and what
    they loaded before no longer matter, so an index-only fast-forward
    replays the same augmented values. The fast-resume loops wrap their
    train dataset in it and send seeded indices; a plain ``int`` index loads
    unseeded.

    In the main process (``num_workers=0``) the RNG states are restored
    after each sample, so data loading does not shift the randomness of the
    training step. In a worker the sample's seeded stream continues into
    ``collate_fn``.

    The wrapper owns only ``dataset``: every other attribute, read or
    written (``metainfo``, ``pipeline``, ``full_init`` ...), is the wrapped
    dataset's. The wrapped dataset gets a plain ``int`` index, except for an
    index with a ``shard`` field (rank-sharded samplers with shard files),
    which is passed on unchanged for the dataset to read that file.

    Args:
        dataset (Dataset | dict): The dataset to wrap, or its config.
    """

    def __init__(self, dataset: Union[Any, dict]) -> None:
        if isinstance(dataset, dict):
            dataset = DATASETS.build(dataset)
        object.__setattr__(self, 'dataset', dataset)

    @property
    def metainfo(self) -> dict:
        """The wrapped dataset's meta information."""
        return self.dataset.metainfo

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        seed = getattr(index, 'seed', None)
        if getattr(index, 'shard', None) is None:
            # Datasets store the index they get (mmengine's BaseDataset puts
            # it in data_info['sample_idx']); a plain int keeps data samples
            # free of a class that weights_only loading refuses.
            index = int(index)
        if seed is None:
            return self.dataset[index]
        if get_worker_info() is not None:
            seed_global_rngs(seed)
            return self.dataset[index]
        with preserved_global_rngs():
            seed_global_rngs(seed)
            return self.dataset[index]

    def __getattr__(self, name: str):
        if name == 'dataset':
            # Not set yet (e.g. while unpickling): no recursion into it.
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __setattr__(self, name: str, value) -> None:
        if name == 'dataset':
            object.__setattr__(self, name, value)
        else:
            setattr(self.dataset, name, value)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(dataset={self.dataset!r})'
