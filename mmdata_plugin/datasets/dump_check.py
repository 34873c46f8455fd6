"""Check a dump: samples of a RankShardedDataset against the original's.

For K random indices, both datasets give ``get_data_info(i)`` (compared as
plain data) and ``prepare_data(i)`` through the same pipeline, each started
from the same seeded global RNG states, so random augmentations draw alike.
Outputs are compared structurally: tensors and arrays by shape, dtype and
value, data samples (``DetDataSample``, ``SegDataSample`` ...), boxes and
masks field by field, so a difference is named by where it is
(``data_samples.gt_instances.bboxes``).
"""
import math
import random
import re
from typing import Any, List, NamedTuple

import numpy as np
import torch

from ..utils.seeding import mix_seed, preserved_global_rngs, seed_global_rngs
from .data_list_dump import NotPlainRecordError, plain

# Differences listed per sample before the rest are only counted.
_MAX_LISTED = 8


class SampleCheck(NamedTuple):
    """What was found for one sample index.

    ``differences`` empty: identical. ``made_plain``: where the original
    has a numpy value (or a tuple) and the dump the equal plain value, as
    the dump writes them; not a difference, but a pipeline step that
    needs the numpy type would show up here first.
    """
    index: int
    differences: List[str]
    made_plain: List[str]


def check_dump(original,
               sharded,
               count: int,
               seed: int = 0) -> List[SampleCheck]:
    """Compare ``count`` random samples of ``sharded`` with ``original``.

    Args:
        original: The source dataset (built from its config).
        sharded: The ``RankShardedDataset`` over the dump, with the same
            pipeline.
        count (int): Samples to compare (all of them if fewer).
        seed (int): Seed of the choice of samples and of their RNG states.

    Returns:
        list[SampleCheck]: One per sample, in index order; the first, with
        index -1, holds dataset-level differences (length, metainfo).
    """
    dataset_level = []
    if len(sharded) != len(original):
        dataset_level.append(f'length: {len(original)} vs {len(sharded)}')
    differences('metainfo', plain(dict(original.metainfo), 'metainfo'),
                plain(dict(sharded.metainfo), 'metainfo'), dataset_level,
                [])
    checks = [SampleCheck(-1, dataset_level, [])]
    size = min(len(original), len(sharded))
    for index in sorted(random.Random(seed).sample(range(size),
                                                   min(count, size))):
        found: List[str] = []
        made_plain: List[str] = []
        differences('data_info', plain(original.get_data_info(index),
                                       'data_info'),
                    sharded.get_data_info(index), found, made_plain)
        samples = []
        for name, dataset in (('original', original), ('dump', sharded)):
            try:
                samples.append(_prepared(dataset, index, seed))
            except Exception as error:
                found.append(f'sample: the pipeline raised on the {name}: '
                             f'{type(error).__name__}: {error}')
        if len(samples) == 2:
            differences('sample', *samples, found, made_plain)
        checks.append(SampleCheck(index, found, made_plain))
    return checks


def _prepared(dataset, index: int, seed: int) -> Any:
    with preserved_global_rngs():
        seed_global_rngs(mix_seed(seed, index))
        return dataset.prepare_data(index)


def differences(where: str, a: Any, b: Any, found: List[str],
                made_plain: List[str]) -> None:
    """Append to ``found`` how ``b`` differs from ``a`` (``where`` first),
    to ``made_plain`` where ``b`` is ``a`` made plain."""
    if type(a) is not type(b):
        if _plain_or_none(a, where) == b and b is not None:
            made_plain.append(where)
        else:
            found.append(
                f'{where}: {type(a).__name__} {_short(a)} vs '
                f'{type(b).__name__} {_short(b)}')
    elif isinstance(a, torch.Tensor):
        _array_differences(where, a.detach().cpu().numpy(),
                           b.detach().cpu().numpy(), found)
    elif isinstance(a, np.ndarray):
        _array_differences(where, a, b, found)
    elif isinstance(a, dict):
        if a.keys() != b.keys():
            found.append(f'{where}: keys {sorted(map(str, a))} vs '
                         f'{sorted(map(str, b))}')
        for key in a.keys() & b.keys():
            differences(f'{where}.{key}', a[key], b[key], found, made_plain)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            found.append(f'{where}: {len(a)} items vs {len(b)}')
        for i, (x, y) in enumerate(zip(a, b)):
            differences(f'{where}[{i}]', x, y, found, made_plain)
    elif isinstance(a, (set, frozenset)):
        if a != b:
            found.append(f'{where}: {sorted(a)} vs {sorted(b)}')
    elif isinstance(a, float):
        if not (a == b or (math.isnan(a) and math.isnan(b))):
            found.append(f'{where}: {a!r} vs {b!r}')
    elif hasattr(a, '__dict__') and not callable(a):
        # Data samples, instance/pixel data, boxes, masks: field by field.
        differences(where, vars(a), vars(b), found, made_plain)
    elif a != b:
        found.append(f'{where}: {_short(a)} vs {_short(b)}')


def _plain_or_none(value: Any, where: str) -> Any:
    try:
        return plain(value, where)
    except NotPlainRecordError:
        return None


def _array_differences(where: str, a: np.ndarray, b: np.ndarray,
                       found: List[str]) -> None:
    if a.shape != b.shape:
        found.append(f'{where}: shape {a.shape} vs {b.shape}')
    elif a.dtype != b.dtype:
        found.append(f'{where}: dtype {a.dtype} vs {b.dtype}')
    elif not np.array_equal(a, b, equal_nan=a.dtype.kind in 'fc'):
        unequal = np.count_nonzero(a != b)
        text = f'{where}: {unequal} of {a.size} values differ'
        if a.dtype.kind in 'iuf':
            gap = np.nanmax(
                np.abs(a.astype(np.float64) - b.astype(np.float64)))
            text += f' (max |difference| {gap:g})'
        found.append(text)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + '...'


def format_check(checks: List[SampleCheck]) -> str:
    """The report ``tools/dump_data_list.py --check`` prints."""
    samples = checks[1:]
    lines = [f'  dataset: {"; ".join(checks[0].differences)}'
             ] if checks[0].differences else []
    differing = [check for check in samples if check.differences]
    for check in differing:
        shown = check.differences[:_MAX_LISTED]
        more = len(check.differences) - len(shown)
        lines.append(f'  sample {check.index}: ' + '; '.join(shown) +
                     (f'; and {more} more' if more else ''))
    verdict = (f'--check: {len(samples) - len(differing)} of {len(samples)} '
               'samples identical (data info and pipeline output)')
    if not checks[0].differences and not differing:
        verdict += ', dataset length and metainfo equal'
    made_plain = sorted({
        re.sub(r'\[\d+\]', '[*]', where)
        for check in samples for where in check.made_plain
    })
    if made_plain:
        lines.append('  numpy values or tuples of the original that the dump '
                     'holds as equal plain values (not differences): ' +
                     ', '.join(made_plain))
    return '\n'.join([verdict] + lines)
