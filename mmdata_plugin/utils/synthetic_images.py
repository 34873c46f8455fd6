"""Camera-like test frames for decode benchmarks and tests.

Flat colours compress to almost nothing and decode unrealistically fast;
pure noise is the opposite. A camera frame has smooth lighting, textures
at many frequencies, objects with sharp edges and sensor noise, and these
frames have all four, so their JPEG size (about 1.5 MB for 4K at quality
90) and decode time are those of real footage.
"""
import cv2
import numpy as np


def camera_like_image(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A ``height x width`` BGR uint8 frame.

    Args:
        width (int): Width in pixels.
        height (int): Height in pixels.
        seed (int): Seed of everything random in the frame.
    """
    rng = np.random.default_rng(seed)
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    img = np.empty((height, width, 3), np.float32)
    for channel in range(3):
        a, b, c = rng.uniform(-1.0, 1.0, 3)
        img[..., channel] = 128 + 60 * (a * x + b * y + c * x * y)
    img += _texture(rng, x, y, width, height)[..., None]
    for _ in range(30):
        _draw_object(img, rng)
    img = cv2.GaussianBlur(img, (0, 0), 1.0)  # lens blur
    img += 3.0 * rng.standard_normal(img.shape, dtype=np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode_jpeg(img: np.ndarray, quality: int = 90) -> bytes:
    ok, data = cv2.imencode('.jpg', img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError(f'cv2 could not encode a {img.shape} image')
    return data.tobytes()


def _texture(rng: np.random.Generator, x: np.ndarray, y: np.ndarray,
             width: int, height: int) -> np.ndarray:
    """Plane waves from a few cycles per frame up to near the pixel pitch."""
    texture = np.zeros((height, width), np.float32)
    for _ in range(8):
        cycles = rng.uniform(5.0, width / 6)
        angle, phase = rng.uniform(0.0, np.pi), rng.uniform(0.0, 2 * np.pi)
        fx = 2 * np.pi * cycles * np.cos(angle)
        fy = 2 * np.pi * cycles * np.sin(angle) * height / width
        # sin(u + v) split into products of 1-D waves: O(w + h) sines.
        texture += rng.uniform(3.0, 10.0) * (
            np.sin(fx * x) * np.cos(fy * y + phase) +
            np.cos(fx * x) * np.sin(fy * y + phase))
    return texture


def _draw_object(img: np.ndarray, rng: np.random.Generator) -> None:
    height, width = img.shape[:2]
    color = rng.uniform(0, 255, 3).tolist()
    cx, cy = int(rng.uniform(0, width)), int(rng.uniform(0, height))
    radius = max(1, int(rng.uniform(0.02, 0.15) * height))
    if rng.random() < 0.5:
        cv2.circle(img, (cx, cy), radius, color, -1, cv2.LINE_AA)
    else:
        cv2.rectangle(img, (cx - radius, cy - radius),
                      (cx + radius, cy + int(radius * 0.6)), color, -1,
                      cv2.LINE_AA)
