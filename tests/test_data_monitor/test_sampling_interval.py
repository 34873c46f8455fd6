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


def chosen_every(regions_per_sample, sample_cpu, batch_size):
    """K after a timed batch, as a worker's accumulator chooses it."""
    acc = BatchAccumulator()
    acc.plans.append(TimingPlan())
    acc.batches = FULL_BATCHES - 1
    acc.samples = batch_size
    acc.regions = regions_per_sample * batch_size + 1  # + the fetch
    acc._schedule(sample_cpu * batch_size)
    return acc.every


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
