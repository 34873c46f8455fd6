"""Compare monitor reports of one DataLoader at several worker counts.

A worker-count sweep measures the same loader with ``num_workers`` = 0, 2,
4 ... (each several times, since machines are noisy), summarises each count
by the median of its runs and recommends the smallest count that delivers
within a tolerance of the best: more workers than that cost memory, start-up
time and CPU for no measurable gain.
"""
import statistics
from typing import List, Mapping, Optional, Sequence

from .report import select_rank, text_table
from .verdict import stage_label

#: A count is recommended when it delivers at least this much less than the
#: best count at most (5%: differences below it are within run-to-run noise
#: on a loaded machine).
TOLERANCE = 0.05


def recommend_workers(throughput: Mapping[int, Optional[float]],
                      tolerance: float = TOLERANCE) -> int:
    """The smallest worker count within ``tolerance`` of the best.

    Args:
        throughput (Mapping[int, float]): Batches (or samples) per second
            of each worker count; None or 0 for a count that delivered
            nothing.
        tolerance (float): Accepted shortfall, as a fraction of the best.

    Raises:
        ValueError: No count delivered anything, or a bad tolerance.
    """
    if not 0 <= tolerance < 1:
        raise ValueError(f'tolerance must be in [0, 1), got {tolerance}')
    measured = {w: t for w, t in throughput.items() if t and t > 0}
    if not measured:
        raise ValueError('no worker count delivered any batch: '
                         f'{dict(throughput)}')
    best = max(measured.values())
    return min(w for w, t in measured.items() if t >= (1 - tolerance) * best)


def _median(values: List[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize_runs(workers: int, reports: Sequence[dict]) -> dict:
    """One row of a sweep: the medians of a worker count's runs.

    Args:
        workers (int): The runs' ``num_workers``.
        reports (Sequence[dict]): Monitor reports of the runs (see
            :func:`~.verdict.build_report`).

    Returns:
        dict: ``workers``, ``runs``, ``batches_per_s`` and
        ``samples_per_s`` (each run's, in ``*_runs``, and their medians),
        ``wait_share`` and ``startup_ms`` (medians), and
        ``median_report``: the run whose batches/s is the median (the
        row's bottleneck is its verdict's). Medians are None where no step
        was counted.
    """
    ranks = [select_rank(report) for report in reports]
    counted = sorted((r['throughput']['batches_per_s'], i)
                     for i, r in enumerate(ranks) if r['steps'])
    used = [ranks[i] for _, i in counted]
    return dict(
        workers=workers,
        runs=len(reports),
        batches_per_s_runs=[r['throughput']['batches_per_s'] for r in ranks],
        samples_per_s_runs=[r['throughput']['samples_per_s'] for r in ranks],
        batches_per_s=_median([t for t, _ in counted]),
        samples_per_s=_median([r['throughput']['samples_per_s']
                               for r in used]),
        wait_share=_median([r['wait_share'] for r in used]),
        startup_ms=_median([
            r['startup']['wait']['mean'] for r in used
            if r['startup']['count']
        ]),
        median_report=reports[counted[(len(counted) - 1) // 2][1]]
        if counted else None)


def bottleneck_text(report: Optional[dict]) -> str:
    """``image decode (83% of worker time)``: the verdict's bottleneck."""
    verdict = (report or {}).get('verdict', {})
    key = verdict.get('bottleneck')
    if not key:
        return '-'
    of = 'step' if key == 'transfer' else 'worker'
    return (f'{stage_label(key)} ({100 * verdict["bottleneck_share"]:.0f}% '
            f'of {of} time)')


def format_sweep_table(rows: List[dict]) -> str:
    """One line per worker count (medians over its runs)."""

    def cell(value, fmt):
        return '-' if value is None else format(value, fmt)

    body = []
    for row in rows:
        runs = [t for t in row['batches_per_s_runs'] if t]
        spread = (f'{min(runs):.2f}-{max(runs):.2f}'
                  if len(runs) > 1 else '')
        waiting = row['wait_share']
        body.append((str(row['workers']), cell(row['samples_per_s'], '.1f'),
                     cell(row['batches_per_s'], '.2f'), spread,
                     '-' if waiting is None else f'{100 * waiting:.1f}%',
                     cell(row['startup_ms'], '.0f'),
                     bottleneck_text(row['median_report'])))
    return text_table(
        ('workers', 'samples/s', 'batches/s', 'runs (batches/s)', 'waiting',
         'first batch ms', 'bottleneck'),
        body,
        'Worker-count sweep (medians over the runs):',
        left=(0, 6))
