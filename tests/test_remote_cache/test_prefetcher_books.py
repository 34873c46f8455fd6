"""The prefetcher's books hold a few ints per booked sample, none per
sample id of the data set and no file name: rows keyed by sample id and
by file digest, a booked sample's files asked again when needed."""
import tracemalloc

import numpy as np
import pytest
from test_prefetcher import build

from mmdata_plugin.remote_cache.booked_samples import BookedSamples
from mmdata_plugin.remote_cache.file_holders import FileHolders, digest_key

SAMPLES = 40_000


def test_sizes_tell_unknown_zero_and_large_apart():
    books = BookedSamples()
    assert books.size(5) is None and 5 not in books
    assert not books.learn(5, 7) and books.size(5) is None
    books.add(5, files=1)
    assert 5 in books and books.files(5) == 1 and books.size(5) is None
    assert books.learn(5, 0) and books.size(5) == 0
    assert books.learn(5, 7) and books.size(5) == 7
    huge = (1 << 32) + 3
    books.add(1000, files=2)
    assert books.learn(1000, huge) and books.size(1000) == huge
    assert books.learn(1000, 9) and books.size(1000) == 9
    books.add(3, files=0)
    assert books.learn(3, (1 << 32) - 2) and books.size(3) == (1 << 32) - 2
    books.remove(5)
    assert 5 not in books and books.size(5) is None and books.files(5) is None
    assert books.size(-1) is None and books.size(10**9) is None
    with pytest.raises(ValueError, match='sample 3 of -4 bytes'):
        books.learn(3, -4)


def test_a_file_of_one_reader_then_two_then_none():
    holders = FileHolders()
    key = digest_key('ab' * 20)
    assert holders.add(key, 1) == 1 and holders.add(key, 1) == 1
    assert holders.of(key) == {1} and key in holders
    assert holders.holds(key, 1) and not holders.holds(key, 2)
    assert holders.add(key, 2) == 2 and holders.count(key) == 2
    assert holders.holds(key, 2) and holders.of(key) == {1, 2}
    assert not holders.remove(key, 1) and holders.of(key) == {2}
    assert not holders.remove(key, 3)
    assert holders.remove(key, 2) and key not in holders
    assert holders.of(key) == set() and holders.count(key) == 0
    assert holders.remove(digest_key('cd' * 20), 4)
    assert digest_key('f' * 40) == (1 << 63) - 1
    assert digest_key('0' * 40) == -(1 << 63)


def _bytes_per_sample(action, count):
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        action()
        return (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()


def _image(sample):
    return (f's3://bucket/train/n{sample % 1000:08d}/n{sample % 1000:08d}_'
            f'{sample}.JPEG')


def test_books_cost_bytes_per_booked_sample_not_per_id(tmp_path):
    # 40,000 samples of ids up to 1e8 booked (kept, no read ahead) with a
    # learned size: a row of the booked samples and one of the file
    # holders each, no array by sample id (4 bytes an id, 400 MB here)
    # and no file name (a URL string alone is ~100 bytes; the books held
    # ~346 bytes a booked sample).
    prefetcher = build(tmp_path, count=4)[0]
    prefetcher.close()
    prefetcher.sample_urls = lambda sample: [_image(sample)]
    ids = np.random.default_rng(0).choice(10**8, SAMPLES, replace=False)
    ids = ids.tolist()

    def book():
        for sample in ids:
            prefetcher._book(sample)
            prefetcher._learn_size(sample, 100_000 + sample % 1000)

    booked = _bytes_per_sample(book, SAMPLES)
    print(f'booked sample with its size: {booked:.1f} B')
    assert booked <= 44, booked
    assert not prefetcher._files_ahead
    books = prefetcher._books.nbytes + prefetcher._booked.nbytes
    assert books / SAMPLES <= 44, books / SAMPLES
    sample = ids[-1]
    assert prefetcher.size_of(sample) == 100_000 + sample % 1000
    assert prefetcher.booked_files(sample) == [_image(sample)]
    # Off the books: its files go, its size is the mean's again.
    assert prefetcher._unbook(sample, [_image(sample)]) == [_image(sample)]
    assert prefetcher.size_of(sample) == int(prefetcher._mean_size)
    assert prefetcher.booked_files(sample) == []


class HeadServes:
    """``sample_urls`` of samples whose second file a pipeline head
    serves once ``served`` is set (as SampleFiles: ``files`` lists both)."""

    def __init__(self):
        self.served = False

    def files(self, sample):
        return [_image(sample), f'{_image(sample)}.json']

    def __call__(self, sample):
        return self.files(sample)[:1 if self.served else 2]


def test_booked_files_are_found_after_a_head_serves_one(tmp_path):
    prefetcher = build(tmp_path, count=4)[0]
    prefetcher.close()
    prefetcher.sample_urls = HeadServes()
    assert prefetcher._book(7) == HeadServes().files(7)
    prefetcher.sample_urls.served = True
    # Booked before the head served the second file: both are its files,
    # whatever sample_urls lists now.
    assert prefetcher.booked_files(7) == HeadServes().files(7)
    assert prefetcher.booked_files(7, [_image(7)]) == HeadServes().files(7)
    assert prefetcher._unbook(7, prefetcher.booked_files(7)) == \
        HeadServes().files(7)
    assert not len(prefetcher._booked)


def test_booking_many_is_booking_one_by_one(tmp_path):
    # A warm start books the files on disk at once: shared files (within
    # the batch and with a sample booked before), several files, none.
    def files(sample):
        return [[], [_image(sample)],
                [_image(sample), _image(sample + 1)]][sample % 3]

    samples = list(range(1, 40))
    together, one_by_one = (build(tmp_path / name, count=4)[0]
                            for name in ('together', 'one_by_one'))
    for prefetcher in (together, one_by_one):
        prefetcher.close()
        prefetcher.sample_urls = files
        prefetcher._book(100, [_image(3)])
    together._book_many(samples, [files(sample) for sample in samples])
    together._learn_sizes(samples[1:], [7 * sample for sample in samples[1:]])
    for sample in samples:
        one_by_one._book(sample, files(sample))
        if sample != samples[0]:
            one_by_one._learn_size(sample, 7 * sample)
    for sample in samples + [100]:
        assert together.booked_files(sample) == one_by_one.booked_files(
            sample)
        assert together.size_of(sample) == one_by_one.size_of(sample)
    for url in {url for sample in samples for url in files(sample)}:
        key = together._file_key(url)
        assert together._booked.of(key) == one_by_one._booked.of(key)
    assert together._mean_size == pytest.approx(one_by_one._mean_size)


class ToldSizes:
    """``sample_urls`` of a source that tells sizes (a shard index)."""

    def nbytes(self, sample):
        return 1000 + sample

    def __call__(self, sample):
        return [_image(sample)]


def test_a_size_the_source_tells_counts_until_one_is_learned(tmp_path):
    prefetcher = build(tmp_path, count=4)[0]
    prefetcher.close()
    mean = int(prefetcher._mean_size)
    assert prefetcher.size_of(5) == mean
    prefetcher.sample_urls = ToldSizes()
    assert prefetcher.size_of(5) == 1005
    assert prefetcher._download_hint(5) == 1005
    prefetcher._book(5)
    prefetcher._learn_size(5, 777)
    assert prefetcher.size_of(5) == 777


def test_readers_past_4_billion():
    holders = FileHolders()
    first, second = digest_key('12' * 20), digest_key('34' * 20)
    assert holders.add(first, 3) == 1
    assert holders.add(first, 1 << 33) == 2
    assert not holders.remove(first, 3) and holders.of(first) == {1 << 33}
    assert holders.add_many([second], [(1 << 40) + 1]).tolist() == [False]
    assert holders.holds(second, (1 << 40) + 1) and holders.of(first) == {
        1 << 33
    }
