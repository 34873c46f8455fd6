"""Byte sizes as configs write them (cache_limit, sample_bytes)."""
import pytest

from mmdata_plugin.cache.size_units import parse_size


@pytest.mark.parametrize('value, expected', [
    (123, 123), (1.5e3, 1500), ('200GB', 200 * 10**9), ('1.5GiB', 3 * 2**29),
    ('64 kib', 65536), ('10', 10), ('2tb', 2 * 10**12), ('.5MB', 500_000),
])
def test_sizes(value, expected):
    assert parse_size(value) == expected


@pytest.mark.parametrize('value', ['-1GB', 'GB', '1 parsec', '1e3', -5, True,
                                   '1.2.3MB', float('nan'), [1]])
def test_bad_sizes_name_the_key(value):
    with pytest.raises(ValueError, match='cache_limit'):
        parse_size(value, 'cache_limit')
