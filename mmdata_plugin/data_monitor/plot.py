"""PNG of a data-monitor report: the breakdown over time and per worker.

Drawn with matplotlib's Agg canvas directly (no pyplot), so it never
changes the backend of the process it runs in.
"""
import textwrap
from typing import List, Optional, Tuple

from .report import select_rank
from .statistics import BASE_STAGES
from .verdict import input_bound_level, stage_label

#: Transforms drawn individually; the cheaper ones are summed as "other".
MAX_TRANSFORMS = 6
#: Fixed colours so both breakdown panels read alike.
BASE_COLORS = dict(
    io='#1f77b4',
    decode='#aec7e8',
    fetch='#ff9896',
    collate='#9467bd',
    transforms='#ff7f0e')
TRANSFORM_COLORS = ('#ff7f0e', '#ffbb78', '#2ca02c', '#98df8a', '#d62728',
                    '#c49c94')
OTHER_COLOR = '#c7c7c7'
LEVEL_COLORS = dict(none='#31a354', moderate='#fd8d3c', high='#de2d26')


def _stage_series(rank: dict) -> List[Tuple[str, str, List[float]]]:
    """``(label, colour, per-batch ms over time)`` of each drawn stage."""
    points = rank['timeline']
    transforms = sorted(
        rank['transforms'], key=lambda k: -rank['transforms'][k]['mean'])
    shown, rest = transforms[:MAX_TRANSFORMS], transforms[MAX_TRANSFORMS:]

    def values(keys):
        return [sum(p['stages'].get(k, 0.0) for k in keys) for p in points]

    series = [(stage_label(key), BASE_COLORS[key], values([key]))
              for key in BASE_STAGES[:2] if key in rank['stages']]
    series += [(key, color, values([key]))
               for key, color in zip(shown, TRANSFORM_COLORS)]
    if rest:
        series.append(('other transforms', OTHER_COLOR, values(rest)))
    series += [(stage_label(key), BASE_COLORS[key], values([key]))
               for key in BASE_STAGES[2:] if key in rank['stages']]
    return series


def plot_report(report: dict,
                path: str,
                rank: Optional[int] = None,
                dpi: int = 80) -> str:
    """Draw ``report`` into the PNG file ``path``; returns ``path``.

    Args:
        report (dict): A report (see :func:`build_report`).
        path (str): The PNG file to write.
        rank (int, optional): Whose breakdown to draw; the rank the verdict
            was made on by default.
        dpi (int): Resolution.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rank = select_rank(report, rank)
    fig = Figure(figsize=(12, 7.5))
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 2, width_ratios=(3, 2))
    over_time = fig.add_subplot(grid[0, 0])
    _plot_breakdown(over_time, rank, report['context']['num_workers'])
    _plot_steps(fig.add_subplot(grid[1, 0], sharex=over_time), rank)
    _plot_workers(fig.add_subplot(grid[0, 1]), rank)
    _plot_ranks(fig.add_subplot(grid[1, 1]), report)
    fig.suptitle(textwrap.fill(report['verdict']['summary'], 130), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=dpi)
    return path


def _plot_breakdown(ax, rank: dict, workers: int) -> None:
    points = rank['timeline']
    steps = [p['step'] for p in points]
    ax.set_title(
        f"Worker time per batch by stage (rank {rank['rank']})", fontsize=10)
    ax.set_xlabel('iteration')
    ax.set_ylabel('ms per batch')
    if not points:
        return
    series = _stage_series(rank)
    ax.stackplot(
        steps,
        *[v for _, _, v in series],
        labels=[label for label, _, _ in series],
        colors=[color for _, color, _ in series])
    # A batch may take this long on one worker and still be in time.
    parallel = max(workers, 1)
    budget = [p['compute'] * parallel for p in points]
    top = 1.8 * max(p['worker'] for p in points) or 1.0
    above = (f' (>= {min(budget):.0f}: off the chart)'
             if min(budget) > top else '')
    ax.plot(steps, budget, 'k--', lw=1.2,
            label=f'in time below: step compute x {parallel} worker(s)'
            f'{above}')
    ax.set_ylim(0, top)
    ax.legend(fontsize=7, loc='upper left', ncol=2, framealpha=0.85)


def _plot_steps(ax, rank: dict) -> None:
    points = rank['timeline']
    ax.set_title('Training step: compute vs waiting for data', fontsize=10)
    ax.set_xlabel('iteration')
    ax.set_ylabel('ms per step')
    if not points:
        return
    ax.stackplot([p['step'] for p in points], [p['compute'] for p in points],
                 [p['wait'] for p in points],
                 labels=['compute (model, hooks)', 'waiting for data'],
                 colors=['#9ecae1', LEVEL_COLORS['high']])
    ax.legend(fontsize=7, loc='upper left', framealpha=0.85)


def _plot_workers(ax, rank: dict) -> None:
    workers = rank['workers']
    labels = [
        'main' if w['worker'] < 0 else f"worker {w['worker']}" for w in workers
    ]
    left = [0.0] * len(workers)
    for key in ('io', 'decode', 'transforms', 'fetch', 'collate'):
        values = [w['stages'][key] for w in workers]
        if not any(values):
            continue
        ax.barh(
            labels,
            values,
            left=left,
            color=BASE_COLORS[key],
            label=stage_label(key))
        left = [a + b for a, b in zip(left, values)]
    ax.plot([w['time']['p90'] for w in workers],
            labels,
            'k|',
            ms=16,
            mew=2,
            label='p90')
    ax.set_title('Per worker: mean ms per batch by stage', fontsize=10)
    ax.invert_yaxis()
    ax.legend(
        fontsize=7, loc='upper center', bbox_to_anchor=(0.5, -0.08), ncol=3)


def _plot_ranks(ax, report: dict) -> None:
    ranks = report['ranks']
    labels = [f"rank {r['rank']}" for r in ranks]
    shares = [100 * r['wait_share'] for r in ranks]
    ax.barh(
        labels,
        shares,
        color=[LEVEL_COLORS[input_bound_level(s / 100)] for s in shares])
    for y, share in enumerate(shares):
        ax.text(share, y, f' {share:.1f}%', va='center', fontsize=8)
    for line in (5, 20):
        ax.axvline(line, color='grey', lw=0.8, ls=':')
    ax.set_xlim(0, max(max(shares, default=0) * 1.25, 25))
    ax.invert_yaxis()
    ax.set_title(
        'Share of step time waiting for data (5% / 20% lines)', fontsize=10)
