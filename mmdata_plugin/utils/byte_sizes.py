"""Byte counts written the way configs write them: ``'200GB'``, ``'1.5GiB'``."""
import re
from typing import Union

# Decimal units as disks and cloud quotas count them, binary ones by name.
_UNITS = {
    '': 1,
    'B': 1,
    'KB': 10**3,
    'MB': 10**6,
    'GB': 10**9,
    'TB': 10**12,
    'PB': 10**15,
    'KIB': 2**10,
    'MIB': 2**20,
    'GIB': 2**30,
    'TIB': 2**40,
    'PIB': 2**50,
}

_SIZE = re.compile(r'^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$')


def parse_byte_size(value: Union[int, float, str], name: str = 'size') -> int:
    """``value`` in bytes: an int, or a string such as ``'200GB'``.

    ``KB``/``MB``/``GB``/``TB`` are powers of 1000, ``KiB``/``MiB``/``GiB``/
    ``TiB`` powers of 1024 (case-insensitive).

    Args:
        value (int | float | str): The size.
        name (str): What the size is (a config key), for the error message.

    Raises:
        ValueError: ``value`` is negative or not a size.
    """
    if isinstance(value, bool):
        raise ValueError(f'{name} must be a byte count such as 200000000 or '
                         f"'200GB', got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f'{name} must be >= 0 bytes, got {value!r}')
        return int(value)
    match = _SIZE.match(str(value))
    unit = match.group(2).upper() if match else None
    if unit not in _UNITS:
        raise ValueError(
            f'{name} must be a byte count such as 200000000, \'200GB\' or '
            f'\'1.5GiB\' (units: {", ".join(u for u in _UNITS if u)}), got '
            f'{value!r}')
    return int(float(match.group(1)) * _UNITS[unit])
