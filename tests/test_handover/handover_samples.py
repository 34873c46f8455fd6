"""Samples of the structures the hand-over must carry unchanged, for the
hand-over tests (importable by spawn workers: no test module state)."""
import numpy as np
import torch
from mmengine.structures import (BaseDataElement, InstanceData, LabelData,
                                 PixelData)
from mmengine.dataset import pseudo_collate
from torch.utils.data import Dataset

from mmdata_plugin.handover import block_slots


class BitmapLikeMasks:
    """Like mmdet's BitmapMasks: a numpy array inside a plain object."""

    def __init__(self, masks: np.ndarray) -> None:
        self.masks = masks
        self.height, self.width = masks.shape[1:]

    def __len__(self) -> int:
        return len(self.masks)


class BoxesLike:
    """Like mmdet's HorizontalBoxes: a tensor inside a plain object."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __len__(self) -> int:
        return len(self.tensor)


def classification_sample(index: int, size: int = 16) -> dict:
    gen = torch.Generator().manual_seed(index)
    sample = BaseDataElement(metainfo=dict(img_path=f'{index}.jpg',
                                           img_shape=(size, size)))
    sample.gt_label = LabelData(label=torch.tensor([index % 7]))
    return dict(
        inputs=torch.randint(0, 255, (3, size, size), dtype=torch.uint8,
                             generator=gen),
        data_samples=sample)


def detection_sample(index: int) -> dict:
    gen = torch.Generator().manual_seed(index)
    rng = np.random.default_rng(index)
    height, width = 20 + index % 5, 30 - index % 4  # sizes differ
    count = index % 3 + 1
    instances = InstanceData(metainfo=dict(img_shape=(height, width)))
    instances.bboxes = BoxesLike(torch.rand(count, 4, generator=gen) * 20)
    instances.labels = torch.arange(count) + index
    instances.masks = BitmapLikeMasks(
        rng.random((count, height, width)) > 0.5)
    sample = BaseDataElement(metainfo=dict(
        img_id=index, scale_factor=(1.5, 1.5), flip=bool(index % 2)))
    sample.gt_instances = instances
    sample.ignored = InstanceData(bboxes=torch.zeros(0, 4))
    return dict(
        inputs=torch.randint(0, 255, (3, height, width), dtype=torch.uint8,
                             generator=gen),
        data_samples=sample)


def segmentation_sample(index: int) -> dict:
    gen = torch.Generator().manual_seed(index)
    sample = BaseDataElement(metainfo=dict(img_shape=(24, 24)))
    sample.gt_sem_seg = PixelData(
        data=torch.randint(0, 150, (1, 24, 24), dtype=torch.uint8,
                           generator=gen))
    sample.weights = torch.rand(24, 24, dtype=torch.float64, generator=gen)
    sample.valid = torch.rand(24, 24, generator=gen) > 0.3
    return dict(
        inputs=torch.randint(0, 255, (3, 24, 24), dtype=torch.uint8,
                             generator=gen)[:, :, ::1],
        data_samples=sample)


SAMPLES = dict(
    classification=classification_sample,
    detection=detection_sample,
    segmentation=segmentation_sample)


def busy_slots_collate(data_batch):
    """pseudo_collate, noting how many of this worker's block slots are
    busy before the batch takes one."""
    slots = block_slots.worker_slots().slots
    batch = pseudo_collate(data_batch)
    batch['busy_slots'] = sum(
        int(slot.flag[0] == block_slots._BUSY) for slot in slots)
    return batch


class StructureDataset(Dataset):
    """``length`` samples of one structure."""

    def __init__(self, kind: str, length: int = 24) -> None:
        self.kind, self.length = kind, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        return SAMPLES[self.kind](index)


def assert_same(actual, expected, where: str = 'batch') -> None:
    """Same types, structure, dtypes, shapes and bytes."""
    assert type(actual) is type(expected) or (
        isinstance(expected, dict) and isinstance(actual, dict)), (
            f'{where}: {type(actual).__name__} != {type(expected).__name__}')
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, where
        assert actual.shape == expected.shape, where
        assert torch.equal(actual.cpu(), expected.cpu()), where
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype and np.array_equal(
            actual, expected), where
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), where
        for key in expected:
            assert_same(actual[key], expected[key], f'{where}[{key!r}]')
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f'{where}[{i}]')
    elif isinstance(expected, BaseDataElement):
        # Field names are kept in sets: their order follows the hash seed.
        assert set(actual.metainfo_keys()) == set(
            expected.metainfo_keys()), where
        for key in expected.metainfo_keys():
            assert_same(actual.metainfo[key], expected.metainfo[key],
                        f'{where}.{key}')
        assert set(actual.keys()) == set(expected.keys()), where
        for key in expected.keys():
            assert_same(actual.get(key), expected.get(key), f'{where}.{key}')
    elif hasattr(expected, '__dict__'):
        assert_same(vars(actual), vars(expected), where)
    else:
        assert actual == expected, f'{where}: {actual!r} != {expected!r}'
