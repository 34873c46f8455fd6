"""IdTable: rows keyed by sample id, as a dict of them would hold."""
import numpy as np
import pytest

from mmdata_plugin.remote_cache.id_table import IdTable


@pytest.mark.parametrize('seed', range(8))
def test_rows_are_those_of_a_dict(seed):
    # Inserts one by one and many at once, removals (the last row moves
    # into the hole, probes shift back), ids dense or spread up to 1e12.
    rng = np.random.default_rng(seed)
    top = 3000 if seed % 2 else 10**12
    table, reference = IdTable(dict(value=np.int64)), {}
    for _ in range(4000):
        action = rng.random()
        if action < 0.5:
            key = int(rng.integers(0, top))
            if key not in reference:
                table.insert(key, value=3 * key)
                reference[key] = 3 * key
        elif action < 0.85 and reference:
            key = list(reference)[int(rng.integers(len(reference)))]
            table.remove(key)
            del reference[key]
        else:
            keys = np.unique(rng.integers(0, top, 60))
            keys = keys[[int(key) not in reference for key in keys]]
            rows = table.insert_many(keys)
            table.columns['value'][rows] = 3 * keys
            reference.update((key, 3 * key) for key in keys.tolist())
        assert len(table) == len(reference)
    for key, value in reference.items():
        assert key in table
        assert table.columns['value'][table.row(key)] == value
    absent = [top + 1, -5]
    rows = table.rows(np.array(list(reference) + absent, np.int64))
    assert rows[-2:].tolist() == [-1, -1] and -5 not in table
    assert sorted(table.column('value').tolist()) == sorted(
        reference.values())
    assert table.column('value')[rows[:-2]].tolist() == list(
        reference.values())


def test_bytes_grow_with_rows_not_ids():
    table = IdTable(dict(until=np.int64, size=np.uint32))
    keys = np.random.default_rng(0).choice(10**9, 100_000, replace=False)
    table.insert_many(keys[:50_000])
    for key in keys[50_000:].tolist():
        table.insert(key)
    # 20 bytes a row (grown by an eighth), an index at most three
    # quarters full.
    assert table.nbytes / len(keys) <= 36
    assert (table.rows(keys) == np.arange(len(keys))).all()
    table.fit('size', (1 << 32) - 1)
    assert table.columns['size'].dtype == np.uint32
    table.fit('size', 5 << 32)
    table.columns['size'][table.row(int(keys[7]))] = 5 << 32
    assert table.column('size')[7] == 5 << 32


def test_keys_are_narrow_until_one_does_not_fit():
    # Sample ids below 2**32 take 4 bytes; a larger one (or a negative
    # one) widens the keys, every row kept.
    table = IdTable(dict(value=np.int64), keys=np.uint32)
    keys = np.arange(0, 3000, 3)
    table.insert_many(keys, value=keys)
    assert table.keys.dtype == np.uint32
    assert table.row_keys().dtype == np.int64
    table.insert(1 << 40, value=7)
    table.insert_many(np.array([-5, 1 << 50]), value=8)
    assert table.keys.dtype == np.int64
    assert (table.rows(keys) == np.arange(len(keys))).all()
    assert table.column('value')[table.row(1 << 40)] == 7
    assert table.row(-5) >= 0 and table.row(1 << 50) >= 0
    assert table.row_keys()[-3:].tolist() == [1 << 40, -5, 1 << 50]
