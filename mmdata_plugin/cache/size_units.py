"""Byte sizes written the way users write them in configs ('200GB', '500MiB')."""
import re
from typing import Union

_UNITS = {
    '': 1,
    'b': 1,
    'k': 10**3,
    'kb': 10**3,
    'm': 10**6,
    'mb': 10**6,
    'g': 10**9,
    'gb': 10**9,
    't': 10**12,
    'tb': 10**12,
    'kib': 2**10,
    'mib': 2**20,
    'gib': 2**30,
    'tib': 2**40,
}
_SIZE = re.compile(r'^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$')


def parse_size(size: Union[int, str], name: str = 'size') -> int:
    """Return ``size`` in bytes.

    Accepts a non-negative int or a string: a number followed by an optional
    unit, decimal (``KB``, ``MB``, ``GB``, ``TB``; 1 GB = 10**9 bytes, as disk
    vendors and ``df -H`` count) or binary (``KiB``, ``MiB``, ``GiB``,
    ``TiB``). Case does not matter; ``'1.5GB'`` is 1_500_000_000.

    Args:
        size (int | str): The size.
        name (str): What the size is, for the error message (for example the
            config key ``'cache_limit'``).

    Raises:
        ValueError: ``size`` is negative, not a number or has an unknown unit.
    """
    if isinstance(size, bool):
        raise ValueError(f'{name} must be a byte count, got {size!r}')
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f'{name} must not be negative, got {size}')
        return size
    if not isinstance(size, str):
        raise ValueError(
            f'{name} must be an int or a string such as "200GB", got '
            f'{type(size).__name__} {size!r}')
    match = _SIZE.match(size)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f'{name}={size!r} is not a size: write a number with an optional '
            'unit B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB '
            '(powers of 1024), e.g. "200GB" or "500MiB"')
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps it >= 1 (for logs)."""
    value = float(nbytes)
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if abs(value) < 1024:
            return f'{value:.0f} {unit}' if unit == 'B' else \
                f'{value:.1f} {unit}'
        value /= 1024
    return f'{value:.1f} TiB'
