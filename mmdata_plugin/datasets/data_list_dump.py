"""Any registered dataset -> the JSON Lines file of a RankShardedDataset.

A downstream dataset (mmdet's ``CocoDataset``, mmseg's ``ADE20KDataset``,
mmpretrain's ``ImageNet``, a custom ``BaseDataset``) knows how to parse its
own annotation format; what ``RankShardedDataset`` needs is the result of
that parsing, one ``get_data_info(i)`` per line. This module writes exactly
that, in bounded memory (one record at a time), with the paths cut to what
follows the dataset's ``data_prefix`` so that the new config's
``data_root``/``data_prefix`` join them back, and describes the config
that reads the file.
"""
import math
import numbers
import os.path as osp
from pathlib import PurePath
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
from mmengine.dataset import BaseDataset
from mmengine.fileio import join_path

from .jsonl_conversion import atomic_text_output, write_record
from .line_index import ByteProgressBar

# A numpy array with more elements than this is the sample's data (a decoded
# image, a dense mask), not an annotation: 1000 boxes or 100 x 17 keypoints
# fit, a 64 x 64 image does not.
MAX_ARRAY_ELEMENTS = 4096
# Samples read twice to tell records from samples made up on each call.
_DETERMINISM_PROBES = 3


class NotPlainRecordError(TypeError):
    """A dataset whose samples cannot be written as plain JSON records."""


class DumpResult(NamedTuple):
    """What :func:`dump_data_list` wrote.

    ``data_prefix`` maps record keys to the prefix (joined with the data
    root, as the dataset holds it) that was cut from their values.
    """
    num_samples: int
    data_prefix: Dict[str, str]
    metainfo: dict


def plain(value: Any, where: str) -> Any:
    """``value`` as JSON-ready data that reads back equal.

    numpy scalars and (small) arrays become numbers and lists, tuples
    become lists, paths become strings.

    Raises:
        NotPlainRecordError: For what JSON cannot carry back unchanged:
            bytes, dicts with non-string keys, big arrays (sample data held
            in memory), NaN/inf, other objects. ``where`` names the value.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (numbers.Integral, np.integer)):
        return int(value)
    if isinstance(value, (numbers.Real, np.floating)):
        if not math.isfinite(value):
            raise NotPlainRecordError(
                f'{where} is {value}, which JSON cannot hold')
        return float(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in 'biuf':
            raise NotPlainRecordError(
                f'{where} is a numpy array of dtype {value.dtype}; only '
                'numeric arrays can be written as lists')
        if value.size > MAX_ARRAY_ELEMENTS:
            raise NotPlainRecordError(
                f'{where} is a numpy array of shape {value.shape} (more '
                f'than {MAX_ARRAY_ELEMENTS} values): the dataset holds '
                'sample data in memory, not a record that '
                'points to files. RankShardedDataset reads records; write '
                'the arrays to files and put their paths in the records.')
        return plain(value.tolist(), where)
    if isinstance(value, dict):
        record = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotPlainRecordError(
                    f'{where} has the {type(key).__name__} key {key!r}; '
                    'JSON keys are strings, so it would read back as '
                    f'{str(key)!r} and the pipeline would look it up in '
                    'vain')
            record[key] = plain(item, f'{where}[{key!r}]')
        return record
    if isinstance(value, (list, tuple)):
        return [plain(item, f'{where}[{i}]') for i, item in enumerate(value)]
    kind = ('bytes: the dataset holds encoded data in memory'
            if isinstance(value, (bytes, bytearray, memoryview)) else
            f'a {type(value).__module__}.{type(value).__qualname__} object: '
            'samples decoded or built lazily cannot be written as records')
    raise NotPlainRecordError(f'{where} is {kind}')


def check_plain_dataset(dataset) -> None:
    """Refuse datasets whose samples are not ``pipeline(get_data_info(i))``.

    Raises:
        NotPlainRecordError: Saying why (no ``get_data_info``, its own
            ``prepare_data``/``__getitem__``, or records that change from
            one read to the next).
    """
    name = type(dataset).__name__
    if not callable(getattr(dataset, 'get_data_info', None)):
        raise NotPlainRecordError(
            f'{name} has no get_data_info(): its samples are made in '
            '__getitem__, not read from records, so there is nothing to '
            'write. RankShardedDataset serves datasets built on '
            "mmengine's BaseDataset.")
    if isinstance(dataset, BaseDataset):
        for method in ('prepare_data', '__getitem__'):
            if getattr(type(dataset), method) is not getattr(
                    BaseDataset, method):
                raise NotPlainRecordError(
                    f'{name} overrides BaseDataset.{method}(), so its '
                    'samples are not pipeline(get_data_info(i)) and a '
                    'RankShardedDataset over the written records would '
                    'serve other samples.')
    for idx in range(min(_DETERMINISM_PROBES, len(dataset))):
        first = _record_of(dataset, idx)
        if _record_of(dataset, idx) != first:
            raise NotPlainRecordError(
                f'{name}.get_data_info({idx}) returns a different record on '
                'each call: the samples are generated, not read, and a '
                'written copy would freeze one draw.')


def _record_of(dataset, idx: int) -> dict:
    data_info = dataset.get_data_info(idx)
    if not isinstance(data_info, dict):
        raise NotPlainRecordError(
            f'{type(dataset).__name__}.get_data_info({idx}) returned a '
            f'{type(data_info).__name__}, not a dict')
    record = plain(data_info, f'sample {idx}')
    # RankShardedDataset numbers its lines itself.
    record.pop('sample_idx', None)
    return record


class PathCutter:
    """Cuts the dataset's prefixes off path values, and checks it is exact.

    The keys to cut and their prefixes are chosen on the first record: each
    string value under one of the dataset's ``data_prefix`` values or its
    ``data_root`` (the longest that fits). Every later record must have
    those keys under the same prefixes, joined back exactly as
    ``RankShardedDataset`` will join them.

    Args:
        dataset: The source dataset (``data_root``, ``data_prefix``).
    """

    def __init__(self, dataset) -> None:
        candidates = [
            value for value in (getattr(dataset, 'data_prefix', None)
                                or {}).values()
            if isinstance(value, str) and value
        ]
        if getattr(dataset, 'data_root', None):
            candidates.append(dataset.data_root)
        self.candidates = sorted(set(candidates), key=len, reverse=True)
        self.prefixes: Optional[Dict[str, str]] = None

    def cut(self, record: dict, idx: int) -> dict:
        if self.prefixes is None:
            self.prefixes = {}
            for key, value in record.items():
                for prefix in self.candidates:
                    if isinstance(value, str) and self._relative(
                            value, prefix) is not None:
                        self.prefixes[key] = prefix
                        break
        for key, prefix in self.prefixes.items():
            value = record.get(key)
            relative = (self._relative(value, prefix)
                        if isinstance(value, str) else None)
            if relative is None:
                raise NotPlainRecordError(
                    f'sample {idx}: {key}={value!r} is not under {prefix!r} '
                    f'like the {key} of sample 0, so one data_prefix cannot '
                    'serve both. Pass --keep-paths to write the paths as '
                    'they are.')
            record[key] = relative
        return record

    @staticmethod
    def _relative(path: str, prefix: str) -> Optional[str]:
        for head in (prefix, prefix.rstrip('/') + '/'):
            if path.startswith(head) and len(path) > len(head):
                rest = path[len(head):]
                if join_path(prefix, rest) == path:
                    return rest
        return None


def dump_data_list(dataset,
                   out_path: str,
                   keep_paths: bool = False,
                   progress: bool = True) -> DumpResult:
    """Write ``get_data_info(i)`` of every sample as JSON Lines.

    The first line is ``{"metainfo": ...}`` (the dataset's, made plain),
    which ``RankShardedDataset`` reads for the keys its config leaves out.
    The file is written atomically; memory holds one record at a time.

    Args:
        dataset: A built dataset whose samples are plain records (its
            ``filter_cfg`` and ``indices`` already applied by building it).
        out_path (str): The ``.jsonl`` file to write.
        keep_paths (bool): Write path values as they are (no prefix cut).
        progress (bool): Show a progress bar on stderr.

    Raises:
        NotPlainRecordError: If the dataset or one of its records cannot be
            written (names the sample and the key).
    """
    check_plain_dataset(dataset)
    metainfo = plain(dict(getattr(dataset, 'metainfo', {}) or {}),
                     'metainfo')
    cutter = None if keep_paths else PathCutter(dataset)
    total = len(dataset)
    bar = ByteProgressBar(
        total, f'dumping {type(dataset).__name__}', progress, unit='samples')
    with atomic_text_output(out_path) as out:
        write_record(out, dict(metainfo=metainfo))
        for idx in range(total):
            record = _record_of(dataset, idx)
            if cutter is not None:
                record = cutter.cut(record, idx)
            write_record(out, record)
            if idx % 1024 == 0:
                bar.update(idx)
    bar.close()
    return DumpResult(total, dict(cutter.prefixes or {}) if cutter else {},
                      metainfo)


def relative_to_root(path: str, data_root: Optional[str]) -> str:
    """``path`` as a config value under ``data_root`` (absolute outside;
    unchanged without a data root)."""
    if not data_root:
        return path
    root = data_root.rstrip('/') + '/'
    if path.startswith(root):
        return path[len(root):]
    if osp.abspath(path).startswith(osp.abspath(data_root) + osp.sep):
        return osp.relpath(osp.abspath(path), osp.abspath(data_root))
    return osp.abspath(path)


def rank_sharded_dataset_config(dataset, dataset_cfg: dict, out_path: str,
                                result: DumpResult) -> dict:
    """The ``dataset`` config that reads the dump through the original
    pipeline (with the original ``metainfo`` argument, if any).

    Args:
        dataset: The source dataset, built.
        dataset_cfg (dict): Its config.
        out_path (str): Where the dump is.
        result (DumpResult): What the dump wrote.
    """
    data_root = getattr(dataset, 'data_root', None) or None
    config = dict(
        _delete_=True,
        type='RankShardedDataset',
        data_root=data_root,
        ann_file=relative_to_root(out_path, data_root),
        data_prefix={
            key: relative_to_root(prefix, data_root)
            if prefix != data_root else ''
            for key, prefix in result.data_prefix.items()
        })
    if data_root is None:
        del config['data_root']
    # indices and filter_cfg were applied by the dump; these were not.
    for key in ('metainfo', 'test_mode'):
        if dataset_cfg.get(key) is not None:
            config[key] = dataset_cfg[key]
    config['pipeline'] = dataset_cfg.get('pipeline', [])
    return config


# mmengine's samplers and ours for the same job, by config type name.
SAMPLER_REPLACEMENTS = dict(
    DefaultSampler='RankShardedSampler',
    InfiniteSampler='RankShardedInfiniteSampler')


def format_config_block(cfg, split: str, dataset_config: dict,
                        wrapper_path: Tuple[str, ...] = ()) -> str:
    """Python config text to paste into the new config.

    The pipeline is written as ``{{_base_.NAME}}`` when the source config
    has a top-level variable holding it (``train_pipeline`` ...), so the new
    config keeps inheriting it; otherwise in full.
    """
    dataloader = cfg.get(f'{split}_dataloader', {})
    pipeline = dataset_config['pipeline']
    pipeline_name = next(
        (name for name, value in cfg.items() if name.endswith('pipeline')
         and isinstance(value, list) and value == pipeline), None)
    body = dict(dataset_config)
    body['pipeline'] = _Raw(f'{{{{_base_.{pipeline_name}}}}}'
                            ) if pipeline_name else pipeline
    for key in reversed(wrapper_path):
        body = {key: body}
    lines = [f'{split}_dataloader = dict(']
    sampler = (dataloader.get('sampler') or {}).get('type')
    if sampler in SAMPLER_REPLACEMENTS:
        replacement = SAMPLER_REPLACEMENTS[sampler]
        lines.append(f"    sampler=dict(type='{replacement}'),")
    lines.append('    dataset=' + _format(body, 4) + ')')
    return '\n'.join(lines)


class _Raw(str):
    """Config text written without quotes."""


def _format(value: Any, indent: int) -> str:
    pad = ' ' * (indent + 4)
    if isinstance(value, _Raw):
        return str(value)
    if isinstance(value, dict):
        if not value:
            return 'dict()'
        items = [f'{pad}{key}={_format(item, indent + 4)}'
                 if str(key).isidentifier() else
                 f'{pad}**{{{key!r}: {_format(item, indent + 4)}}}'
                 for key, item in value.items()]
        return 'dict(\n' + ',\n'.join(items) + ')'
    if isinstance(value, (list, tuple)):
        if len(repr(value)) + indent < 76 and not any(
                isinstance(item, (dict, _Raw)) for item in value):
            return repr(value)
        items = [pad + _format(item, indent + 4) for item in value]
        text = ',\n'.join(items)
        return ('[\n' + text + ']') if isinstance(value, list) else (
            '(\n' + text + ',)')
    return repr(value)


def source_dataset(dataset, part: Optional[int]) -> Tuple[Any, tuple]:
    """The dataset to dump inside wrappers, and the config keys leading to
    it from the dataloader's dataset (``('dataset',)`` under
    ``RepeatDataset``, ``('dataset', 'datasets', 0)`` under a
    ``RepeatDataset`` of a ``ConcatDataset`` ...).

    Wrappers of one dataset are looked through; ``ConcatDataset`` needs
    ``part`` (which of its datasets).

    Raises:
        NotPlainRecordError: For a ConcatDataset without ``part`` (naming
            the alternative).
    """
    path: list = []
    while not isinstance(dataset, BaseDataset):
        datasets = getattr(dataset, 'datasets', None)
        if datasets is not None:
            if part is None or not 0 <= part < len(datasets):
                raise NotPlainRecordError(
                    f'{type(dataset).__name__} of {len(datasets)} datasets: '
                    'dump each with --part 0 .. '
                    f'{len(datasets) - 1} into its own file and list the '
                    'RankShardedDatasets in the same ConcatDataset '
                    f'(got --part {part}).')
            dataset = datasets[part]
            path += ['datasets', part]
            part = None
            continue
        inner = getattr(dataset, 'dataset', None)
        if inner is None:
            break
        dataset = inner
        path.append('dataset')
    return dataset, tuple(path)


def config_path_text(path: tuple) -> str:
    """``path`` as config text: ``.dataset.datasets[0]``."""
    return ''.join(f'[{key}]' if isinstance(key, int) else f'.{key}'
                   for key in path)
