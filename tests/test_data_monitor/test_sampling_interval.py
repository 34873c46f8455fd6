"""How often a loading process times a batch in stages (issue 23, item 2):
the amortised cost of timing stays within its budget per sample, heavy
samples and nested wrappers included."""
import pytest

from mmdata_plugin.data_monitor.worker_timing import (FULL_BATCHES,
                                                      MAX_EVERY, REGION_COST,
                                                      SAMPLE_BUDGET,
                                                      TARGET_OVERHEAD,
                                                      BatchAccumulator,
                                                      TimingPlan)


def timed_batches(regions_per_sample, sample_cpu, batch_size, batches):
    """The batches a worker's accumulator times (numbered from 1), and its
    K at the end."""
    acc = BatchAccumulator()
    acc.plans.append(TimingPlan())
    timed = []
    for batch in range(1, batches + 1):
        if acc.timing:
            timed.append(batch)
        acc.samples = batch_size
        acc.regions = (regions_per_sample * batch_size + 1  # + the fetch
                       if acc.timing else 0)
        acc._schedule(sample_cpu * batch_size)
    return timed, acc.every


def chosen_every(regions_per_sample, sample_cpu, batch_size):
    """K once the sampling has settled."""
    return timed_batches(regions_per_sample, sample_cpu, batch_size,
                         4 * MAX_EVERY)[1]


@pytest.mark.parametrize('regions_per_sample,sample_cpu,batch_size', [
    (4, 100e-6, 32),  # the benchmark's cheap pipeline
    (5, 260e-6, 16),  # the demo: a cached head around a reduced decode
    (12, 2e-3, 8),  # nested wrappers, IO and decode probes
    (20, 20e-3, 2),  # a detection sample
])
def test_timing_costs_at_most_its_budget_per_sample(regions_per_sample,
                                                    sample_cpu, batch_size):
    every = chosen_every(regions_per_sample, sample_cpu, batch_size)
    timed_batch = (regions_per_sample * batch_size + 2) * REGION_COST
    per_sample = timed_batch / every / batch_size
    assert every < MAX_EVERY
    assert per_sample <= SAMPLE_BUDGET
    assert per_sample <= TARGET_OVERHEAD * sample_cpu


def test_a_heavy_sample_is_not_timed_at_every_batch():
    # 0.2% of a 20 ms sample is 40 us: a share alone would time every batch
    # and spend ~50 us per sample on it.
    assert chosen_every(20, 20e-3, 2) > 100


def test_a_short_run_still_gets_timed_batches_after_the_first_ones():
    # K ramps up (doubling) instead of jumping to its target: a 24-step
    # run whose first 10 steps are a warm-up still has timed steps.
    timed, _ = timed_batches(4, 1e-3, 4, 24)
    assert timed[:FULL_BATCHES] == list(range(1, FULL_BATCHES + 1))
    assert [batch for batch in timed if batch > 10] == [14, 22]
