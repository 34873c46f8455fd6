"""Generate the demo image-classification set: real JPEGs of mixed sizes.

Each class is a shape drawn on a noisy gradient background, so a small CNN
learns it in a few hundred CPU iterations, while the files look like a real
workload: many small images plus camera-sized frames (720p and 1080p) whose
decode dominates the loader, as in the production sets this package is for.
"""
import os
import os.path as osp
from typing import Dict, List, Sequence, Tuple

import cv2
import numpy as np

CLASSES = ('circle', 'square', 'triangle', 'ring', 'cross', 'diamond',
           'horizontal bar', 'vertical bar')

# (share of the files, (width, height) or None for a random small size)
_SIZE_MIX = ((0.55, None), (0.25, (640, 480)), (0.12, (1280, 720)),
             (0.08, (1920, 1080)))


def _background(rng: np.random.Generator, width: int,
                height: int) -> np.ndarray:
    start, end = rng.integers(0, 256, (2, 3))
    ramp = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    img = start + (end - start) * ramp
    img = np.broadcast_to(img, (height, width, 3)).astype(np.float32)
    img = img + rng.normal(0.0, 10.0, (height, width, 3)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def _draw_shape(img: np.ndarray, label: int, rng: np.random.Generator) -> None:
    height, width = img.shape[:2]
    radius = int(min(height, width) * rng.uniform(0.18, 0.32))
    cx = int(rng.uniform(0.35, 0.65) * width)
    cy = int(rng.uniform(0.35, 0.65) * height)
    color = tuple(int(c) for c in rng.integers(0, 256, 3))
    thick = max(2, radius // 4)
    name = CLASSES[label]
    if name == 'circle':
        cv2.circle(img, (cx, cy), radius, color, -1)
    elif name == 'square':
        cv2.rectangle(img, (cx - radius, cy - radius), (cx + radius, cy + radius),
                      color, -1)
    elif name == 'triangle':
        pts = np.array([(cx, cy - radius), (cx - radius, cy + radius),
                        (cx + radius, cy + radius)], np.int32)
        cv2.fillPoly(img, [pts], color)
    elif name == 'ring':
        cv2.circle(img, (cx, cy), radius, color, thick)
    elif name == 'cross':
        cv2.line(img, (cx - radius, cy), (cx + radius, cy), color, thick)
        cv2.line(img, (cx, cy - radius), (cx, cy + radius), color, thick)
    elif name == 'diamond':
        pts = np.array([(cx, cy - radius), (cx + radius, cy),
                        (cx, cy + radius), (cx - radius, cy)], np.int32)
        cv2.fillPoly(img, [pts], color)
    elif name == 'horizontal bar':
        cv2.rectangle(img, (cx - radius, cy - thick), (cx + radius, cy + thick),
                      color, -1)
    else:
        cv2.rectangle(img, (cx - thick, cy - radius), (cx + thick, cy + radius),
                      color, -1)


def _image_size(rng: np.random.Generator, max_side: int) -> Tuple[int, int]:
    shares = np.array([share for share, _ in _SIZE_MIX])
    _, size = _SIZE_MIX[rng.choice(len(_SIZE_MIX), p=shares / shares.sum())]
    if size is None:
        size = tuple(int(s) for s in rng.integers(96, 400, 2))
    scale = min(1.0, max_side / max(size))
    return max(32, int(size[0] * scale)), max(32, int(size[1] * scale))


def _write_split(root: str, split: str, num: int, rng: np.random.Generator,
                 max_side: int, quality: int) -> List[str]:
    lines = []
    for idx in range(num):
        label = idx % len(CLASSES)
        # Every 7th file goes to a folder with a space in its name, so that
        # the demo keeps exercising paths with spaces.
        folder = CLASSES[label] + (' extra' if idx % 7 == 3 else '')
        rel_path = f'{split}/{folder}/{split}_{idx:06d}.jpg'
        width, height = _image_size(rng, max_side)
        img = _background(rng, width, height)
        _draw_shape(img, label, rng)
        os.makedirs(osp.join(root, osp.dirname(rel_path)), exist_ok=True)
        ok, data = cv2.imencode('.jpg', img,
                                [cv2.IMWRITE_JPEG_QUALITY, quality])
        assert ok, f'cv2 failed to encode {rel_path}'
        data.tofile(osp.join(root, rel_path))
        lines.append(f'{rel_path} {label}\n')
    order = rng.permutation(num)
    with open(osp.join(root, f'{split}.txt'), 'w', encoding='utf-8') as f:
        f.writelines(lines[i] for i in order)
    return lines


def make_demo_dataset(root: str,
                      num_train: int = 512,
                      num_val: int = 128,
                      max_side: int = 1920,
                      quality: int = 90,
                      seed: int = 0,
                      splits: Sequence[str] = ('train', 'val')
                      ) -> Dict[str, str]:
    """Write the demo set under ``root``.

    Args:
        root (str): Output folder; created if missing.
        num_train (int): Number of training images.
        num_val (int): Number of validation images.
        max_side (int): Cap on the longer image side (tests use small
            images to stay fast).
        quality (int): JPEG quality.
        seed (int): Seed of everything random in the set.
        splits (Sequence[str]): Which splits to write.

    Returns:
        dict: Annotation file path of each split.
    """
    rng = np.random.default_rng(seed)
    counts = dict(train=num_train, val=num_val)
    ann_files = {}
    for split in splits:
        _write_split(root, split, counts[split], rng, max_side, quality)
        ann_files[split] = osp.join(root, f'{split}.txt')
    with open(osp.join(root, 'classes.txt'), 'w', encoding='utf-8') as f:
        f.writelines(f'{name}\n' for name in CLASSES)
    return ann_files
