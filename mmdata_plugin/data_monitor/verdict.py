"""From measured figures to a verdict and advice with numbers.

The input-bound thresholds are TensorFlow's input-pipeline analyzer's: below
5% of step time waiting for data is not input-bound, from 20% on highly.
With several ranks the worst one (the largest waiting share) is judged: in
data-parallel training a starved rank makes the others wait inside the
gradient all-reduce, where their wait looks like compute.
"""
import datetime
import math
import os
from statistics import median
from typing import List, Optional

from .worker_timing import FULL_BATCHES

SCHEMA = 'mmdata_plugin.data_monitor/1'
MODERATE, HIGH = 0.05, 0.20
#: A worker whose p90 batch time exceeds the median of all workers' p90 by
#: this factor is a straggler.
STRAGGLER_FACTOR = 1.5
STAGE_NAMES = dict(
    io='file read (io)',
    decode='image decode',
    fetch='dataset fetch outside the pipeline',
    collate='collate',
    transfer='hand-over to the training process (transfer)',
    trainer='data work in the training process')
#: What a config adds for the one-block hand-over (docs/handover.md).
HANDOVER_LINES = ("train_dataloader=dict(..., pin_memory=True, "
                  "collate_fn=dict(type='block_collate')) and "
                  "custom_hooks=[..., dict(type='DeviceFeedHook')]")


def input_bound_level(wait_share: float) -> str:
    """``'none'``, ``'moderate'`` or ``'high'``."""
    if wait_share >= HIGH:
        return 'high'
    return 'moderate' if wait_share >= MODERATE else 'none'


def stage_label(key: str) -> str:
    return STAGE_NAMES.get(key, key)


def _pct(fraction: float) -> str:
    return f'{100 * fraction:.0f}%'


def workers_needed(worker_ms: float, compute_ms: float) -> Optional[int]:
    """Workers that produce one batch per step: ``ceil(worker / compute)``.

    None when the consumer's step is too short to size workers for (under
    1% of a batch's worker time, e.g. a loader benchmark doing nothing).
    """
    if worker_ms <= 0 or compute_ms < 0.01 * worker_ms:
        return None
    return max(1, math.ceil(worker_ms / compute_ms))


def stage_costs(rank: dict) -> dict:
    """Per-batch worker ms of every stage (pipeline transforms included)."""
    costs = {key: s['mean'] for key, s in rank['stages'].items()}
    costs.update({key: s['mean'] for key, s in rank['transforms'].items()})
    return costs


def batches_were_early(rank: dict) -> bool:
    """Whether the wait is the hand-over of batches that were ready early.

    ``slack`` is how long before the step asked for it a batch was
    finished; a batch that was already finished can only be waited for
    while it is handed over (``transfer``). When that is the typical case
    (median slack longer than the mean hand-over), the hand-over is most
    of the wait and the step waits noticeably (a moderate waiting share),
    the workers keep up and the hand-over is what the step waits for.
    """
    transfer, wait = rank['transfer']['mean'], rank['wait']['mean']
    return (rank['wait_share'] >= MODERATE and transfer >= 0.5 * wait
            and rank['slack']['p50'] > transfer)


def stage_stderr(rank: dict, key: str) -> float:
    """Standard error (ms) of a stage's mean; 0 where every batch was
    timed (reports of older versions have none)."""
    stats = rank['stages'].get(key) or rank['transforms'].get(key) or {}
    return stats.get('stderr', 0.0)


def find_bottleneck(rank: dict, num_workers: int):
    """The stage that limits delivery, and its share of worker time.

    Worker stages run on ``num_workers`` processes in parallel, handing a
    batch over to the training process (``transfer``) happens one batch at
    a time: it is the bottleneck when batches were ready early and the wait
    is their hand-over (:func:`batches_were_early`), or when it takes longer
    than the workers take to deliver a batch (their whole time per batch
    over ``num_workers``). Its share is then of the step time.
    """
    costs = stage_costs(rank)
    if not rank['worker']['mean']:
        return None, 0.0
    transfer = rank['transfer']['mean']
    delivery = rank['worker']['mean'] / num_workers if num_workers else 0.0
    if batches_were_early(rank) or (num_workers and transfer > delivery):
        step = rank['wait']['mean'] + rank['compute']['mean']
        return 'transfer', transfer / step if step else 0.0
    if not costs:  # no stage timed (Ray data actors, or not yet)
        return None, 0.0
    key = max(costs, key=costs.get)
    return key, costs[key] / rank['worker']['mean']


def _ray_transfer_advice(rank: dict) -> str:
    """The hand-over of batches made by Ray data actors."""
    nodes = rank.get('nodes') or []
    moved = sum(n['bytes'] * n['batches'] for n in nodes)
    took = sum(n['transfer'] * n['batches'] for n in nodes) / 1e3
    rate = (f' ({moved / max(took, 1e-12) / 1e9:.2f} GB/s)'
            if moved else '')
    early = (f"Batches were ready {rank['slack']['p50']:.0f} ms before the "
             'step asked for them (median): the actors keep up, so more '
             'actors will not shorten the wait. '
             ) if batches_were_early(rank) else ''
    return (f"Moving a batch from the Ray data actors takes "
            f"{rank['transfer']['mean']:.1f} ms{rate}: Ray's copy into its "
            'object store and, from another node, the network. '
            f"{early}An actor on the trainer's node hands its batch over "
            'without a copy (give that node CPUs and the resources the '
            'actors ask for); across nodes, a faster network or smaller '
            'batches (uint8 images, cropped on the data nodes) shorten it.')


def _transfer_advice(rank: dict, context: dict) -> str:
    if context.get('data_nodes'):
        return _ray_transfer_advice(rank)
    ms, slack = rank['transfer']['mean'], rank['slack']['p50']
    pinned = context.get('pin_memory')
    how = ('every tensor comes through shared memory, is unpickled' +
           (' and copied into pinned memory' if pinned else '') +
           ', one batch at a time')
    early = (f'Batches were ready {slack:.0f} ms before the step asked for '
             'them (median): the workers keep up, so more workers or a '
             'cheaper pipeline will not shorten the wait; it is the '
             'hand-over, or a training process short of CPU. '
             ) if batches_were_early(rank) else ''
    pin = '' if pinned else (
        ' With a GPU, set pin_memory=True: page-locked batches copy to the '
        'GPU asynchronously.')
    if context.get('collate') == 'block_collate':
        fix = ('Each batch already travels as one block: keep per-sample '
               'metadata small (Python objects are pickled through a pipe).')
    else:
        fix = ('Hand the batch over as one shared-memory block (one '
               'segment, page-locked in one copy, moved to the device in '
               f'one copy a step ahead): {HANDOVER_LINES}.')
    return (f'Moving a batch to the training process takes {ms:.1f} ms '
            f'({how}). {early}{fix}{pin}')


def _trainer_advice(rank: dict, context: dict) -> str:
    stages = rank.get('trainer') or {}
    parts = ', '.join(f'{key} {ms:.1f}' for key, ms in stages.items())
    head = (f'The training process spends {_pct(rank["trainer_share"])} '
            f'of step time on data work ({parts} ms per step), inside what '
            'would otherwise be the model\'s compute.')
    if context.get('collate') != 'block_collate' or not context.get(
            'device_feed'):
        return (f'{head} Receive each batch as one block, pin it once and '
                'copy it to the device one step ahead, and let the data '
                f'preprocessor skip its per-sample moves: {HANDOVER_LINES}.')
    return (f'{head} The batch already comes as one block, fed ahead: what '
            'remains is the data preprocessor\'s own work; keep images '
            'equal-sized after the pipeline (block_collate stacks them, so '
            'they are normalised as one batch) and per-sample metadata '
            'small.')


def _stage_advice(key: str, rank: dict, context: dict) -> Optional[str]:
    worker_ms = rank['worker']['mean']
    if key == 'transfer':
        return _transfer_advice(rank, context)
    if key == 'trainer':
        return _trainer_advice(rank, context)
    cost = stage_costs(rank).get(key, 0.0)
    share = cost / worker_ms if worker_ms else 0.0
    head = (f'{stage_label(key)} is {_pct(share)} of worker time '
            f'({cost:.1f} ms per batch)')
    if key == 'io':
        cpu = rank.get('cpu_share')
        busy = f', workers busy on CPU {_pct(cpu)} of the time' if (
            cpu is not None) else ''
        return (f'{head}{busy}: the storage is slow. Copy the data to a '
                'local SSD or RAM disk, pack small files (lmdb, tar '
                'shards), or add workers: IO-bound workers may outnumber '
                'the cores.')
    if key == 'decode':
        if any('LoadImageFromFileReduced' in k for k in rank['transforms']):
            return (f'{head}, although JPEGs are decoded reduced: compare '
                    'the decode backends on your files '
                    '(tools/compare_decoders.py), add workers if cores are '
                    'free, or store the images pre-resized.')
        return (f"{head}: try imdecode_backend='turbojpeg' (or 'pillow' "
                'with pillow-simd) in LoadImageFromFile, decode at reduced '
                'size (ReducedDecodePipeline), or store the images '
                'pre-resized.')
    if key == 'fetch':
        return (f'{head}: per-sample annotation parsing or '
                'deserialisation in __getitem__; parse annotations once '
                '(BaseDataset.load_data_list, serialize_data=True) or cache '
                'them.')
    if key == 'collate':
        return (f'{head}: batch-level work in collate_fn (padding, mixing); '
                "move it to the model's data_preprocessor or collate uint8 "
                'tensors.')
    name = key.rsplit('_', 1)[-1]
    if name.startswith('Load') and 'io' not in rank['stages']:
        return (f'{head}: it reads and decodes outside mmengine.fileio / '
                'mmcv.imfrombytes, so both are one stage here. Use faster '
                'storage or a faster decoder, or store smaller images.')
    return (f"{head}: make it cheaper, move it to the model's "
            'data_preprocessor (batched, on the GPU), or do its '
            'deterministic part offline.')


def _count_verdict(rank: dict, count: int, needed: int,
                   level: str) -> Optional[str]:
    """Whether ``count`` producers (workers, actors) are a ``'surplus'``
    (the loader keeps up with more than one to spare) or ``'short'`` (it
    does not, and batches were not ready early: the hand-over is not what
    is slow); None when neither."""
    if level == 'none':
        return 'surplus' if count > needed + 1 else None
    if needed <= count or batches_were_early(rank):
        return None
    return 'short'


def _worker_advice(rank: dict, context: dict, needed: Optional[int],
                   level: str) -> Optional[str]:
    workers = context.get('num_workers', 0)
    worker_ms, compute_ms = rank['worker']['mean'], rank['compute']['mean']
    if needed is None:
        return None
    cores = context.get('cpus') or 1
    local_ranks = context.get('local_world_size') or 1
    per_rank = max(cores // local_ranks, 1)
    # Workers that mostly wait (for files, for sleeps) need no core each.
    cpu_share = rank.get('cpu_share') or 1.0
    basis = (f'a batch takes {worker_ms:.1f} ms of one worker and a '
             f'training step {compute_ms:.1f} ms')
    count = _count_verdict(rank, workers, needed, level)
    if count == 'surplus':
        return (f'num_workers={workers} is more than the {needed} '
                f'needed ({basis}); fewer workers would save memory and '
                'CPU.')
    if count is None:
        return None
    if needed * cpu_share > per_rank:
        return (f'{needed} workers would keep up ({basis}), but there are '
                f'{cores} cores for {local_ranks} rank(s) here: make the '
                'pipeline cheaper (see the other advice) or use more CPU.')
    keep_up = '1 worker keeps' if needed == 1 else f'{needed} workers keep'
    return (f'Raise num_workers from {workers} to {needed}: {basis}, so '
            f'{keep_up} up.')


def actors_needed(needed: Optional[int],
                  local_workers: int) -> Optional[int]:
    """The Ray data actors among ``needed`` producers (of
    :func:`workers_needed`): ``local_workers`` making a share
    (``RayDataNodesHook(local_workers=True)``) are the others; at least
    one."""
    if needed is None:
        return None
    return max(needed - local_workers, 1)


def _actor_advice(rank: dict, nodes: dict, needed: Optional[int],
                  level: str) -> Optional[str]:
    """The Ray data actors that keep up: sized by ``num_actors='auto'``
    or to set (``nodes`` is the context's ``data_nodes``)."""
    needed = actors_needed(needed, nodes.get('local_workers', 0))
    if needed is None:
        return None
    actors = nodes['actors']
    producer = ('one actor or local worker'
                if nodes.get('local_workers') else 'one actor')
    basis = (f"a batch takes {rank['worker']['mean']:.1f} ms of {producer} "
             f"and a training step {rank['compute']['mean']:.1f} ms")
    if nodes['num_actors'] == 'auto':
        low, high = nodes['min_actors'], nodes['max_actors']
        if needed > high:
            return (f'{needed} actors would keep up ({basis}), more than '
                    f'max_actors={high}: raise max_actors to {needed} '
                    '(with the CPUs for them on the data nodes).')
        return (f"num_actors='auto' sizes the pool to the {needed} "
                f'actor(s) that keep up ({basis}); {actors} now, within '
                f'{low}-{high}.')
    count = _count_verdict(rank, actors, needed, level)
    if count == 'surplus':
        return (f'num_actors={actors} is more than the {needed} needed '
                f'({basis}); fewer actors would free CPUs on the data '
                'nodes.')
    if count is None:
        return None
    return (f'Raise num_actors from {actors} to {needed}: {basis}, so '
            f"{needed} actors keep up (or num_actors='auto' with "
            f'max_actors={needed}: sized while training).')


def _straggler_advice(rank: dict) -> Optional[str]:
    workers = [w for w in rank['workers'] if w['batches'] >= 5]
    if len(workers) < 2:
        return None
    typical = median(w['time']['p90'] for w in workers)
    slow = max(workers, key=lambda w: w['time']['p90'])
    if not typical or slow['time']['p90'] < STRAGGLER_FACTOR * typical:
        return None
    return (f"Worker {slow['worker']} is a straggler: p90 "
            f"{slow['time']['p90']:.1f} ms per batch vs {typical:.1f} ms "
            'typical. Batches are delivered in order, so it holds back '
            'batches that are ready; look for costly samples (large '
            'images) or set in_order=False (torch >= 2.6) if the order may '
            'change.')


def _rank_advice(ranks: List[dict], worst: dict) -> Optional[str]:
    others = [r['wait_share'] for r in ranks if r is not worst]
    if not others or worst['wait_share'] < MODERATE:
        return None
    if worst['wait_share'] < 2 * median(others):
        return None
    return (f"Rank {worst['rank']} is starved: {_pct(worst['wait_share'])} "
            f'of its step time waiting for data, at most '
            f'{_pct(max(others))} on the other ranks (they wait for it '
            'inside the gradient all-reduce). Check what differs on its '
            'node: storage, CPU load, its share of the data.')


def _other_advice(rank: dict, context: dict) -> List[dict]:
    advice = []
    refetch = rank['refetch']
    if refetch['per_sample'] >= 0.01:
        key, count = max(refetch['drops'].items(), key=lambda kv: kv[1])
        advice.append(
            dict(
                topic='refetch',
                text=f"{_pct(refetch['per_sample'])} of samples were "
                f'dropped and fetched again ({key} returned None {count} '
                f"times), costing {refetch['ms_per_batch']:.1f} ms per "
                'batch: filter those samples beforehand (filter_cfg).'))
    startup = rank['startup']
    if (context.get('num_workers') and not context.get('persistent_workers')
            and startup['count'] > 1):
        advice.append(
            dict(
                topic='persistent_workers',
                text=f"Workers were started {startup['count']} times; the "
                f"first batch took {startup['wait']['mean']:.0f} ms on "
                'average. Set persistent_workers=True.'))
    cpu, io = rank.get('cpu_share'), rank['stages'].get('io', {})
    workers = context.get('num_workers', 0)
    local_ranks = context.get('local_world_size') or 1
    processes = (workers + 1) * local_ranks  # + the training processes
    if (cpu is not None and cpu < 0.5 and io.get('share', 0.0) < 0.25
            and processes > (context.get('cpus') or 1)):
        advice.append(
            dict(
                topic='cpu',
                text=f'Workers were on CPU only {_pct(cpu)} of their batch '
                'time without waiting for files, and there are more '
                f'processes than cores ({workers} workers + 1, x '
                f"{local_ranks} rank(s), on {context.get('cpus')} cores): "
                'they wait for a core. Use fewer workers or keep cv2/OpenMP '
                'at one thread per worker.'))
    return advice


def _data_share(rank: dict) -> float:
    """The share of step time spent on data: waiting for it, and the
    training process's own data work (reports of older versions have
    none)."""
    return rank['wait_share'] + rank.get('trainer_share', 0.0)


def stages_measured(rank: dict) -> bool:
    """Whether a counted batch of ``rank`` was timed in stages (reports
    of older versions have no count: every batch was)."""
    sampling = rank.get('sampling')
    return (sampling is None or not rank.get('batches')
            or sampling['timed_batches'] > 0)


def judge(ranks: List[dict], context: dict) -> dict:
    """The verdict on the worst rank, with its advice.

    Args:
        ranks (list[dict]): Rank summaries (``DataLoaderMonitor.summary``
            with a ``rank`` entry).
        context (dict): Loader settings (``num_workers`` ...).
    """
    measured = [r for r in ranks if r['steps']]
    if not measured:
        return dict(
            input_bound='unknown',
            summary='No step was measured (the run was shorter than the '
            'warm-up).',
            advice=[])
    worst = max(measured, key=_data_share)
    level = input_bound_level(_data_share(worst))
    # With RayDataNodesHook, Ray actors make the batches (their production
    # time is the worker time), not the loader's workers.
    nodes = context.get('data_nodes')
    workers = context.get('num_workers', 0)
    needed = workers_needed(worst['worker']['mean'], worst['compute']['mean'])
    bottleneck, bottleneck_share = find_bottleneck(
        worst, nodes['actors'] + nodes.get('local_workers', 0)
        if nodes else workers)
    trainer_share = worst.get('trainer_share', 0.0)
    if trainer_share >= MODERATE and trainer_share >= worst['wait_share']:
        bottleneck, bottleneck_share = 'trainer', trainer_share
    where = f" (rank {worst['rank']}, the worst of {len(ranks)})" if len(
        ranks) > 1 else ''
    summary = (f'Input-bound: {level.upper()}: '
               f"{100 * worst['wait_share']:.1f}% of step time is spent "
               f'waiting for data{where}')
    summary += (f' and {100 * trainer_share:.1f}% on data work in the '
                'training process (receive, pin, copy to the device, data '
                'preprocessor).' if trainer_share >= 0.0005 else '.')
    # Stage figures are estimated from the timed batches: their error.
    bottleneck_stderr = (
        stage_stderr(worst, bottleneck) / worst['worker']['mean']
        if bottleneck and bottleneck not in ('transfer', 'trainer') else 0.0)
    if bottleneck:
        of = ('step time' if bottleneck in ('transfer', 'trainer') else
              'worker time')
        error = (f' +- {_pct(bottleneck_stderr)}'
                 if bottleneck_stderr >= 0.005 else '')
        summary += (f' Bottleneck: {stage_label(bottleneck)} '
                    f'({_pct(bottleneck_share)}{error} of {of}).')
    if not stages_measured(worst) and not nodes:
        summary += (' No stage sample yet: none of the counted batches was '
                    'timed in stages (one batch in K is, after the first '
                    f'{FULL_BATCHES} of each loading process), so the '
                    'stage and transform figures are missing, not zero; '
                    'measure more steps.')
    advice = []
    for topic, text in (('rank', _rank_advice(measured, worst)),
                        ('actors', _actor_advice(worst, nodes, needed, level)
                         if nodes else None),
                        ('workers', None if nodes else _worker_advice(
                            worst, context, needed, level)),
                        ('stage', _stage_advice(bottleneck, worst, context)
                         if bottleneck and level != 'none' else None),
                        ('straggler', _straggler_advice(worst)
                         if level != 'none' and not nodes else None)):
        if text:
            advice.append(dict(topic=topic, text=text))
    if level != 'none' and not nodes:  # about local workers
        advice += _other_advice(worst, context)
    return dict(
        input_bound=level,
        wait_share=worst['wait_share'],
        trainer_share=trainer_share,
        worst_rank=worst['rank'],
        rank_wait_shares={str(r['rank']): r['wait_share']
                          for r in measured},
        wait_ms=worst['wait']['mean'],
        compute_ms=worst['compute']['mean'],
        worker_ms=worst['worker']['mean'],
        bottleneck=bottleneck,
        bottleneck_share=bottleneck_share,
        bottleneck_stderr=bottleneck_stderr,
        workers_needed=None if nodes else needed,
        num_workers=workers,
        **(dict(actors_needed=actors_needed(
                    needed, nodes.get('local_workers', 0)),
                num_actors=nodes['actors'])
           if nodes else {}),
        summary=summary,
        advice=advice)


def build_report(rank_summaries: List[dict], **context) -> dict:
    """The report (JSON schema in docs/data_monitor.md) of all ranks.

    Args:
        rank_summaries (list[dict]): ``DataLoaderMonitor.summary()`` of each
            rank, each with a ``rank`` entry.
        **context: Extra context (``world_size``, ``local_world_size``,
            ``iteration`` ...).
    """
    ranks = sorted(rank_summaries, key=lambda r: r['rank'])
    merged = dict(ranks[0]['context'])
    merged.setdefault('world_size', len(ranks))
    merged.setdefault('local_world_size',
                      int(os.environ.get('LOCAL_WORLD_SIZE', 1)))
    merged.update(context)
    verdict = judge(ranks, merged)
    return dict(
        schema=SCHEMA,
        created=datetime.datetime.now().isoformat(timespec='seconds'),
        context=merged,
        pipelines=ranks[0]['pipelines'],
        verdict={
            k: v
            for k, v in verdict.items() if k != 'advice'
        },
        advice=verdict['advice'],
        ranks=[{
            k: v
            for k, v in r.items() if k not in ('pipelines', )
        } for r in ranks])
