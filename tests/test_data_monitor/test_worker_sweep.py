"""The worker-count sweep: recommendation rule and per-count summaries."""
import pytest

from mmdata_plugin.data_monitor import (format_sweep_table, recommend_workers,
                                        summarize_runs)


@pytest.mark.parametrize('throughput, expected', [
    ({0: 100.0, 2: 190.0, 4: 200.0, 8: 198.0}, 2),  # 190 >= 0.95 * 200
    ({0: 100.0, 2: 189.9, 4: 200.0, 8: 198.0}, 4),  # 189.9 is 5.05% short
    ({8: 50.0, 4: 80.0, 2: 79.0, 0: 20.0}, 2),  # given in any order
    ({0: 30.0, 1: 30.0}, 0),  # a tie goes to fewer workers
    ({0: 10.0, 4: 40.0, 2: None, 8: 0.0}, 4),  # counts that failed
    ({6: 12.5}, 6),
])
def test_recommends_the_smallest_count_within_5_percent_of_the_best(
        throughput, expected):
    assert recommend_workers(throughput) == expected


def test_recommendation_tolerance_and_bad_input():
    throughput = {0: 100.0, 2: 180.0, 4: 200.0}
    assert recommend_workers(throughput, tolerance=0.1) == 2
    assert recommend_workers(throughput, tolerance=0.0) == 4
    with pytest.raises(ValueError, match='no worker count delivered'):
        recommend_workers({0: None, 2: 0.0})
    with pytest.raises(ValueError, match='tolerance'):
        recommend_workers(throughput, tolerance=1.0)


def _report(batches_per_s, samples_per_batch=16, wait_share=0.9,
            bottleneck='decode', startup_ms=500.0):
    """The parts of a monitor report a sweep reads."""
    steps = 20 if batches_per_s else 0
    return dict(
        verdict=dict(
            worst_rank=0,
            bottleneck=bottleneck if steps else None,
            bottleneck_share=0.8),
        ranks=[
            dict(
                rank=0,
                steps=steps,
                throughput=dict(
                    batches_per_s=batches_per_s,
                    samples_per_s=batches_per_s * samples_per_batch
                    if steps else None),
                wait_share=wait_share,
                startup=dict(count=1, wait=dict(mean=startup_ms)))
        ])


def test_a_count_is_summarised_by_the_medians_of_its_runs():
    runs = [
        _report(10.0, wait_share=0.5, startup_ms=400.0),
        _report(14.0, wait_share=0.9, bottleneck='transfer'),
        _report(12.0, wait_share=0.7, startup_ms=600.0)
    ]
    row = summarize_runs(2, runs)
    assert row['batches_per_s'] == 12.0 and row['samples_per_s'] == 192.0
    assert row['wait_share'] == 0.7 and row['startup_ms'] == 500.0
    assert row['median_report'] is runs[2]  # 12 batches/s: its bottleneck
    assert row['batches_per_s_runs'] == [10.0, 14.0, 12.0]
    empty = summarize_runs(8, [_report(0.0)])
    assert empty['batches_per_s'] is None and empty['median_report'] is None
    table = format_sweep_table([row, empty])
    lines = table.splitlines()
    assert lines[0] == 'Worker-count sweep (medians over the runs):'
    assert lines[3].split() == [
        '2', '192.0', '12.00', '10.00-14.00', '70.0%', '500', 'image',
        'decode', '(80%', 'of', 'worker', 'time)'
    ]
    assert lines[4].split() == ['8', '-', '-', '-', '-', '-']
