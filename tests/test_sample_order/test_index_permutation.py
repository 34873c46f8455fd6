import numpy as np
import pytest

from mmdata_plugin.sample_order import IndexPermutation
from mmdata_plugin.sample_order.index_permutation import permute_each


@pytest.mark.parametrize('n', [0, 1, 2, 3, 4, 5, 17, 1000, 65537, 123457])
def test_is_a_bijection_of_range_n(n):
    for seed, epoch in [(0, 0), (1, 0), (0, 1), (2**63 + 5, 7)]:
        ids = IndexPermutation(n, seed, epoch)(np.arange(n))
        assert ids.dtype == np.int64
        assert np.array_equal(np.sort(ids), np.arange(n))


def test_any_block_of_positions_gives_the_same_ids():
    perm = IndexPermutation(100_003, seed=3, epoch=2)
    whole = perm(np.arange(100_003))
    assert np.array_equal(perm(np.arange(500, 900)), whole[500:900])
    picks = np.array([99_999, 0, 7, 7])
    assert np.array_equal(perm(picks), whole[picks])


def test_seed_and_epoch_choose_the_permutation():
    n = 1000
    base = IndexPermutation(n, 0, 0)(np.arange(n))
    assert np.array_equal(base, IndexPermutation(n, 0, 0)(np.arange(n)))
    for other in (IndexPermutation(n, 1, 0), IndexPermutation(n, 0, 1)):
        assert (other(np.arange(n)) == base).mean() < 0.05
    # Not close to the identity either.
    assert abs(np.corrcoef(np.arange(n), base)[0, 1]) < 0.1



# Sizes just above a power of four walk the cycle most (domain ~4x n).
@pytest.mark.parametrize('n', [1, 2, 3, 5, 17, 257, 1000, 1025, 65537,
                               123457])
@pytest.mark.parametrize('rounds', [4, 6])
def test_inverse_undoes_the_permutation(n, rounds):
    positions = np.arange(n)
    for seed, epoch in [(0, 0), (1, 0), (0, 1), (2**63 + 5, 7), (99, 3)]:
        perm = IndexPermutation(n, seed, epoch, rounds)
        ids = perm(positions)
        assert np.array_equal(perm.inverse(ids), positions)
        assert np.array_equal(perm(perm.inverse(positions)), positions)


def test_inverse_at_a_billion_positions():
    perm = IndexPermutation(10**9 + 7, seed=5, epoch=2)
    positions = np.random.default_rng(0).integers(0, 10**9 + 7, 100_000)
    inverse = perm.inverse(positions)
    assert inverse.dtype == np.int64
    assert np.array_equal(perm(inverse), positions)

def _chi2_bounds(df, z=3.719):
    """chi2(df) quantiles at p=1e-4 in each tail (Wilson-Hilferty)."""
    return tuple(df * (1 - 2 / (9 * df) + sign * z * np.sqrt(2 / (9 * df)))**3
                 for sign in (-1, 1))


def _rank_chi2s(ids, labels, world_size, num_classes):
    """Per-rank chi2 of class histograms vs the global class shares.

    A rank's share of a uniform permutation is drawn without replacement, so
    each statistic is divided by the finite-population factor (1 - m / n) to
    follow chi2(num_classes - 1).
    """
    expected_share = np.bincount(labels, minlength=num_classes) / labels.size
    stats = []
    for rank in range(world_size):
        hist = np.bincount(labels[ids[rank::world_size]],
                           minlength=num_classes)
        expected = expected_share * hist.sum()
        correction = 1 - hist.sum() / labels.size
        stats.append(((hist - expected)**2 / expected).sum() / correction)
    return stats


def _uniform_like(ids, labels, world_size, num_classes, mini_epochs):
    low, high = _chi2_bounds(num_classes - 1)
    stats = _rank_chi2s(ids, labels, world_size, num_classes)
    # Mini-epochs are contiguous position ranges: each must be uniform too.
    for part in np.array_split(ids, mini_epochs):
        stats += _rank_chi2s(part, labels, world_size, num_classes)
    return all(low < stat < high for stat in stats)


@pytest.mark.parametrize('n', [40_000, 2**16])
def test_chi_square_on_a_class_sorted_file(n):
    """Each rank's classes (whole epoch and each mini-epoch) on a
    class-sorted list are as mixed as under a uniform permutation -- neither
    skewed nor suspiciously even; the test catches a weak permutation."""
    classes, world_size, mini_epochs = 64, 8, 8
    labels = np.repeat(np.arange(classes), -(-n // classes))[:n]
    true_perm = np.random.default_rng(0).permutation(n)
    assert _uniform_like(true_perm, labels, world_size, classes, mini_epochs)
    for epoch in range(3):
        ids = IndexPermutation(n, seed=11, epoch=epoch)(np.arange(n))
        assert _uniform_like(ids, labels, world_size, classes, mini_epochs)
    weak = IndexPermutation(n, seed=11, epoch=0, rounds=2)(np.arange(n))
    assert not _uniform_like(weak, labels, world_size, classes, mini_epochs)


def test_chi_square_through_dataset_and_sampler(tmp_path, monkeypatch):
    """The same test end to end: a class-sorted annotation file, the labels
    each simulated rank's sampler makes its dataset read, per mini-epoch."""
    from mmdata_plugin.datasets import RankShardedDataset, RankShardedSampler
    from mmdata_plugin.datasets import rank_sharded_sampler
    n, classes, world_size, mini_epochs = 12_000, 24, 4, 2
    ann = tmp_path / 'sorted.txt'
    ann.write_text(''.join(f'c{i * classes // n}/{i}.jpg {i * classes // n}\n'
                           for i in range(n)))
    dataset = RankShardedDataset(ann_file=str(ann))
    labels = np.array([dataset.get_data_info(i)['gt_label']
                       for i in range(n)])
    low, high = _chi2_bounds(classes - 1)
    for epoch in range(2 * mini_epochs):
        per_rank = []
        for rank in range(world_size):
            monkeypatch.setattr(rank_sharded_sampler, 'get_dist_info',
                                lambda rank=rank: (rank, world_size))
            sampler = RankShardedSampler(
                dataset, seed=0, mini_epochs=mini_epochs)
            sampler.set_epoch(epoch)
            per_rank.append(np.array(list(sampler)))
        interleaved = np.stack(per_rank, axis=1).reshape(-1)
        stats = _rank_chi2s(interleaved, labels, world_size, classes)
        assert all(low < stat < high for stat in stats), stats


def test_the_orders_of_earlier_versions_are_kept():
    """A checkpoint resumes onto the order it was written under: these
    ids were given by the implementation before permute_each."""
    assert IndexPermutation(1000, 7, 3)(np.arange(8)).tolist() == [
        686, 397, 904, 252, 830, 378, 846, 131
    ]
    assert IndexPermutation(10**9 + 7, 2**40 + 1, 12)(
        np.arange(4)).tolist() == [205048579, 381422011, 715012053, 5703224]


def test_permute_each_is_each_permutation_in_one_pass():
    rng = np.random.default_rng(0)
    sizes = np.concatenate(([1, 2, 3], rng.integers(1, 5000, 297)))
    epochs = rng.integers(0, 10**6, sizes.size)
    values = (rng.random(sizes.size) * sizes).astype(np.int64)
    ids = permute_each(values, sizes, 77, epochs)
    assert ids.tolist() == [
        int(IndexPermutation(int(n), 77, int(epoch))(np.array([value]))[0])
        for value, n, epoch in zip(values, sizes, epochs)
    ]
    assert (permute_each(ids, sizes, 77, epochs, inverse=True) ==
            values).all()
