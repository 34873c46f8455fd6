"""The pipeline head cache in DataMonitor reports: its hits and misses, and
the advice to add one where loading, decoding and resizing dominate.

:func:`read_head_cache` reads the figures and :func:`add_head_cache` puts
them into a report; the hook does both for the reports it builds. The
counters are the node store's, summed over all ranks
and workers of this node since the pipeline was built, read in the process
that builds the report.
"""
from typing import Iterable, List, Optional, Sequence

from ..cache.size_units import format_size
from ..transforms.cached_pipeline_head import (DETERMINISTIC_TYPES,
                                               CachedPipelineHead)
from ..transforms.decode_target import (LOADER_TYPES, RESIZE_RULES,
                                        decode_target, transform_type)
from .instrument import iter_pipelines
from .verdict import MODERATE, stage_costs
from .worker_timing import TimedTransform

#: Share of worker time that loading, decoding and resizing must reach for
#: the advice to recommend caching them.
DOMINANT_SHARE = 0.5
_RANDOM_RESIZES = ('RandomResize', 'RandomChoiceResize')


def find_cached_heads(dataset) -> List[CachedPipelineHead]:
    """Every CachedPipelineHead in the dataset tree's pipelines."""
    heads = []

    def visit(transforms):
        for transform in transforms:
            if isinstance(transform, TimedTransform):
                transform = transform.transform
            if isinstance(transform, CachedPipelineHead):
                heads.append(transform)
            inner = getattr(transform, 'transforms', None)
            if isinstance(inner, list):
                visit(inner)

    for _, _, transforms in iter_pipelines(dataset):
        visit(transforms)
    return heads


def head_cache_summary(
        heads: Sequence[CachedPipelineHead]) -> Optional[dict]:
    """Counters and bytes of the heads' stores (None without a head)."""
    if not heads:
        return None
    stores = {head.store.cache_dir: head for head in heads}
    summary = dict(cache_dirs=sorted(stores), committed_bytes=0, limit=0)
    for head in stores.values():
        for name, value in head.counters().items():
            summary[name] = summary.get(name, 0) + value
        usage = head.store.usage()
        summary['committed_bytes'] += usage.committed_bytes
        summary['limit'] += usage.limit
    looked_up = summary['hits'] + summary['misses']
    summary['hit_ratio'] = summary['hits'] / looked_up if looked_up else 0.0
    return summary


def read_head_cache(dataset) -> Optional[dict]:
    """:func:`head_cache_summary` of the heads in ``dataset``'s pipelines."""
    return head_cache_summary(find_cached_heads(dataset))


def format_head_cache(summary: dict) -> str:
    """One line for the log."""
    return (f"Head cache (CachedPipelineHead, node store "
            f"{', '.join(summary['cache_dirs'])}): {summary['hits']} hits, "
            f"{summary['misses']} misses ({100 * summary['hit_ratio']:.1f}% "
            f"hits), {summary['produced']} written, {summary['bypassed']} "
            f"not stored (budget), {summary['evicted_entries']} evicted; "
            f"{format_size(summary['committed_bytes'])} of "
            f"{format_size(summary['limit'])} used.")


def head_cache_advice(report: dict,
                      pipeline_cfg: Optional[Sequence]) -> Optional[str]:
    """Recommend CachedPipelineHead, with config lines, when loading,
    decoding and resizing take most of the worker time of an input-bound
    run that has none; None otherwise."""
    verdict = report.get('verdict', {})
    if not pipeline_cfg or verdict.get('wait_share', 0.0) < MODERATE:
        return None
    rank = next((r for r in report['ranks']
                 if r['rank'] == verdict.get('worst_rank', 0)), None)
    if rank is None or not rank['worker']['mean']:
        return None
    # self times: file reads and decodes are charged to their own stages,
    # the rest of the loaders' and resizes' time to them
    cost = sum(ms for key, ms in stage_costs(rank).items()
               if key in ('io', 'decode')
               or _is_head_work(key.rsplit('_', 1)[-1]))
    share = cost / rank['worker']['mean']
    lines = suggested_head(pipeline_cfg)
    if share < DOMINANT_SHARE or lines is None:
        return None
    return (f'Loading, decoding and resizing take {100 * share:.0f}% of '
            f'worker time ({cost:.1f} ms per batch), every epoch again. '
            'Cache the deterministic head of the pipeline once per node '
            '(CachedPipelineHead; lossless with storage=\'raw\' or '
            "'png'); start train_pipeline with:\n" + lines)


def _is_head_work(name: str) -> bool:
    return (name in LOADER_TYPES or name in RESIZE_RULES
            or name.startswith('Load'))


def suggested_head(pipeline_cfg: Sequence) -> Optional[str]:
    """Config lines that put the pipeline's head in a CachedPipelineHead.

    The head is the loader and the deterministic transforms after it; a
    random resize right after the loader gets a deterministic resize to its
    largest output in front of it, which the cache can hold.
    """
    cfgs, after_wrapper = list(pipeline_cfg), []
    wrap = bool(cfgs) and transform_type(cfgs[0]) == 'ReducedDecodePipeline'
    if wrap:  # the head decodes reduced then
        cfgs, after_wrapper = list(cfgs[0]['transforms']), cfgs[1:]
    if not cfgs or transform_type(cfgs[0]) not in LOADER_TYPES:
        return None
    head, taken = [], 0
    for cfg in cfgs:
        name = transform_type(cfg)
        if name in DETERMINISTIC_TYPES and name != 'ReducedDecodePipeline':
            head.append(dict(cfg))
            taken += 1
            continue
        if name in _RANDOM_RESIZES and len(head) == 1:
            target = decode_target(cfg)
            head.append(dict(type='Resize', **target))
        break
    rest = ', '.join(
        transform_type(cfg) for cfg in cfgs[taken:] + after_wrapper)
    pad = ' ' * (12 if wrap else 8)
    inner = ',\n'.join(pad + _cfg_text(c) for c in head)
    if wrap:
        inner = ("        dict(type='ReducedDecodePipeline', transforms=[\n" +
                 inner + '])')
    return ("dict(type='CachedPipelineHead', cache_limit='50GB', "
            "storage='raw',\n     transforms=[\n" + inner + ']),\n'
            f'... then, unchanged: {rest or "(nothing)"}')


def _cfg_text(cfg: dict) -> str:
    args = ', '.join(f'{k}={v!r}' for k, v in cfg.items() if k != 'type')
    return f"dict(type={cfg['type']!r}{', ' + args if args else ''})"


def add_head_cache(report: dict,
                   summary: Optional[dict],
                   pipeline_cfg: Optional[Iterable] = None) -> dict:
    """Add the head cache's line (and advice) to a DataMonitor report.

    Sets ``report['head_cache']`` to ``summary`` (see
    :func:`head_cache_summary`; None without a head), appends its line to
    the verdict's summary, and adds advice ``topic='head_cache'``.
    """
    report['head_cache'] = summary
    if summary is not None:
        report['verdict']['summary'] += '\n' + format_head_cache(summary)
        return report
    advice = head_cache_advice(report, pipeline_cfg)
    if advice:
        report['advice'].append(dict(topic='head_cache', text=advice))
    return report
