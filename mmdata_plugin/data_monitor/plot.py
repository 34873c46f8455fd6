"""PNG of a data-monitor report: the breakdown over time and per worker.

Drawn with matplotlib's Agg canvas directly (no pyplot), so it never
changes the backend of the process it runs in.
"""
import textwrap
from typing import Dict, List, Optional

from .report import select_rank
from .statistics import BASE_STAGES
from .verdict import input_bound_level, stage_label

#: Transforms drawn individually; the cheaper ones are summed as "other".
MAX_TRANSFORMS = 6


def _stage_series(rank: dict) -> Dict[str, List[float]]:
    """Timeline of per-batch ms per drawn stage, cheapest transforms merged."""
    points = rank['timeline']
    transforms = sorted(rank['transforms'],
                        key=lambda k: -rank['transforms'][k]['mean'])
    shown, rest = transforms[:MAX_TRANSFORMS], transforms[MAX_TRANSFORMS:]
    series = {}
    for key in BASE_STAGES[:2]:
        if key in rank['stages']:
            series[stage_label(key)] = [p['stages'].get(key, 0.0)
                                        for p in points]
    for key in shown:
        series[key] = [p['stages'].get(key, 0.0) for p in points]
    if rest:
        series['other transforms'] = [
            sum(p['stages'].get(k, 0.0) for k in rest) for p in points
        ]
    for key in BASE_STAGES[2:]:
        if key in rank['stages']:
            series[stage_label(key)] = [p['stages'].get(key, 0.0)
                                        for p in points]
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
    verdict = report['verdict']
    workers = report['context']['num_workers']
    fig = Figure(figsize=(12, 7.5))
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 2, width_ratios=(3, 2))
    series = _stage_series(rank)
    colors = dict(zip(series, _palette(len(series))))

    over_time = fig.add_subplot(grid[0, 0])
    steps = [p['step'] for p in rank['timeline']]
    if steps:
        over_time.stackplot(
            steps, *series.values(), labels=list(series),
            colors=[colors[k] for k in series])
        capacity = [p['compute'] * max(workers, 1) for p in rank['timeline']]
        over_time.plot(
            steps, capacity, 'k--', lw=1.2,
            label=f'budget: compute x {max(workers, 1)} worker(s)')
        over_time.legend(fontsize=7, loc='upper left', ncol=2)
    over_time.set_title(f"Worker time per batch by stage (rank {rank['rank']})",
                        fontsize=10)
    over_time.set_xlabel('iteration')
    over_time.set_ylabel('ms per batch')

    per_step = fig.add_subplot(grid[1, 0], sharex=over_time)
    if steps:
        per_step.stackplot(
            steps, [p['compute'] for p in rank['timeline']],
            [p['wait'] for p in rank['timeline']],
            labels=['compute (model, hooks)', 'waiting for data'],
            colors=['#9ecae1', '#de2d26'])
        per_step.legend(fontsize=7, loc='upper left')
    per_step.set_title('Training step: compute vs waiting for data',
                       fontsize=10)
    per_step.set_xlabel('iteration')
    per_step.set_ylabel('ms per step')

    _plot_workers(fig.add_subplot(grid[0, 1]), rank, colors)
    _plot_ranks(fig.add_subplot(grid[1, 1]), report)
    fig.suptitle(textwrap.fill(verdict['summary'], 130), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=dpi)
    return path


def _plot_workers(ax, rank: dict, colors: dict) -> None:
    workers = rank['workers']
    labels = ['main' if w['worker'] < 0 else f"w{w['worker']}"
              for w in workers]
    parts = [(stage_label('io'), 'io'), (stage_label('decode'), 'decode'),
             ('transforms', 'transforms'), (stage_label('fetch'), 'fetch'),
             (stage_label('collate'), 'collate')]
    left = [0.0] * len(workers)
    palette = _palette(len(parts))
    for (label, key), color in zip(parts, palette):
        values = [w['stages'][key] for w in workers]
        if not any(values):
            continue
        ax.barh(labels, values, left=left, color=colors.get(label, color),
                label=label)
        left = [a + b for a, b in zip(left, values)]
    ax.plot([w['time']['p90'] for w in workers], labels, 'k|', ms=14,
            label='p90')
    ax.set_title('Per worker: mean ms per batch (| = p90)', fontsize=10)
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc='lower right')


def _plot_ranks(ax, report: dict) -> None:
    ranks = report['ranks']
    labels = [f"rank {r['rank']}" for r in ranks]
    shares = [100 * r['wait_share'] for r in ranks]
    level_colors = dict(none='#31a354', moderate='#fd8d3c', high='#de2d26')
    colors = [level_colors[input_bound_level(s / 100)] for s in shares]
    ax.barh(labels, shares, color=colors)
    for y, share in enumerate(shares):
        ax.text(share, y, f' {share:.1f}%', va='center', fontsize=8)
    ax.axvline(5, color='grey', lw=0.8, ls=':')
    ax.axvline(20, color='grey', lw=0.8, ls=':')
    ax.set_xlim(0, max(max(shares, default=0) * 1.25, 25))
    ax.invert_yaxis()
    ax.set_title('Share of step time waiting for data (5% / 20% lines)',
                 fontsize=10)


def _palette(n: int) -> list:
    from matplotlib import colormaps
    cmap = colormaps['tab20']
    return [cmap(i % 20) for i in range(n)]
