"""The node cache of remote data in DataMonitor reports: hit rate, remote
bytes, remote wait per batch, downloads in flight, evictions, bodies
rejected as corrupt, and advice that names ``cache_limit``,
``prefetch_reserve`` or ``max_inflight`` with a value when one of them holds
training back.

:func:`add_remote_cache` is the one entry point; the hook calls it on every
report it builds. Counters are the node store's (summed over the node's
ranks and workers); the gauges are the node prefetcher's status file.
"""
import json
import math
import os
from typing import Optional

from ..cache.node_store import NodeStore
from ..cache.size_units import format_size
from ..remote_cache.node_cache_backend import NAMESPACE, READS
from ..remote_cache.pipeline_routing import find_node_cache_args
from ..remote_cache.prefetcher import STATUS_FILE
from .verdict import MODERATE

#: Share of a rank's reads that must wait on the remote for advice.
WAITING_SHARE = 0.02


def remote_cache_summary(dataset, batches: int) -> Optional[dict]:
    """Counters and gauges of the node cache the dataset reads through
    (None when it reads through none).

    Args:
        dataset: The train dataset.
        batches (int): Batches this node's ranks have trained (for the
            remote wait per batch).
    """
    args = find_node_cache_args(dataset)
    if args is None or not os.path.isdir(args['cache_dir']):
        return None
    store = NodeStore(args['cache_dir'], args['cache_limit'])
    counts = store.counters()
    reads = counts.get(READS, {})
    remote = counts.get(NAMESPACE, {})
    hits, misses = reads.get('hits', 0), reads.get('misses', 0)
    summary = dict(
        cache_dir=args['cache_dir'],
        limit=store.limit,
        committed_bytes=store.usage().committed_bytes,
        hits=hits,
        misses=misses,
        hit_ratio=hits / (hits + misses) if hits + misses else 0.0,
        remote_bytes=remote.get('produced_bytes', 0),
        downloads=remote.get('produced', 0),
        evicted_entries=remote.get('evicted_entries', 0),
        evicted_bytes=remote.get('evicted_bytes', 0),
        corrupt=remote.get('corrupt', 0),
        wait_ms_per_batch=reads.get('wait_us', 0) / 1e3 / max(batches, 1),
        prefetcher=None)
    try:
        with open(os.path.join(args['cache_dir'], STATUS_FILE)) as file:
            summary['prefetcher'] = json.load(file)
    except (OSError, ValueError):
        pass
    return summary


def format_remote_cache(summary: dict) -> str:
    """One line for the log."""
    line = (f"Remote node cache ({summary['cache_dir']}): "
            f"{100 * summary['hit_ratio']:.1f}% of reads local "
            f"({summary['hits']} hits, {summary['misses']} waited on the "
            f"remote, {summary['wait_ms_per_batch']:.1f} ms per batch), "
            f"{format_size(summary['remote_bytes'])} downloaded in "
            f"{summary['downloads']} requests, "
            f"{summary['evicted_entries']} evicted, "
            f"{summary['corrupt']} corrupt bodies rejected; "
            f"{format_size(summary['committed_bytes'])} of "
            f"{format_size(summary['limit'])} used")
    status = summary['prefetcher']
    if status:
        line += (f"; prefetcher: {status['inflight']} in flight (target "
                 f"{status['target_inflight']}, max "
                 f"{status['max_inflight']}), "
                 f"{status['latency_s'] * 1e3:.0f} ms per download")
    return line + '.'


def remote_cache_advice(report: dict, summary: dict,
                        dataset_size: int) -> Optional[str]:
    """What to change when the input-bound run waits on the remote."""
    verdict = report.get('verdict', {})
    looked_up = summary['hits'] + summary['misses']
    if (verdict.get('wait_share', 0.0) < MODERATE or not looked_up
            or summary['misses'] / looked_up < WAITING_SHARE):
        return None
    status = summary['prefetcher']
    if status is None:
        return ('Reads wait on the remote and no node prefetcher runs: add '
                "custom_hooks=[dict(type='RemoteCachePrefetchHook')] so the "
                'next samples are downloaded ahead (docs/remote_cache.md).')
    if status.get('reserve_full', 0) and status['reserve'] < summary['limit']:
        value = min(2 * status['reserve'], summary['limit'] // 2)
        return (f'The prefetcher stopped {status["reserve_full"]} times at '
                f'its reserve ({format_size(status["reserve"])}) while '
                'reads waited: set RemoteCachePrefetchHook('
                f'prefetch_reserve={value}) ({format_size(value)}) or raise '
                'cache_limit by as much.')
    if status['target_inflight'] >= status['max_inflight']:
        value = 2 * status['max_inflight']
        return (f'Downloads run at max_inflight={status["max_inflight"]} '
                f'({status["latency_s"] * 1e3:.0f} ms each) and reads still '
                'wait: set RemoteCachePrefetchHook('
                f'max_inflight={value}).')
    # The remote delivers what it can: fewer misses need more kept samples.
    wait_share = verdict['wait_share']
    hit_ratio = summary['hit_ratio']
    wanted = 1 - (1 - hit_ratio) * (1 - wait_share)
    data_bytes = dataset_size * status.get('mean_size', 0)
    if hit_ratio > 0:
        value = summary['limit'] * wanted / hit_ratio
    else:
        value = data_bytes * wanted + status['reserve']
    value = int(math.ceil(value / 2**20)) * 2**20
    if value <= summary['limit']:
        return None
    return (f'Reads wait on the remote ({100 * (1 - hit_ratio):.0f}% '
            'downloaded, the bandwidth is the limit): cache_limit='
            f"'{format_size(value)}' would keep about "
            f'{100 * wanted:.0f}% of the reads local.')


def add_remote_cache(report: dict, dataset, batches: int) -> dict:
    """Add the node cache's line (and advice) to a DataMonitor report.

    Sets ``report['remote_cache']`` (the summary, or None), appends its
    line to the verdict's summary and adds advice ``topic='remote_cache'``.
    """
    summary = remote_cache_summary(dataset, batches)
    report['remote_cache'] = summary
    if summary is None:
        return report
    report['verdict']['summary'] += '\n' + format_remote_cache(summary)
    advice = remote_cache_advice(report, summary, len(dataset))
    if advice:
        report['advice'].append(dict(topic='remote_cache', text=advice))
    return report
