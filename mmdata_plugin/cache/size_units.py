"""Byte sizes in logs. Parsing ('200GB', '500MiB') is
:func:`mmdata_plugin.utils.byte_sizes.parse_byte_size`, re-exported here as
``parse_size`` for the store's API: one parser for the whole package."""
from ..utils.byte_sizes import parse_byte_size as parse_size

__all__ = ['format_size', 'parse_size']


def format_size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps it >= 1 (for logs)."""
    value = float(nbytes)
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if abs(value) < 1024:
            return f'{value:.0f} {unit}' if unit == 'B' else \
                f'{value:.1f} {unit}'
        value /= 1024
    return f'{value:.1f} TiB'
