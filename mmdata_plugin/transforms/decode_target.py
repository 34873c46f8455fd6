"""How large a reduced decode must be, read from a pipeline config.

Reduced decoding is exact only in front of a resize to an absolute size:
the output size of ``Resize(scale=(w, h))`` does not depend on the input
size (beyond its aspect ratio), so handing it a smaller image that is
still at least that size changes nothing but the time. A resize by a
relative ``scale_factor``, a crop in pixels or any other pixel-size
dependent transform would act differently on a reduced image, so they are
refused here.
"""
import math
import re
import warnings
from typing import Optional, Sequence, Tuple, Union

import mmcv

# Type names (scope prefixes stripped) of the image loaders this module
# can turn into LoadImageFromFileReduced.
LOADER_TYPES = ('LoadImageFromFile', 'LoadImageFromFileReduced')
# Transforms that only read or filter annotations may sit between the
# loader and the resize: annotations stay in original coordinates there.
_ANNOTATION_ONLY = re.compile(r'Load\w*Annotations|FilterAnnotations')
# A long-side bound that never binds: Resize(scale=(S, UNBOUNDED_SIDE),
# keep_ratio=True) sets the short side to S.
UNBOUNDED_SIDE = 1 << 20

Scale = Tuple[int, int]
# Image sizes (w, h) from 4:1 to 1:4 on which a loader's decode size is
# compared with a resize's output: both are monotonic in each side, so the
# extreme and middle aspect ratios find any shortfall of a (scale,
# keep_ratio) pair.
_PROBE_SIZES = ((4096, 1024), (4096, 2304), (4096, 3072), (4096, 4096),
                (3072, 4096), (2304, 4096), (1024, 4096))


def transform_type(cfg: Union[dict, object]) -> str:
    """The registered name of a transform config, scope prefix dropped."""
    if not isinstance(cfg, dict):
        return type(cfg).__name__
    kind = cfg.get('type', '')
    name = kind if isinstance(kind, str) else getattr(kind, '__name__', '')
    return name.rsplit('.', 1)[-1]


def locate_loader_and_resize(pipeline: Sequence[dict]) -> Tuple[int, int]:
    """Indices of the image loader and of the resize that follows it.

    Raises:
        ValueError: No loader, no resize after it, or a transform between
            them that depends on the image's pixel size.
    """
    names = [transform_type(cfg) for cfg in pipeline]
    loaders = [i for i, name in enumerate(names) if name in LOADER_TYPES]
    if not loaders:
        raise ValueError('the pipeline has no LoadImageFromFile to replace: '
                         f'{names}')
    loader = loaders[0]
    for index in range(loader + 1, len(names)):
        if _ANNOTATION_ONLY.fullmatch(names[index]):
            continue
        if names[index] not in RESIZE_RULES:
            raise ValueError(
                f'transform #{index} ({names[index]}) follows the image '
                'loader, but reduced decoding needs an absolute resize there '
                f'({", ".join(sorted(RESIZE_RULES))}; annotation loaders may '
                'come between). For other pipelines set scale on '
                'LoadImageFromFileReduced yourself, only where reduced pixels '
                'do not change what the transforms do.')
        return loader, index
    raise ValueError('no resize follows the image loader; a reduced decode '
                     'would change the output size')


def decode_target(resize_cfg: dict) -> dict:
    """``scale``/``keep_ratio`` for LoadImageFromFileReduced from a resize.

    The result is the largest output the resize can produce, so the decode
    is never smaller than any of its random draws.

    Args:
        resize_cfg (dict): Config of a ``Resize``, ``RandomResize``,
            ``RandomChoiceResize``, ``ResizeEdge`` (mmpretrain) or
            ``FixShapeResize`` (mmdet).

    Returns:
        dict: ``dict(scale=(w, h), keep_ratio=bool)``.
    """
    name = transform_type(resize_cfg)
    if name not in RESIZE_RULES:
        raise ValueError(f'cannot derive a decode size from {name}; '
                         f'supported: {", ".join(sorted(RESIZE_RULES))}')
    scale, keep_ratio = RESIZE_RULES[name](resize_cfg)
    return dict(scale=scale, keep_ratio=bool(keep_ratio))


def decode_target_from_pipeline(pipeline: Sequence[dict]) -> dict:
    """:func:`decode_target` of the resize following the image loader."""
    _, resize = locate_loader_and_resize(pipeline)
    return decode_target(pipeline[resize])


def _as_wh(scale: Union[int, Sequence[int]], where: str) -> Scale:
    if isinstance(scale, int):
        return scale, scale
    if (isinstance(scale, (tuple, list)) and len(scale) == 2
            and all(isinstance(side, int) for side in scale)):
        return tuple(scale)
    raise ValueError(f'{where}: expected an int or (w, h), got {scale!r}')


def _elementwise_max(scales: Sequence[Scale]) -> Scale:
    return max(s[0] for s in scales), max(s[1] for s in scales)


def _check_resize_type(cfg: dict) -> None:
    resize_type = transform_type(dict(type=cfg.get('resize_type', 'Resize')))
    if resize_type != 'Resize':
        raise ValueError(f'{transform_type(cfg)} with resize_type='
                         f'{resize_type!r}: only Resize is understood')


def _from_resize(cfg: dict) -> Tuple[Scale, bool]:
    if cfg.get('scale') is None:
        raise ValueError(
            'Resize without scale resizes by scale_factor, relative to the '
            'size it is given; a reduced decode would change its output. '
            'Give it an absolute scale or keep LoadImageFromFile.')
    return _as_wh(cfg['scale'], 'Resize.scale'), cfg.get('keep_ratio', False)


def _from_random_resize(cfg: dict) -> Tuple[Scale, bool]:
    _check_resize_type(cfg)
    scale = cfg['scale']
    ratio_range = cfg.get('ratio_range')
    if ratio_range is not None:
        width, height = _as_wh(scale, 'RandomResize.scale')
        top = max(ratio_range)
        largest = math.ceil(width * top), math.ceil(height * top)
    elif (isinstance(scale, (list, tuple)) and len(scale) == 2
          and all(isinstance(s, (list, tuple)) for s in scale)):
        largest = _elementwise_max(
            [_as_wh(s, 'RandomResize.scale') for s in scale])
    else:
        raise ValueError('RandomResize needs ratio_range, or a scale range '
                         f'[(w1, h1), (w2, h2)]; got scale={scale!r}')
    return largest, cfg.get('keep_ratio', False)


def _from_random_choice_resize(cfg: dict) -> Tuple[Scale, bool]:
    _check_resize_type(cfg)
    scales = cfg['scales']
    if not isinstance(scales, list):
        scales = [scales]
    largest = _elementwise_max(
        [_as_wh(s, 'RandomChoiceResize.scales') for s in scales])
    return largest, cfg.get('keep_ratio', False)


def _from_resize_edge(cfg: dict) -> Tuple[Scale, bool]:
    side = cfg['scale']
    edge = cfg.get('edge', 'short')
    rules = {
        'short': ((side, UNBOUNDED_SIDE), True),
        'long': ((side, side), True),
        # Without keep_ratio a scale is a lower bound per side.
        'width': ((side, 1), False),
        'height': ((1, side), False),
    }
    if edge not in rules:
        raise ValueError(f'ResizeEdge.edge must be one of {list(rules)}')
    return rules[edge]


def _from_fix_shape_resize(cfg: dict) -> Tuple[Scale, bool]:
    return (cfg['width'], cfg['height']), cfg.get('keep_ratio', False)


RESIZE_RULES = {
    'Resize': _from_resize,
    'RandomResize': _from_random_resize,
    'RandomChoiceResize': _from_random_choice_resize,
    'ResizeEdge': _from_resize_edge,
    'FixShapeResize': _from_fix_shape_resize,
}


def resize_output_size(scale: Scale, keep_ratio: bool, width: int,
                       height: int) -> Scale:
    """``(w, h)`` that mmcv's ``Resize(scale, keep_ratio)`` makes of an
    image of ``width`` x ``height``."""
    if keep_ratio:
        return mmcv.rescale_size((width, height), tuple(scale))
    return tuple(scale)


def warn_if_decode_too_small(pipeline: Sequence) -> None:
    """Warn where a ``LoadImageFromFileReduced`` decodes smaller than the
    resize after it outputs: the resize would upsample the reduced image.

    The ``scale`` a user gives the loader is kept (it may be meant, e.g.
    for a crop that follows), so this warns, naming both transforms and
    the scale to use, rather than changing it. Pipelines this module cannot
    read (built transforms, other transforms after the loader) are skipped.

    Args:
        pipeline (Sequence): Transform configs (dicts) or built transforms.
    """
    names = [transform_type(cfg) for cfg in pipeline]
    for index, name in enumerate(names):
        loader = pipeline[index]
        if name != 'LoadImageFromFileReduced' or not isinstance(
                loader, dict) or 'scale' not in loader:
            continue
        resize = _resize_after(pipeline, names, index)
        if resize is None:
            continue
        try:
            needed = decode_target(pipeline[resize])
        except (KeyError, TypeError, ValueError):
            continue  # not an absolute resize: nothing to compare with
        decoded = dict(
            scale=_as_wh(loader['scale'], 'LoadImageFromFileReduced.scale'),
            keep_ratio=bool(loader.get('keep_ratio', False)))
        for width, height in _PROBE_SIZES:
            got = resize_output_size(**decoded, width=width, height=height)
            need = resize_output_size(**needed, width=width, height=height)
            if got[0] < need[0] or got[1] < need[1]:
                warnings.warn(
                    f'transform #{index} LoadImageFromFileReduced('
                    f'scale={decoded["scale"]}, keep_ratio='
                    f'{decoded["keep_ratio"]}) decodes smaller than '
                    f'transform #{resize} {names[resize]} outputs (a '
                    f'{width}x{height} image: decoded to at least {got}, '
                    f'resized to up to {need}), so the resize upsamples a '
                    'reduced image and loses detail. Give the loader '
                    f'scale={needed["scale"]}, keep_ratio='
                    f'{needed["keep_ratio"]}, or wrap the pipeline in '
                    'ReducedDecodePipeline without a loader scale: it sizes '
                    'the decode from the resize.',
                    stacklevel=2)
                break


def _resize_after(pipeline: Sequence, names: Sequence[str],
                  loader: int) -> Optional[int]:
    """Index of the resize right after the loader (annotation loaders may
    come between), if it is a config this module reads."""
    for index in range(loader + 1, len(names)):
        if _ANNOTATION_ONLY.fullmatch(names[index]):
            continue
        if names[index] in RESIZE_RULES and isinstance(
                pipeline[index], dict):
            return index
        return None
    return None
