"""The node cache's line and advice in DataMonitor reports."""
from mmdata_plugin.data_monitor.remote_cache import (format_remote_cache,
                                                     remote_cache_advice)

MB = 2**20


def summary(hits=600, misses=400, **status):
    gauges = dict(inflight=3, target_inflight=8, max_inflight=64,
                  latency_s=0.05, reserve=20 * MB, reserve_full=0,
                  mean_size=100_000)
    gauges.update(status)
    return dict(cache_dir='/nvme/cache', limit=200 * MB,
                committed_bytes=150 * MB, hits=hits, misses=misses,
                hit_ratio=hits / (hits + misses), remote_bytes=40 * MB,
                downloads=400, evicted_entries=10, evicted_bytes=MB, corrupt=2,
                wait_ms_per_batch=12.5, prefetcher=gauges)


def report(wait_share):
    return dict(verdict=dict(wait_share=wait_share, summary=''), advice=[])


def test_line_names_every_figure():
    line = format_remote_cache(summary())
    for part in ('60.0% of reads local', '12.5 ms per batch', '40.0 MiB',
                 '400 requests', '10 evicted', '2 corrupt bodies rejected',
                 '3 in flight', 'max 64'):
        assert part in line


def test_no_advice_when_not_input_bound_or_reads_are_local():
    assert remote_cache_advice(report(0.01), summary(), 10_000) is None
    assert remote_cache_advice(report(0.5), summary(hits=1000, misses=1),
                               10_000) is None


def test_advice_names_the_reserve_then_the_depth_then_the_budget():
    advice = remote_cache_advice(report(0.5), summary(reserve_full=40),
                                 10_000)
    assert 'prefetch_reserve=41943040' in advice
    advice = remote_cache_advice(report(0.5),
                                 summary(target_inflight=64), 10_000)
    assert 'max_inflight=128' in advice
    advice = remote_cache_advice(report(0.5), summary(), 10_000)
    # 40% downloaded, half the step waiting: keep 80% -> 200 MB * 0.8/0.6.
    assert "cache_limit='267.0 MiB'" in advice
    assert 'about 80% of the reads local' in advice


def test_advice_without_a_prefetcher_names_the_hook():
    state = summary()
    state['prefetcher'] = None
    assert 'RemoteCachePrefetchHook' in remote_cache_advice(
        report(0.5), state, 10_000)
