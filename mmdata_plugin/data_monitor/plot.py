"""PNG of a data-monitor report: the breakdown over time and per worker.

Drawn with matplotlib's Agg canvas directly (no pyplot), so it never
changes the backend of the process it runs in. Every panel says what it
shows and in which unit, so that the picture reads without the docs.
"""
import math
import textwrap
from typing import List, Optional, Tuple

from .report import format_context, select_rank
from .statistics import BASE_STAGES
from .verdict import HIGH, MODERATE, input_bound_level

#: Transforms drawn individually; the cheaper ones are summed as "other".
MAX_TRANSFORMS = 6
#: Fixed colours so both breakdown panels read alike; neighbours in the
#: stack get hues far apart.
BASE_COLORS = dict(
    io='#1f77b4',
    decode='#ff7f0e',
    fetch='#7f7f7f',
    collate='#17becf',
    transforms='#2ca02c')
TRANSFORM_COLORS = ('#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
                    '#bcbd22')
OTHER_COLOR = '#c7c7c7'
LEVEL_COLORS = dict(none='#31a354', moderate='#fd8d3c', high='#de2d26')
SHORT_LABELS = dict(
    io='file read',
    decode='image decode',
    fetch='fetch (outside pipeline)',
    collate='collate')
FONT = 11


def _short(keys: List[str]) -> List[str]:
    """Transform labels without wrapper prefixes (``Flip``, not
    ``00_Wrapper.3_Flip``), unless that makes two alike."""
    short = [key.rsplit('.', 1)[-1].split('_', 1)[-1] for key in keys]
    return [
        s if short.count(s) == 1 else key for s, key in zip(short, keys)
    ]


def _stage_series(rank: dict,
                  points: List[dict]) -> List[Tuple[str, str, List[float]]]:
    """``(label, colour, per-batch ms over time)`` of each drawn stage."""
    transforms = sorted(
        rank['transforms'], key=lambda k: -rank['transforms'][k]['mean'])
    shown, rest = transforms[:MAX_TRANSFORMS], transforms[MAX_TRANSFORMS:]

    def values(keys):
        return [sum(p['stages'].get(k, 0.0) for k in keys) for p in points]

    series = [(SHORT_LABELS[key], BASE_COLORS[key], values([key]))
              for key in BASE_STAGES[:2] if key in rank['stages']]
    series += [(label, color, values([key])) for key, label, color in zip(
        shown, _short(shown), TRANSFORM_COLORS)]
    if rest:
        series.append((f'{len(rest)} other transforms', OTHER_COLOR,
                       values(rest)))
    series += [(SHORT_LABELS[key], BASE_COLORS[key], values([key]))
               for key in BASE_STAGES[2:] if key in rank['stages']]
    return series


def plot_report(report: dict,
                path: str,
                rank: Optional[int] = None,
                dpi: int = 100) -> str:
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
    fig = Figure(figsize=(15, 11), layout='constrained')
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(3, 2, width_ratios=(3, 2),
                            height_ratios=(4, 3, 3))
    over_time = fig.add_subplot(grid[0, 0])
    data_nodes = report['context'].get('data_nodes')
    if data_nodes:
        _plot_production(over_time, fig.add_subplot(grid[0, 1]), rank,
                         data_nodes)
    else:
        _plot_breakdown(over_time, fig.add_subplot(grid[0, 1]), rank,
                        report['context']['num_workers'])
    _plot_steps(fig.add_subplot(grid[1, 0], sharex=over_time), rank)
    if 'nodes' in rank:
        _plot_nodes(fig.add_subplot(grid[1, 1]), rank)
    else:
        _plot_workers(fig.add_subplot(grid[1, 1]), rank)
    _plot_ranks(fig.add_subplot(grid[2, 0]), report)
    _write_advice(fig.add_subplot(grid[2, 1]), report)
    fig.suptitle(
        textwrap.fill(report['verdict']['summary'], 120),
        fontsize=FONT + 2,
        fontweight='bold')
    fig.savefig(path, dpi=dpi)
    return path


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5,
                                                                10]))


def _style(ax, title: str, xlabel: str = '', ylabel: str = '') -> None:
    ax.set_title(title, fontsize=FONT + 1, loc='left')
    ax.set_xlabel(xlabel, fontsize=FONT)
    ax.set_ylabel(ylabel, fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)
    ax.grid(axis='y', color='#e0e0e0', lw=0.8)
    ax.set_axisbelow(True)


def _plot_breakdown(ax, legend_ax, rank: dict, workers: int) -> None:
    sampling = rank.get('sampling', {}).get('timed_share', 1.0)
    sampled = (f', stages timed in {100 * sampling:.0f}% of batches'
               if sampling < 0.995 else '')
    _style(
        ax, f"Worker time per batch, by stage (rank {rank['rank']}"
        f'{sampled})', 'iteration', 'ms per batch (one worker)')
    _integer_steps(ax)
    legend_ax.axis('off')
    # Points without a timed batch carry no stage figures.
    points = [p for p in rank['timeline'] if p['stages']]
    if not points:
        ax.text(0.5, 0.5, 'no timeline point yet', ha='center',
                transform=ax.transAxes, fontsize=FONT)
        return
    steps = [p['step'] for p in points]
    series = _stage_series(rank, points)
    ax.stackplot(
        steps,
        *[v for _, _, v in series],
        labels=[label for label, _, _ in series],
        colors=[color for _, color, _ in series])
    # A batch may take this long on one worker and still come in time.
    parallel = max(workers, 1)
    budget = [p['compute'] * parallel for p in points]
    stacked = max(sum(v[i] for _, _, v in series) for i in range(len(points)))
    top = max(stacked, 1e-3) * 1.15
    label = (f'in-time limit: {parallel} worker{"s" if parallel > 1 else ""}'
             ' x compute per step')
    if min(budget) <= 2 * top:  # else the stack would be squashed
        top = max(top, 1.08 * max(budget))
        ax.plot(steps, budget, color='black', ls='--', lw=2, label=label)
    else:
        ax.plot([], [], color='black', ls='--', lw=2,
                label=f'{label}: >= {min(budget):.0f} ms, above the chart')
    ax.set_ylim(0, top)
    ax.set_xlim(min(steps), max(steps) if len(steps) > 1 else steps[0] + 1)
    handles, labels = ax.get_legend_handles_labels()
    # Top of the stack first, as it is drawn.
    stack = list(zip(handles, labels))
    line, stack = stack[-1:], stack[:-1][::-1]
    legend_ax.legend(
        *zip(*(line + stack)),
        loc='center left',
        fontsize=FONT,
        title='stages (self time), top to bottom',
        title_fontsize=FONT,
        frameon=False)


def _actors_at(step: int, data_nodes: dict) -> int:
    """The actors sized for ``step`` (``context.data_nodes``)."""
    actors = data_nodes['num_actors']
    if actors == 'auto':
        actors = data_nodes['min_actors']
    for resize in data_nodes['resizes']:
        if resize['iteration'] <= step:
            actors = resize['actors']
    return actors


def _plot_production(ax, legend_ax, rank: dict, data_nodes: dict) -> None:
    """RayDataNodesHook: an actor's time per batch and the batch's
    transfer over time (the actors' stages are not timed), against the
    time a batch may take with the actors of the pool."""
    _style(ax, f"Ray data actors: time per batch (rank {rank['rank']})",
           'iteration', 'ms per batch')
    _integer_steps(ax)
    legend_ax.axis('off')
    points = rank['timeline']
    if not points:
        ax.text(0.5, 0.5, 'no timeline point yet', ha='center',
                transform=ax.transAxes, fontsize=FONT)
        return
    steps = [p['step'] for p in points]
    ax.stackplot(steps, [p['worker'] for p in points],
                 [p['transfer'] for p in points],
                 labels=['production on one actor', 'transfer to the trainer'],
                 colors=[BASE_COLORS['transforms'], BASE_COLORS['collate']])
    ax.plot(steps,
            [p['compute'] * _actors_at(p['step'], data_nodes)
             for p in points],
            color='black', ls='--', lw=2,
            label='in-time limit: actors x compute per step')
    ax.set_xlim(min(steps), max(steps) if len(steps) > 1 else steps[0] + 1)
    legend_ax.legend(*ax.get_legend_handles_labels(), loc='center left',
                     fontsize=FONT, frameon=False)


def _plot_nodes(ax, rank: dict) -> None:
    """RayDataNodesHook: per data node, production and transfer."""
    _style(ax, 'Per data node: mean ms per batch', 'ms per batch')
    ax.grid(axis='x', color='#e0e0e0', lw=0.8)
    ax.grid(axis='y', visible=False)
    nodes = rank['nodes']
    labels = [f"{n['host']} {n['ip']} {n['node'][:8]}\n"
              f"{n['gbps']:.3g} GB/s" for n in nodes]
    production = [n['time']['mean'] for n in nodes]
    ax.barh(labels, production, height=0.6,
            color=BASE_COLORS['transforms'], label='production (actor)')
    ax.barh(labels, [n['transfer'] for n in nodes], left=production,
            height=0.6, color=BASE_COLORS['collate'],
            label='transfer to the trainer')
    ax.invert_yaxis()
    ax.set_ylim(len(nodes) - 0.5, -1.3)  # room for the legend on top
    ax.legend(fontsize=FONT - 1, loc='upper left', ncol=2, frameon=False)


def _plot_steps(ax, rank: dict) -> None:
    _style(ax, 'Training step: compute vs. waiting for data', 'iteration',
           'ms per step')
    _integer_steps(ax)
    points = rank['timeline']
    if not points:
        return
    ax.stackplot([p['step'] for p in points], [p['compute'] for p in points],
                 [p['wait'] for p in points],
                 labels=['compute (model step, hooks)', 'waiting for data'],
                 colors=['#9ecae1', LEVEL_COLORS['high']])
    top = max(p['compute'] + p['wait'] for p in points)
    ax.set_ylim(0, 1.35 * top if top else 1.0)  # room for the legend
    ax.legend(fontsize=FONT - 1, loc='upper left', ncol=2, frameon=False)


def _plot_workers(ax, rank: dict) -> None:
    _style(ax, 'Per worker: mean ms per batch, by stage', 'ms per batch')
    ax.grid(axis='x', color='#e0e0e0', lw=0.8)
    ax.grid(axis='y', visible=False)
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
            height=0.6,
            color=BASE_COLORS[key],
            label=SHORT_LABELS.get(key, 'all transforms'))
        left = [a + b for a, b in zip(left, values)]
    ax.plot([w['time']['p90'] for w in workers],
            labels,
            'k|',
            ms=22,
            mew=2.5,
            label='p90 of the batch time')
    ax.invert_yaxis()
    ax.set_ylim(len(workers) - 0.5, -1.3)  # room for the legend on top
    ax.legend(
        fontsize=FONT - 1,
        loc='upper left',
        ncol=3,
        frameon=False,
        markerscale=0.5)


def _plot_ranks(ax, report: dict) -> None:
    from matplotlib.ticker import PercentFormatter
    _style(ax, 'Share of step time spent waiting for data, per rank',
           '% of step time')
    ax.grid(axis='y', visible=False)
    ranks = report['ranks']
    labels = [f"rank {r['rank']}" for r in ranks]
    shares = [100 * r['wait_share'] for r in ranks]
    ax.barh(
        labels,
        shares,
        height=0.5,
        color=[LEVEL_COLORS[input_bound_level(s / 100)] for s in shares])
    for y, share in enumerate(shares):
        ax.text(share, y, f' {share:.1f}%', va='center', fontsize=FONT)
    right = max(max(shares, default=0) * 1.25, 25)
    for line, name in ((MODERATE, 'moderate'), (HIGH, 'high')):
        x = 100 * line
        ax.axvline(
            x,
            color=LEVEL_COLORS[name],
            lw=2,
            ls='--',
            label=f'input-bound {name} from {x:.0f}%')
    ax.set_xlim(0, right)
    ax.xaxis.set_major_formatter(PercentFormatter(decimals=0))
    ax.set_ylim(len(ranks) - 0.5, -1.2)  # room for the legend on top
    ax.legend(fontsize=FONT - 1, loc='upper right', ncol=2, frameon=False)


def _write_advice(ax, report: dict) -> None:
    ax.axis('off')
    advice = report['advice']
    lines = textwrap.wrap(f'Setup: {format_context(report)}.', 62)
    lines += [''] + (['Advice:'] if advice else
                     ['No advice: the loader keeps up.'])
    for item in advice[:4]:
        lines += textwrap.wrap(
            item['text'], 62, initial_indent='- ', subsequent_indent='  ')
    fig_height = ax.figure.get_size_inches()[1] * 72  # points
    rows = max(1, math.floor(ax.get_position().height * fig_height /
                             ((FONT - 1) * 1.2)))
    if len(lines) > rows:
        lines = lines[:rows - 1] + ['  ... (all of it: data_monitor.json)']
    ax.text(0, 1, '\n'.join(lines), va='top', ha='left', fontsize=FONT - 1,
            transform=ax.transAxes, family='sans-serif')
