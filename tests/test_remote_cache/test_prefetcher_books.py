"""The prefetcher's per-sample books stay small: learned sizes in a uint32
array by sample id, one reader of a file as a bare int."""
import tracemalloc

import pytest
from test_prefetcher import build

from mmdata_plugin.remote_cache.file_holders import FileHolders
from mmdata_plugin.remote_cache.sample_sizes import SampleSizes

SAMPLES = 40_000


def test_sizes_tell_unknown_zero_and_large_apart():
    sizes = SampleSizes()
    assert sizes.get(5) is None and 5 not in sizes
    assert sizes.set(5, 0) and sizes.get(5) == 0 and 5 in sizes
    assert not sizes.set(5, 7) and sizes.get(5) == 7
    huge = (1 << 32) + 3
    assert sizes.set(1000, huge) and sizes.get(1000) == huge
    assert not sizes.set(1000, 9) and sizes.get(1000) == 9
    assert sizes.set(3, (1 << 32) - 2) and sizes.get(3) == (1 << 32) - 2
    assert sizes.get(-1) is None and sizes.get(10**9) is None
    with pytest.raises(ValueError, match='sample -1 of 4 bytes'):
        sizes.set(-1, 4)


def test_a_file_of_one_reader_then_two_then_none():
    holders = FileHolders()
    assert holders.add('d', 1) == 1 and holders.add('d', 1) == 1
    assert holders.of('d') == {1} and 'd' in holders
    assert holders.add('d', 2) == 2 and holders.count('d') == 2
    assert not holders.remove('d', 1) and holders.of('d') == {2}
    assert not holders.remove('d', 3)
    assert holders.remove('d', 2) and 'd' not in holders
    assert holders.of('d') == set() and holders.count('d') == 0
    assert holders.remove('gone', 4)


def _bytes_per_sample(action, count):
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        action(count)
        return (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()


def test_books_per_sample(tmp_path):
    prefetcher = build(tmp_path, count=4)[0]
    prefetcher.sample_urls = (
        lambda s: [f's3://bucket/train/n{s % 1000:08d}/n{s % 1000:08d}_{s}'
                   '.JPEG'])

    def learn(count):
        for sample in range(count):
            prefetcher._learn_size(sample, 100_000 + sample)

    def book(count):
        for sample in range(count):
            prefetcher._book(sample)

    learned = _bytes_per_sample(learn, SAMPLES)
    booked = _bytes_per_sample(book, SAMPLES)
    print(f'learned size: {learned:.1f} B, booked sample: {booked:.1f} B')
    # A dict of ints took ~100 B a learned size, a set per file ~200 B more
    # a booked sample (~670 B in all).
    assert learned <= 5
    assert booked <= 480
    assert prefetcher.size_of(SAMPLES - 1) == 100_000 + SAMPLES - 1
