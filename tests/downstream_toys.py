"""mmengine-only stand-ins for downstream datasets and batch samplers.

``ToyDetDataset`` is what a downstream codebase's dataset is to the dump
tool: a ``BaseDataset`` with an annotation format of its own (COCO-like
``images``/``annotations``), a ``parse_data_info``, a ``filter_cfg`` and
numpy values in its records. ``ToyAspectRatioBatchSampler`` follows mmdet's
``AspectRatioBatchSampler`` line for line (buckets held on the instance,
``get_data_info`` read per index), so exact resume is tested without mmdet.
``ToyBoxCounter`` and ``DetProbeHook`` train on and record mmdet batches
where mmdet imports.
Imported by configs through ``custom_imports`` (the tests put this folder on
``PYTHONPATH``).
"""
import hashlib
import json
import os
import os.path as osp

import cv2
import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmengine.dataset import BaseDataset
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import (DATA_SAMPLERS, DATASETS, HOOKS, MODELS,
                               TRANSFORMS)
from torch.utils.data import BatchSampler, Sampler


@DATASETS.register_module()
class ToyDetDataset(BaseDataset):
    """COCO-like detection annotations, parsed the mmdet way."""

    METAINFO = dict(classes=('cat', 'dog', 'bird'),
                    palette=[(220, 20, 60), (119, 11, 32), (0, 0, 142)])

    def load_data_list(self):
        with open(self.ann_file) as file:
            raw = json.load(file)
        by_image = {}
        for ann in raw['annotations']:
            by_image.setdefault(ann['image_id'], []).append(ann)
        return [
            self.parse_data_info(image, by_image.get(image['id'], []))
            for image in raw['images']
        ]

    def parse_data_info(self, image, anns):
        instances = [
            dict(
                bbox=np.array([x, y, x + w, y + h], dtype=np.float32),
                bbox_label=np.int64(ann['category_id'] - 1),
                ignore_flag=np.bool_(ann.get('iscrowd', 0)))
            for ann in anns for x, y, w, h in [ann['bbox']]
        ]
        return dict(
            img_path=osp.join(self.data_prefix['img'], image['file_name']),
            img_id=np.int64(image['id']),
            width=np.int32(image['width']),
            height=np.int32(image['height']),
            instances=instances)

    def filter_data(self):
        cfg = self.filter_cfg or {}
        min_size = cfg.get('min_size', 0)
        return [
            info for info in self.data_list
            if (info['instances'] or not cfg.get('filter_empty_gt', False))
            and min(info['width'], info['height']) >= min_size
        ]

    def get_cat_ids(self, idx):
        return [int(i['bbox_label'])
                for i in self.get_data_info(idx)['instances']]


@TRANSFORMS.register_module()
class ToyLoadBoxes(BaseTransform):
    """``instances`` -> ``gt_bboxes``/``gt_labels`` arrays (mmdet-like)."""

    def transform(self, results):
        instances = results['instances']
        results['gt_bboxes'] = np.array([i['bbox'] for i in instances],
                                        dtype=np.float32).reshape(-1, 4)
        results['gt_bboxes_labels'] = np.array(
            [i['bbox_label'] for i in instances], dtype=np.int64)
        return results


def toy_pipeline():
    return [
        dict(type='LoadImageFromFile'),
        dict(type='ToyLoadBoxes'),
        dict(type='RandomResize', scale=(48, 40), ratio_range=(0.5, 1.5),
             keep_ratio=True),
        dict(type='RandomFlip', prob=0.5),
    ]


def make_toy_coco(root, num_images=12, seed=0):
    """Images and a COCO file (boxes, polygons, categories) under ``root``;
    image 3 has no boxes and image 5 is 8 pixels high (both dropped by the
    filter below)."""
    rng = np.random.default_rng(seed)
    os.makedirs(osp.join(root, 'images'), exist_ok=True)
    images, annotations = [], []
    for i in range(num_images):
        width, height = (int(v) for v in rng.integers(20, 60, 2))
        if i == 5:
            height = 8
        name = f'img_{i:03d}.png'
        cv2.imwrite(osp.join(root, 'images', name),
                    rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
        images.append(dict(id=i, file_name=name, width=width, height=height))
        for k in range(0 if i == 3 else int(rng.integers(1, 4))):
            x, y = float(rng.integers(0, width // 2)), float(
                rng.integers(0, height // 2))
            w, h = width / 3, height / 3
            annotations.append(
                dict(image_id=i, id=len(annotations) + 1,
                     category_id=k % 3 + 1, bbox=[x, y, w, h], area=w * h,
                     iscrowd=0,
                     segmentation=[[x, y, x + w, y, x + w, y + h, x, y + h]]))
    categories = [dict(id=k + 1, name=name)
                  for k, name in enumerate(ToyDetDataset.METAINFO['classes'])]
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    with open(osp.join(root, 'annotations', 'train.json'), 'w') as file:
        json.dump(dict(images=images, annotations=annotations,
                       categories=categories), file)


TOY_FILTER = dict(filter_empty_gt=True, min_size=16)


@DATA_SAMPLERS.register_module()
class ToyAspectRatioBatchSampler(BatchSampler):
    """mmdet 3.3's ``AspectRatioBatchSampler``: buckets by width < height,
    held on the instance, the rest flushed at the end of a pass."""

    def __init__(self, sampler: Sampler, batch_size: int,
                 drop_last: bool = False) -> None:
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._aspect_ratio_buckets = [[] for _ in range(2)]

    def __iter__(self):
        for idx in self.sampler:
            data_info = self.sampler.dataset.get_data_info(idx)
            width, height = data_info['width'], data_info['height']
            bucket = self._aspect_ratio_buckets[0 if width < height else 1]
            bucket.append(idx)
            if len(bucket) == self.batch_size:
                yield bucket[:]
                del bucket[:]
        left_data = (self._aspect_ratio_buckets[0] +
                     self._aspect_ratio_buckets[1])
        self._aspect_ratio_buckets = [[] for _ in range(2)]
        while len(left_data) > 0:
            if len(left_data) <= self.batch_size:
                if not self.drop_last:
                    yield left_data[:]
                left_data = []
            else:
                yield left_data[:self.batch_size]
                left_data = left_data[self.batch_size:]

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size


@MODELS.register_module()
class ToyBoxCounter(BaseModel):
    """Regresses the number of boxes from the mean pixel: a model that
    trains on ``DetDataSample`` batches without mmcv's compiled ops."""

    def __init__(self, data_preprocessor=None):
        super().__init__(data_preprocessor)
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, inputs, data_samples=None, mode='tensor'):
        pixels = inputs.float().mean(dim=(1, 2, 3)) / 255
        if mode != 'loss':
            return pixels * self.weight
        target = torch.tensor([len(s.gt_instances) for s in data_samples],
                              dtype=torch.float32,
                              device=inputs.device)
        return dict(loss=((pixels * self.weight - target)**2).mean())


def _box_tensor(sample):
    """The sample's boxes as a tensor: mmdet keeps a ``HorizontalBoxes``
    where the pipeline says ``box_type='hbox'`` and a bare tensor else."""
    boxes = sample.gt_instances.bboxes
    return getattr(boxes, 'tensor', boxes)


@HOOKS.register_module()
class DetProbeHook(Hook):
    """One JSON line per iteration: images, flips, boxes, pixels, loss."""

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        samples = data_batch['data_samples']
        record = dict(
            iter=runner.iter,
            img_path=[osp.basename(s.img_path) for s in samples],
            flip=[bool(s.flip) for s in samples],
            boxes=[_box_tensor(s).round(decimals=3).tolist()
                   for s in samples],
            pixels=[hashlib.sha1(img.cpu().numpy().tobytes()).hexdigest()
                    for img in data_batch['inputs']],
            loss=outputs['loss'].item())
        with open(osp.join(runner.work_dir, 'probe.jsonl'), 'a') as file:
            file.write(json.dumps(record) + '\n')


@HOOKS.register_module()
class SampleProbeHook(Hook):
    """One JSON line per iteration for any OpenMMLab batch (mmdet's
    ``DetDataSample``, mmpretrain's ``DataSample``): files, flips, labels,
    boxes and pixels. No loss: real models draw from torch's global RNG
    (proposal sampling), which mmengine's checkpoints do not restore, so only
    the batches are expected to match bitwise after a resume."""

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        samples = data_batch['data_samples']
        labels = []
        for s in samples:
            if 'gt_instances' in s:
                labels.append(
                    dict(labels=s.gt_instances.labels.tolist(),
                         boxes=_box_tensor(s).tolist()))
            else:
                labels.append(dict(labels=s.gt_label.tolist()))
        record = dict(
            iter=runner.iter,
            img_path=[osp.basename(s.img_path) for s in samples],
            flip=[bool(s.metainfo.get('flip')) for s in samples],
            labels=labels,
            pixels=[hashlib.sha1(img.cpu().numpy().tobytes()).hexdigest()
                    for img in data_batch['inputs']])
        with open(osp.join(runner.work_dir, 'probe.jsonl'), 'a') as file:
            file.write(json.dumps(record) + '\n')
