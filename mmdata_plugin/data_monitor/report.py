"""Text tables of a data-monitor report, and its JSON file."""
import json
import os
import os.path as osp
from typing import List, Optional, Sequence

from .statistics import BASE_STAGES
from .verdict import SCHEMA, stage_label


def text_table(header: Sequence[str],
               rows: List[Sequence],
               title: str,
               left: Sequence[int] = (0, )) -> str:
    """A plain-text table: numbers right-aligned, columns ``left`` not."""
    cells = [[str(c) for c in header]]
    cells += [[c if isinstance(c, str) else f'{c:.1f}' for c in row]
              for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row):
        return '  '.join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    rule = '-' * len(line(cells[0]))
    return '\n'.join([title, line(cells[0]), rule, *map(line, cells[1:])])


def select_rank(report: dict, rank: Optional[int] = None) -> dict:
    """A rank's summary: ``rank``, or the one the verdict was made on."""
    wanted = report['verdict'].get('worst_rank', 0) if rank is None else rank
    for summary in report['ranks']:
        if summary['rank'] == wanted:
            return summary
    if rank is not None:
        raise ValueError(f'the report has no rank {rank} (ranks: '
                         f"{[r['rank'] for r in report['ranks']]})")
    return report['ranks'][0]


def format_stage_table(rank: dict) -> str:
    """Per stage and per transform: mean/p50/p90 ms per batch, share."""
    rows = []
    for key in BASE_STAGES[:2]:
        if key in rank['stages']:
            rows.append((stage_label(key), rank['stages'][key]))
    rows += [(f'  {key}', stats) for key, stats in rank['transforms'].items()]
    rows += [(stage_label(key), rank['stages'][key]) for key in BASE_STAGES[2:]
             if key in rank['stages']]
    body = [(name, s['mean'], s['p50'], s['p90'], f"{100 * s['share']:.0f}%")
            for name, s in rows]
    worker = rank['worker']
    producer = 'actor' if 'nodes' in rank else 'worker'
    if 'nodes' in rank and any('nodes' not in w for w in rank['workers']):
        producer = 'worker or actor'  # RayDataNodesHook(local_workers=True)
    body.append((f'= {producer} time per batch', worker['mean'],
                 worker['p50'], worker['p90'], '100%'))
    for name in ('transfer', 'wait', 'compute'):
        s = rank[name]
        body.append(
            (f'{name} (training process)', s['mean'], s['p50'], s['p90'], ''))
    return text_table(('stage (ms per batch)', 'mean', 'p50', 'p90', 'share'),
                  body, f"Where the data time goes (rank {rank['rank']}, "
                  f"{rank['steps']} steps; transforms: self time):")


def format_throughput(rank: dict) -> str:
    """Samples and batches per second over the counted steps."""
    throughput = rank['throughput']
    samples = throughput['samples_per_s']
    return ('Throughput: ' +
            (f'{samples:.1f} samples/s, ' if samples is not None else '') +
            f"{throughput['batches_per_s']:.2f} batches/s (counted steps, "
            'wall time)')


def format_actor_table(rank: dict, title: str = '') -> str:
    """One row per Ray data actor slot (RayDataNodesHook): where, how long
    a batch took it, and its transfer to the training process."""
    rows = [(str(w['worker']), ','.join(
        f'{ip} {node[:8]}' for ip, node in zip(w['ips'], w['nodes'])),
             ','.join(
        map(str, w['pids'])), str(w['batches']), w['time']['mean'],
             w['time']['p90'], w['transfer'], f"{w['bytes'] / 1e6:.3g}",
             f"{w['gbps']:.3g}", w['slack'], f"{100 * w['cpu_share']:.0f}%")
            for w in rank['workers']]
    return text_table(
        ('actor', 'node', 'pid', 'batches', 'mean', 'p90', 'transfer', 'MB',
         'GB/s', 'slack', 'cpu'), rows, title or
        f"Per data actor (rank {rank['rank']}, ms per batch):", left=(0, 1))


def format_node_table(rank: dict) -> str:
    """One row per Ray data node: production time per batch of its
    actors, and the transfer of their batches to the training process."""
    rows = [(n['host'], f"{n['ip']} {n['node'][:8]}", str(n['processes']),
             str(n['batches']),
             n['time']['mean'], n['time']['p90'], n['transfer'],
             f"{n['gbps']:.3g}", f"{100 * n['cpu_share']:.0f}%")
            for n in rank['nodes']]
    return text_table(
        ('host', 'node', 'actors', 'batches', 'production', 'p90',
         'transfer', 'GB/s', 'cpu'), rows,
        f"Per data node (rank {rank['rank']}, ms per batch):", left=(0, 1))


def format_worker_table(rank: dict, title: str = '') -> str:
    """One row per DataLoader worker (``main`` without workers), then a
    table of one row per Ray data actor (the workers of a mixed stream,
    ``RayDataNodesHook(local_workers=True)``, number before the actors)."""
    actors = [w for w in rank['workers'] if 'nodes' in w]
    workers = [w for w in rank['workers'] if 'nodes' not in w]
    tables = []
    if workers or not actors:
        tables.append(_local_worker_table(rank, workers, title))
    if actors:
        tables.append(
            format_actor_table(dict(rank, workers=actors),
                               '' if workers else title))
    return '\n'.join(tables)


def _local_worker_table(rank: dict, workers: List[dict], title: str) -> str:
    rows = []
    for w in workers:
        stages, time = w['stages'], w['time']
        rows.append(('main' if w['worker'] < 0 else str(w['worker']),
                     ','.join(map(str, w['pids'])) +
                     ('...' if w['processes'] > len(w['pids']) else ''),
                     str(w['batches']), time['mean'], time['p90'], time['max'],
                     stages['io'], stages['decode'], stages['transforms'],
                     stages['fetch'], stages['collate'], w['transfer'],
                     w['slack'], f"{100 * w['cpu_share']:.0f}%"))
    return text_table(
        ('worker', 'pid', 'batches', 'mean', 'p90', 'max', 'io', 'decode',
         'transforms', 'fetch', 'collate', 'transfer', 'slack', 'cpu'), rows,
        title or f"Per worker (rank {rank['rank']}, ms per batch):")


def format_rank_table(report: dict) -> str:
    rows = [(str(r['rank']), r['context']['host'],
             f"{100 * r['wait_share']:.1f}%", r['wait']['mean'],
             r['compute']['mean'], r['worker']['mean'], str(r['steps']))
            for r in report['ranks']]
    return text_table(
        ('rank', 'host', 'waiting', 'wait', 'compute', 'worker', 'steps'),
        rows, 'Per rank (ms per step):')


def format_context(report: dict) -> str:
    c = report['context']
    nodes = c.get('data_nodes')
    if nodes:
        sized = (f", auto within {nodes['min_actors']}-"
                 f"{nodes['max_actors']}"
                 if nodes['num_actors'] == 'auto' else '')
        workers = f"{nodes['actors']} Ray data actors{sized}"
    elif c['num_workers']:
        workers = (f"{c['num_workers']} workers ({c['start_method']}, "
                   f"{'' if c['persistent_workers'] else 'not '}persistent, "
                   f"prefetch_factor={c['prefetch_factor']})")
    else:
        workers = 'no workers (num_workers=0)'
    return (f"{c['dataset_type']}, batch_size={c['batch_size']}, {workers}, "
            f"pin_memory={c['pin_memory']}, {c['world_size']} rank(s), "
            f"{c['cpus']} cores")


def format_report(report: dict, rank: Optional[int] = None) -> str:
    """The whole report as text: context, tables, verdict, advice.

    Args:
        report (dict): A report (see :func:`build_report`).
        rank (int, optional): Whose stage and worker tables to show; the
            rank the verdict was made on by default.
    """
    rank = select_rank(report, rank)
    parts = [
        f'DataMonitor report: {format_context(report)}',
        f"Steps counted: {rank['steps']} (not counted: {rank['skipped']} "
        'warm-up / after restarts, validation, checkpoints)'
    ]
    if rank['steps']:
        if 'throughput' in rank:  # reports written before it was added
            parts.append(format_throughput(rank))
        parts += [format_stage_table(rank), format_worker_table(rank)]
        if 'nodes' in rank:
            parts.append(format_node_table(rank))
    if len(report['ranks']) > 1:
        parts.append(format_rank_table(report))
    parts.append(report['verdict']['summary'])
    if report['advice']:
        parts.append('Advice:\n' + '\n'.join(f"  - {a['text']}"
                                             for a in report['advice']))
    return '\n\n'.join(parts)


def encode_report(report: dict, cache: Optional[dict] = None) -> str:
    """``report`` as JSON text: what ``json.dumps(report)`` returns.

    Args:
        report (dict): A report (see :func:`build_report`).
        cache (dict, optional): Kept by the caller between calls on the
            reports of one run: timeline points, most of a long run's
            report, never change once made, so each is encoded once (the
            C encoder runs only without ``indent``; a point found in the
            cache is compared, not trusted).
    """
    if cache is None:
        return json.dumps(report)
    timelines = {}
    ranks = []
    for rank in report['ranks']:
        marker = f"\0timeline of rank {rank['rank']}"
        timelines[json.dumps(marker)] = (rank['rank'], rank['timeline'])
        ranks.append(dict(rank, timeline=marker))
    text = json.dumps(dict(report, ranks=ranks))
    used = {}
    for marker, (rank, points) in timelines.items():
        encoded = []
        for point in points:
            key = (rank, point['step'], point['steps'])
            hit = cache.get(key)
            if hit is None or hit[0] != point:
                hit = (point, json.dumps(point))
            used[key] = hit
            encoded.append(hit[1])
        text = text.replace(marker, f"[{', '.join(encoded)}]", 1)
    cache.clear()
    cache.update(used)
    return text


def save_report(report: dict,
                path: str,
                cache: Optional[dict] = None) -> None:
    """Write ``report`` as JSON (atomically: readers never see half).

    Args:
        report (dict): A report (see :func:`build_report`).
        path (str): The JSON file.
        cache (dict, optional): See :func:`encode_report`.
    """
    text = encode_report(report, cache)
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    tmp = f'{path}.tmp'
    with open(tmp, 'w') as f:
        f.write(text)
    os.replace(tmp, path)


def load_report(path: str) -> dict:
    """Read a report written by :func:`save_report`."""
    with open(path) as f:
        try:
            report = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f'{path}: not a JSON file ({error})') from error
    if not isinstance(report, dict) or report.get('schema') != SCHEMA:
        found = report.get('schema') if isinstance(report, dict) else None
        raise ValueError(f'{path}: not a data-monitor report (schema '
                         f'{found!r}, expected {SCHEMA!r})')
    return report
