"""How far apart two decodes of the same picture are."""
from typing import NamedTuple

import numpy as np


class PixelDifference(NamedTuple):
    """Mean and max absolute difference (0-255 levels) and PSNR in dB."""
    mean_abs: float
    max_abs: int
    psnr: float


def pixel_difference(a: np.ndarray, b: np.ndarray) -> PixelDifference:
    """Compare two uint8 images of the same shape.

    Raises:
        ValueError: The shapes differ.
    """
    if a.shape != b.shape:
        raise ValueError(f'cannot compare images of shapes {a.shape} and '
                         f'{b.shape}')
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    mse = float(np.mean(diff.astype(np.float64)**2))
    psnr = float('inf') if mse == 0 else 10 * np.log10(255.0**2 / mse)
    return PixelDifference(float(diff.mean()), int(diff.max()), psnr)
