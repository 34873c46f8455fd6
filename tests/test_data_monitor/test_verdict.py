"""Verdict, advice and report rendering on synthetic figures."""
import json

import pytest

from mmdata_plugin.data_monitor import (build_report, format_report,
                                        input_bound_level, load_report,
                                        plot_report, save_report)
from mmdata_plugin.data_monitor.statistics import StatsBook
from mmdata_plugin.data_monitor.verdict import workers_needed

CONTEXT = dict(
    num_workers=2,
    batch_size=4,
    persistent_workers=True,
    pin_memory=False,
    prefetch_factor=2,
    start_method='fork',
    dataset_type='ImageListDataset',
    sampler_type='InfiniteSampler',
    cpus=8,
    host='node0')


def fake_rank(rank=0,
              wait=1.0,
              compute=50.0,
              stages=None,
              cpu=1.0,
              slow_worker=None,
              drops=None,
              startups=1,
              steps=40,
              slack=1.0,
              samples=4,
              **context):
    """A rank summary from ``steps`` steps of the given costs (ms).

    ``wait`` and ``slack`` (how long before the request the batch was
    ready; negative: after) may be sequences, cycled through by step.
    """
    stages = stages or {
        'io': 2.0,
        'decode': 10.0,
        '01_Resize': 5.0,
        'collate': 1.0
    }
    context = dict(CONTEXT, **context)
    book = StatsBook()
    clock = 0.0
    for step in range(steps):
        worker = step % max(context['num_workers'], 1)
        scale = 3.0 if worker == slow_worker else 1.0
        costs = {k: scale * v / 1e3 for k, v in stages.items()}
        end = clock + sum(costs.values())
        requested = end + _at(slack, step) / 1e3
        record = dict(
            pid=100 + worker,
            worker=worker,
            samples=samples,
            start=clock,
            end=end,
            cpu=cpu * (end - clock),
            stages=costs,
            drops=dict(drops or {}),
            refetch_time=0.0)
        waited = _at(wait, step) / 1e3
        book.add(waited, compute / 1e3, record, requested, requested + waited)
        clock = requested + 1.0
    summary = book.summary()
    summary.update(
        rank=rank,
        skipped=0,
        timeline=[],
        context=context,
        pipelines=[],
        startup=dict(
            count=startups,
            wait=dict(
                mean=800.0, p50=800.0, p90=800.0, max=800.0, count=startups)))
    return summary


def _at(value, step):
    return value[step % len(value)] if isinstance(value, (list, tuple)) else (
        value)


def _report(*ranks, **context):
    return build_report(list(ranks), **context)


def _topics(report):
    return [a['topic'] for a in report['advice']]


def test_levels_follow_the_tf_thresholds():
    assert input_bound_level(0.049) == 'none'
    assert input_bound_level(0.05) == 'moderate'
    assert input_bound_level(0.199) == 'moderate'
    assert input_bound_level(0.2) == 'high'
    assert workers_needed(30.0, 10.0) == 3
    # Rounded up, not to nearest: 2 workers would deliver every 12.5 ms.
    assert workers_needed(25.0, 10.0) == 3
    assert workers_needed(21.0, 10.0) == 3
    assert workers_needed(30.0, 0.1) is None  # a consumer doing nothing


def test_compute_bound_run_gets_no_stage_advice():
    report = _report(fake_rank(wait=0.5, compute=50.0))
    verdict = report['verdict']
    assert verdict['input_bound'] == 'none'
    assert verdict['workers_needed'] == 1
    assert report['advice'] == []
    surplus = _report(fake_rank(wait=0.5, compute=50.0, num_workers=8))
    assert _topics(surplus) == ['workers']
    assert 'num_workers=8 is more than the 1 needed' in (
        surplus['advice'][0]['text'])


def test_decode_bound_run_names_decode_and_the_workers_needed():
    report = _report(
        fake_rank(
            wait=9.0,
            compute=10.0,
            stages={
                'io': 2.0,
                'decode': 30.0,
                '01_Resize': 5.0
            }))
    verdict = report['verdict']
    assert verdict['input_bound'] == 'high'
    assert verdict['wait_share'] == pytest.approx(9 / 19)
    assert verdict['bottleneck'] == 'decode'
    assert verdict['bottleneck_share'] == pytest.approx(30 / 37)
    assert verdict['workers_needed'] == 4
    assert _topics(report) == ['workers', 'stage']
    assert report['advice'][0]['text'].startswith(
        'Raise num_workers from 2 to 4: a batch takes 37.0 ms of one worker '
        'and a training step 10.0 ms')
    assert "image decode is 81% of worker time (30.0 ms per batch): try " \
        "imdecode_backend='turbojpeg'" in report['advice'][1]['text']
    assert 'Bottleneck: image decode (81% of worker time)' in (
        verdict['summary'])


def test_decode_advice_knows_when_the_loader_already_decodes_reduced():
    report = _report(
        fake_rank(
            wait=9.0,
            compute=10.0,
            stages={
                'decode': 30.0,
                '00_ReducedDecodePipeline.0_LoadImageFromFileReduced': 0.1
            }))
    advice = report['advice'][-1]['text']
    assert 'although JPEGs are decoded reduced' in advice
    assert 'compare_decoders' in advice and 'turbojpeg' not in advice


def test_throughput_is_counted_steps_over_their_wall_time():
    rank = fake_rank(wait=9.0, compute=11.0)  # 20 ms per step, 4 samples
    assert rank['throughput']['batches_per_s'] == pytest.approx(50.0)
    assert rank['throughput']['samples_per_s'] == pytest.approx(200.0)
    assert 'Throughput: 200.0 samples/s, 50.00 batches/s' in format_report(
        _report(rank))


def test_worker_advice_depends_on_cores_and_cpu_use():
    cpu_bound = _report(
        fake_rank(wait=9.0, compute=10.0, cpus=2, stages={'decode': 37.0}))
    assert ('4 workers would keep up (a batch takes 37.0 ms of one worker '
            'and a training step 10.0 ms), but there are 2 cores'
            ) in cpu_bound['advice'][0]['text']
    # Workers that wait on storage need no core each.
    io_bound = _report(
        fake_rank(
            wait=9.0,
            compute=10.0,
            cpus=2,
            cpu=0.1,
            stages={
                'io': 35.0,
                'decode': 2.0
            }))
    assert io_bound['advice'][0]['text'].startswith(
        'Raise num_workers from 2 to 4')
    assert 'the storage is slow' in io_bound['advice'][1]['text']
    assert 'workers busy on CPU 10%' in io_bound['advice'][1]['text']


def test_cpu_starved_workers_are_told_only_when_cores_are_oversubscribed():
    stages = {'decode': 37.0}
    crowded = _report(
        fake_rank(wait=9.0, compute=10.0, cpu=0.3, cpus=2, stages=stages))
    assert 'cpu' in _topics(crowded)
    assert 'more processes than cores (2 workers + 1, x 1 rank(s), on 2 ' \
        'cores)' in crowded['advice'][-1]['text']
    roomy = _report(
        fake_rank(wait=9.0, compute=10.0, cpu=0.3, cpus=8, stages=stages))
    assert 'cpu' not in _topics(roomy)


def test_slow_transfer_is_the_bottleneck_over_cheap_workers():
    report = _report(
        fake_rank(wait=20.0, compute=10.0, stages={'01_Pack': 1.0}))
    assert report['verdict']['bottleneck'] == 'transfer'
    assert 'Moving a batch to the training process takes 20.0 ms' in (
        report['advice'][-1]['text'])


def test_many_cheap_stages_make_the_workers_the_limit_not_the_hand_over():
    # 8 workers x 10 stages of 10 ms: a batch every 12.5 ms from the
    # workers, while a hand-over takes 2 ms; no stage alone costs more per
    # worker (1.25 ms) than the hand-over, but the workers are the limit.
    stages = {f'{i:02d}_T{i}': 10.0 for i in range(10)}
    report = _report(fake_rank(wait=7.5, compute=5.0, stages=stages,
                               slack=-5.0, num_workers=8, cpus=64))
    assert report['verdict']['bottleneck'] != 'transfer'
    assert 'workers' in _topics(report)


# Issue 14's case: batch 32, 2 workers, 01_BarSleep 59% of worker time.
HANDOVER_STAGES = {'io': 30.0, 'decode': 40.0, '01_BarSleep': 130.0,
                   'collate': 20.0}
EARLY = [500.0 + 80.0 * i / 9 for i in range(10)]  # ready 500-580 ms early
HANDOVER = [12.0 + 29.0 * i / 9 for i in range(10)]  # wait = transfer


@pytest.mark.parametrize('step_ms', [150.0, 40.0])
def test_batches_ready_early_name_the_hand_over(step_ms):
    report = _report(
        fake_rank(
            wait=HANDOVER,
            compute=step_ms,
            slack=EARLY,
            samples=32,
            stages=HANDOVER_STAGES))
    rank, verdict = report['ranks'][0], report['verdict']
    assert rank['transfer']['mean'] == pytest.approx(rank['wait']['mean'])
    assert verdict['input_bound'] != 'none'
    assert verdict['bottleneck'] == 'transfer'
    assert 'Bottleneck: hand-over to the training process (transfer)' in (
        verdict['summary'])
    # More workers would not help: no advice to raise them.
    assert 'workers' not in _topics(report)
    text = report['advice'][-1]['text']
    assert 'Batches were ready 5' in text and 'workers keep up' in text
    assert "collate_fn=dict(type='block_collate')" in text
    assert "dict(type='DeviceFeedHook')" in text and 'pin_memory=True' in text
    assert 'storage' not in text and 'make it cheaper' not in text


@pytest.mark.parametrize('step_ms', [150.0, 40.0])
def test_batches_ready_late_still_name_the_worker_stage(step_ms):
    late = [-30.0 - 30.0 * i / 9 for i in range(10)]  # ready after asked
    transfer = [1.0 + 2.0 * i / 9 for i in range(10)]
    report = _report(
        fake_rank(
            wait=[t - s for t, s in zip(transfer, late)],
            compute=step_ms,
            slack=late,
            samples=32,
            stages=HANDOVER_STAGES))
    verdict = report['verdict']
    assert verdict['input_bound'] != 'none'
    assert verdict['bottleneck'] == '01_BarSleep'
    assert verdict['bottleneck_share'] == pytest.approx(130 / 220)
    assert '01_BarSleep is 59% of worker time' in report['advice'][-1]['text']


def test_transfer_advice_says_pinned_only_with_pin_memory():
    for pin in (False, True):
        report = _report(
            fake_rank(
                wait=20.0,
                compute=10.0,
                stages={'01_Pack': 1.0},
                pin_memory=pin))
        text = report['advice'][-1]['text']
        assert text.startswith('Moving a batch to the training process')
        assert ('pinned' in text) is pin
        assert ('set pin_memory=True' in text) is not pin


def test_straggler_worker_refetches_and_restarts_are_reported():
    report = _report(
        fake_rank(
            wait=9.0,
            compute=10.0,
            slow_worker=1,
            persistent_workers=False,
            startups=3,
            drops={'02_Filter': 1}))
    assert _topics(report) == [
        'workers', 'stage', 'straggler', 'refetch', 'persistent_workers'
    ]
    text = {a['topic']: a['text'] for a in report['advice']}
    assert text['straggler'].startswith('Worker 1 is a straggler: p90 54.0 ms')
    assert '25% of samples were dropped and fetched again (02_Filter ' \
        'returned None 40 times)' in text['refetch']
    assert 'Workers were started 3 times; the first batch took 800 ms' in (
        text['persistent_workers'])


def test_several_ranks_are_judged_by_the_starved_one():
    report = _report(
        fake_rank(rank=0, wait=0.3, compute=40.0, host='node0'),
        fake_rank(rank=1, wait=30.0, compute=10.0, host='node1'))
    verdict = report['verdict']
    assert verdict['worst_rank'] == 1
    assert verdict['input_bound'] == 'high'
    assert verdict['rank_wait_shares'] == pytest.approx({
        '0': 0.3 / 40.3,
        '1': 0.75
    })
    assert '(rank 1, the worst of 2)' in verdict['summary']
    assert report['advice'][0]['text'].startswith(
        'Rank 1 is starved: 75% of its step time waiting for data, at most '
        '1% on the other ranks')
    text = format_report(report)
    assert 'Per rank (ms per step):' in text
    assert 'node1' in text and '75.0%' in text
    assert 'Where the data time goes (rank 1, 40 steps' in text


def test_a_run_shorter_than_the_warmup_has_no_verdict():
    report = _report(fake_rank(steps=0))
    assert report['verdict']['input_bound'] == 'unknown'
    assert 'No step was measured' in format_report(report)


def test_report_file_round_trip_and_plot(tmp_path):
    report = _report(fake_rank(wait=9.0, compute=10.0))
    report['ranks'][0]['timeline'] = [
        dict(
            step=s,
            steps=10,
            wait=9.0,
            compute=10.0,
            worker=18.0,
            transfer=0.1,
            stages={
                'io': 2.0,
                'decode': 10.0,
                '01_Resize': 5.0,
                'collate': 1.0
            }) for s in (10, 20, 30)
    ]
    path = str(tmp_path / 'out' / 'data_monitor.json')
    save_report(report, path)
    assert load_report(path) == json.loads(json.dumps(report))
    png = plot_report(report, str(tmp_path / 'plot.png'))
    with open(png, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'

    bad = tmp_path / 'bad.json'
    bad.write_text('{"schema": "something/else"}')
    with pytest.raises(ValueError, match=f"{bad}: not a data-monitor report"):
        load_report(str(bad))
    bad.write_text('{not json')
    with pytest.raises(ValueError, match=f'{bad}: not a JSON file'):
        load_report(str(bad))
