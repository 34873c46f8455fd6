"""Decode once: cache the deterministic head of a pipeline on the node."""
import hashlib
import json
import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Union

import cv2
import mmcv
import mmengine.fileio as fileio
import numpy as np
from mmcv.transforms import BaseTransform, Compose
from mmengine.registry import TRANSFORMS

from ..cache.head_entry_format import (CODECS, decode_head_entry,
                                       encode_head_entry)
from ..cache.head_sources import HeadSources
from ..cache.node_store import NodeStore, default_cache_dir
from .decode_target import transform_type

NAMESPACE = 'head'
#: Bump when what an entry means changes: old entries become misses.
ENTRY_VERSION = 2

#: Transforms whose output depends only on their input and config. The
#: check is by registered type name (scope prefix dropped); transforms that
#: hold a ``transforms`` list are checked recursively.
DETERMINISTIC_TYPES = frozenset({
    'LoadImageFromFile', 'LoadImageFromFileReduced', 'LoadAnnotations',
    'Resize', 'ResizeEdge', 'FixShapeResize', 'FixScaleResize', 'CenterCrop',
    'Pad', 'Normalize', 'ReducedDecodePipeline', 'Compose', 'KeyMapper'
})
#: Names that say "random" (mmcv, mmdet, mmpretrain, mmpose, albumentations
#: idioms); refused with a message saying so.
_RANDOM_NAME = re.compile(
    r'Random|Rand|Jitter|Augment|Mosaic|MixUp|CutMix|Cutout|CutOut|Albu|'
    r'PhotoMetric|Lighting|Expand|MinIoU|YOLOX|Blur|Noise|Erasing',
    re.IGNORECASE)
#: Keys of the sample that describe its position, not its content.
POSITION_KEYS = ('sample_idx', )
#: Input values a transform can change without replacing them.
_MUTABLE = (list, dict, np.ndarray)


def check_deterministic(transforms: Sequence, extra_types: Iterable[str] = (),
                        where: str = 'CachedPipelineHead.transforms') -> None:
    """Refuse a transform that may draw random numbers, naming it.

    A transform is accepted when its type is in :data:`DETERMINISTIC_TYPES`
    or in ``extra_types`` (the user's word for their own transforms); a
    nested ``transforms`` list is checked the same way. Anything else is
    refused: a cached head replays its first output forever, so an unknown
    transform that draws a crop, a flip or a colour change would silently
    freeze that draw for every epoch.

    Raises:
        ValueError: names the first such transform and where it is.
    """
    allowed = DETERMINISTIC_TYPES | set(extra_types)
    for index, cfg in enumerate(transforms):
        name = transform_type(cfg)
        here = f'{where}[{index}] ({name})'
        if not isinstance(cfg, dict):
            raise ValueError(
                f'{here} is a built transform; CachedPipelineHead needs '
                'configs (dicts) to fingerprint what it caches')
        if name not in allowed:
            reason = ('is random' if _RANDOM_NAME.search(name) else
                      'is not known to be deterministic')
            raise ValueError(
                f'{here} {reason}: a cached pipeline head would freeze its '
                'first output for every epoch. Move it after '
                'CachedPipelineHead; if it is deterministic, add '
                f"deterministic_types=['{name}'] to the wrapper.")
        if 'transforms' in cfg:
            check_deterministic(cfg['transforms'], extra_types,
                                f'{here}.transforms')


def _canonical(value, where: str):
    """``value`` as JSON-able data with one spelling per meaning."""
    if isinstance(value, dict):
        return {str(k): _canonical(v, f'{where}.{k}')
                for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, where) for v in value]
    if isinstance(value, type):
        return f'{value.__module__}.{value.__qualname__}'
    if isinstance(value, np.ndarray):
        return {'array': [value.dtype.str, list(value.shape),
                          hashlib.sha256(value.tobytes()).hexdigest()]}
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(
        f'{where}: a {type(value).__name__} cannot be part of a cache key '
        '(numbers, strings, lists, dicts and numpy arrays can)')


def _digest(value, where: str) -> str:
    return hashlib.sha256(
        json.dumps(_canonical(value, where), sort_keys=True,
                   allow_nan=True).encode()).hexdigest()


@TRANSFORMS.register_module()
class CachedPipelineHead(BaseTransform):
    """Run deterministic transforms once per sample; later epochs read back.

    Wrap the head of a train pipeline -- the image loader and what follows
    it up to the first random transform (a deterministic resize, a crop to
    a fixed box, a colour conversion) -- in this transform. The first time a
    sample passes, the inner transforms run and what they changed in the
    sample is stored in the node store (:class:`~mmdata_plugin.cache.
    NodeStore`, namespace ``'head'``) shared by all ranks and DataLoader
    workers of the node; afterwards it is read back instead of loading,
    decoding and resizing again.

    What comes out is what the inner transforms return: ``img``,
    ``img_shape``, ``ori_shape``, ``scale_factor`` and any annotations they
    loaded or rescaled (numpy ``gt_bboxes``, ``gt_keypoints``,
    ``gt_seg_map``, ...). ``max_side`` shrinks the stored image (area
    interpolation) and rescales those fields to match.

    The image is stored ``'raw'`` (bitwise), ``'png'`` (bitwise, about
    2-3x smaller, slower to write and read) or ``'jpeg'`` (``quality``,
    chroma not subsampled; lossy). With lossless storage a sample is the
    same bit for bit whether the cache was cold, warm or full (what
    FastResume's exact resume needs); with 'jpeg' a miss returns the exact
    pixels and a hit the stored JPEG's (docs/head_cache.md gives the PSNR).

    Key of an entry: the image file's path, size and modification time (or
    size and ETag from the storage backend's ``stat(path)`` for remote
    paths, as mmdata_plugin's S3/HTTP backends give; or the URL alone with
    ``check_remote_source=False``), a digest of the
    other input keys (so changed annotations are a miss; ``sample_idx`` is
    left out), and a fingerprint of the inner transforms' configs, the
    storage settings and the mmcv/OpenCV versions.

    Randomness: inner transforms must have a type known to be deterministic
    (:data:`DETERMINISTIC_TYPES`) or be named in ``deterministic_types``;
    any other one is refused when the wrapper is built (see
    :func:`check_deterministic`).

    Args:
        transforms (list[dict]): The inner transforms, as configs.
        cache_dir (str, optional): The node store directory (shared with the
            remote-storage cache). Defaults to
            :func:`~mmdata_plugin.cache.default_cache_dir`
            (``$MMDATA_CACHE_DIR`` or ``~/.cache/mmdata_plugin``).
        cache_limit (int | str): Byte budget of the store, e.g. '20GB'.
            When full, the least recently used entries are evicted.
            Defaults to '20GB'.
        storage (str): 'raw', 'png' or 'jpeg'. Defaults to 'raw'.
        quality (int): JPEG quality (1-100). Defaults to 95.
        max_side (int, optional): Shrink images whose longer side exceeds
            it before storing (FFCV's ``max_resolution``). Defaults to None.
        deterministic_types (list[str]): Further transform types to trust as
            deterministic.
        png_compression (int): PNG compression level 0-9. Defaults to 1
            (fast; higher levels save little on photos).
        check_remote_source (bool): Ask the remote for a remote image's
            size and ETag at every read (one HEAD request per sample and
            epoch, no download), so an object changed under its URL is a
            miss. False keys remote entries by the URL alone: a hit makes
            no request at all, and an object changed under the same URL
            keeps being served from its old entry; for write-once data
            (versioned buckets, content-addressed names). Local files are
            always checked. Defaults to True.
    """

    def __init__(self,
                 transforms: Sequence[dict],
                 cache_dir: Optional[str] = None,
                 cache_limit: Union[int, str] = '20GB',
                 storage: str = 'raw',
                 quality: int = 95,
                 max_side: Optional[int] = None,
                 deterministic_types: Sequence[str] = (),
                 png_compression: int = 1,
                 check_remote_source: bool = True) -> None:
        if storage not in CODECS:
            raise ValueError(f'CachedPipelineHead.storage must be one of '
                             f'{CODECS}, got {storage!r}')
        if not 1 <= quality <= 100:
            raise ValueError(f'CachedPipelineHead.quality must be in 1..100, '
                             f'got {quality}')
        if max_side is not None and max_side < 1:
            raise ValueError(f'CachedPipelineHead.max_side must be >= 1, got '
                             f'{max_side}')
        transforms = list(transforms)
        check_deterministic(transforms, deterministic_types)
        self.pipeline = Compose(transforms)
        # the list DataMonitor's per-transform timing looks for
        self.transforms = self.pipeline.transforms
        self.storage = storage
        self.quality = quality
        self.max_side = max_side
        self.png_compression = png_compression
        self.check_remote_source = check_remote_source
        self.backend_args = _loader_backend_args(transforms)
        self.fingerprint = _digest(
            dict(version=ENTRY_VERSION, transforms=transforms,
                 storage=storage, quality=quality if storage == 'jpeg' else
                 None, max_side=max_side,
                 png_compression=png_compression if storage == 'png' else
                 None, mmcv=mmcv.__version__, opencv=cv2.__version__),
            'CachedPipelineHead')
        self.store = NodeStore(cache_dir or default_cache_dir(), cache_limit)
        # the store's counters are the node's since it was created; a run
        # reports its own (see counters())
        self._counts_at_build = self.store.counters(NAMESPACE)
        self.sources: Optional[HeadSources] = None

    def record_sources(self) -> HeadSources:
        """From now on, link each source path to the entry that serves it,
        so that a node cache prefetcher does not download the files this
        head serves (:mod:`~mmdata_plugin.cache.head_sources`); the links.
        Call before the DataLoader workers start (they get a copy)."""
        self.sources = HeadSources(self.store.cache_dir, self.fingerprint)
        return self.sources

    # -- keys ---------------------------------------------------------------

    def sample_key(self, results: dict) -> str:
        """The store key of a sample (raises if its source is unknown)."""
        if 'img_path' not in results:
            raise KeyError(
                'CachedPipelineHead keys entries by the image file; the '
                f'sample has no img_path (keys: {sorted(results)})')
        inputs = {
            k: v
            for k, v in results.items()
            if k not in POSITION_KEYS and k != 'img_path'
        }
        return '|'.join((self.fingerprint, self._source(results['img_path']),
                         _digest(inputs, 'sample')))

    def _source(self, path: str) -> str:
        if self.backend_args is None and '://' not in path:
            return _local_source(path)
        backend = fileio.get_file_backend(
            path, backend_args=self.backend_args, enable_singleton=True)
        if type(backend).__name__ == 'LocalBackend':
            return _local_source(path)
        if not self.check_remote_source:
            # The user's word that the object never changes: the round trip
            # a stat costs is what a hit would otherwise wait for.
            return f'{path}|unchecked'
        stat = getattr(backend, 'stat', None)
        # mmdata_plugin's remote backends: stat(path) -> size and ETag
        found = stat(path) if callable(stat) else None
        if getattr(found, 'etag', None) is None:
            raise ValueError(
                f'CachedPipelineHead cannot tell whether {path} changed: its '
                f'storage backend {type(backend).__name__} gives no ETag '
                '(stat(path).etag)')
        return f'{path}|{found.size}|etag={found.etag}'


    # -- transform ----------------------------------------------------------

    def transform(self, results: dict) -> Optional[dict]:
        key = self.sample_key(results)
        # A damaged entry is evicted and comes back as None: produced again
        # below, it is replaced.
        entry = self.store.read_bytes(NAMESPACE, key, decode_head_entry)
        if entry is not None:
            self._record_source(results['img_path'], key)
            return _apply(entry, results)
        self._record_source(results['img_path'], key, producing=True)
        before = dict(results)
        # A transform may change an input in place (mmseg's LoadAnnotations
        # appends to seg_fields): those keys changed too.
        contents = {
            k: _digest(v, k)
            for k, v in before.items() if isinstance(v, _MUTABLE)
        }
        results = self.pipeline(results)
        if results is None:
            return None
        if self.max_side is not None:
            _bound_longer_side(results, self.max_side)
        changed = {
            k: v
            for k, v in results.items()
            if k not in before or before[k] is not v or (
                k in contents and _digest(v, k) != contents[k])
        }
        removed = [k for k in before if k not in results]
        data = encode_head_entry(changed, removed, self.storage,
                                 self.quality, self.png_compression)
        self.store.publish_bytes(NAMESPACE, key, data)
        return results

    def _record_source(self, path: str, key: str,
                       producing: bool = False) -> None:
        if self.sources is not None:
            self.sources.record(path, self.store.entry_path(NAMESPACE, key),
                                producing)

    def fill(self, results: dict) -> bool:
        """Store the entry of a sample if missing; True if it was produced.

        For filling the cache ahead of a job (``tools/fill_head_cache.py``).
        """
        key = self.sample_key(results)
        if os.path.exists(self.store.entry_path(NAMESPACE, key)):
            return False
        return self.transform(results) is not None

    def counters(self) -> Dict[str, int]:
        """Hits, misses, ... of the 'head' namespace in every process on
        this node since this transform was built."""
        now = self.store.counters(NAMESPACE)
        return {k: v - self._counts_at_build.get(k, 0) for k, v in now.items()}

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(storage={self.storage!r}, '
                f'quality={self.quality}, max_side={self.max_side}, '
                f'store={self.store!r}, transforms={self.pipeline!r})')


def _local_source(path: str) -> str:
    stat = os.stat(path)
    return f'{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}'


def _loader_backend_args(transforms: List[dict]) -> Optional[dict]:
    for cfg in transforms:
        if 'backend_args' in cfg:
            return cfg['backend_args']
        if 'transforms' in cfg:
            nested = _loader_backend_args(list(cfg['transforms']))
            if nested is not None:
                return nested
    return None


def _apply(entry, results: dict) -> dict:
    for key in entry.removed:
        results.pop(key, None)
    results.update(entry.fields)
    return results


def _bound_longer_side(results: dict, max_side: int) -> None:
    """Shrink ``img`` to ``max_side`` and keep geometry and annotations
    consistent with it."""
    img = results['img']
    height, width = img.shape[:2]
    if max(height, width) <= max_side:
        return
    ratio = max_side / max(height, width)
    new_w = max(1, round(width * ratio))
    new_h = max(1, round(height * ratio))
    results['img'] = cv2.resize(img, (new_w, new_h),
                                interpolation=cv2.INTER_AREA)
    results['img_shape'] = (new_h, new_w)
    sx, sy = new_w / width, new_h / height
    if 'scale_factor' in results:
        w_scale, h_scale = results['scale_factor']
        results['scale_factor'] = (w_scale * sx, h_scale * sy)
    else:
        ori_h, ori_w = results.get('ori_shape', (height, width))
        results['scale_factor'] = (new_w / ori_w, new_h / ori_h)
    _scale_annotations(results, sx, sy, (new_h, new_w))


def _scale_annotations(results: dict, sx: float, sy: float,
                       shape: tuple) -> None:
    boxes = results.get('gt_bboxes')
    if isinstance(boxes, np.ndarray):
        results['gt_bboxes'] = (boxes * np.array(
            [sx, sy, sx, sy], dtype=np.float64)).astype(boxes.dtype)
    elif boxes is not None:
        raise TypeError('CachedPipelineHead(max_side=...) rescales numpy '
                        f'gt_bboxes; got {type(boxes).__name__}')
    keypoints = results.get('gt_keypoints')
    if keypoints is not None:
        keypoints = np.array(keypoints, copy=True)
        keypoints[..., :2] = keypoints[..., :2] * np.array([sx, sy])
        results['gt_keypoints'] = keypoints
    seg_map = results.get('gt_seg_map')
    if seg_map is not None:
        results['gt_seg_map'] = mmcv.imresize(
            seg_map, (shape[1], shape[0]), interpolation='nearest')
    masks = results.get('gt_masks')
    if isinstance(masks, np.ndarray):  # (N, H, W) bitmaps
        results['gt_masks'] = np.stack([
            mmcv.imresize(m, (shape[1], shape[0]), interpolation='nearest')
            for m in masks
        ]) if len(masks) else masks.reshape(0, *shape)
    elif masks is not None:
        raise TypeError('CachedPipelineHead(max_side=...) rescales numpy '
                        f'gt_masks; got {type(masks).__name__}')
