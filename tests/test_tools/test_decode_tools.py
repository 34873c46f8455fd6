"""tools/compare_decoders.py and tools/benchmark_decode.py, run for real."""
import os.path as osp
import re
import sys

import cv2
from helpers import DEMO_CONFIG, REPO_ROOT

from mmdata_plugin.testing import run_command
from mmdata_plugin.utils import camera_like_image, encode_jpeg

COMPARE = osp.join(REPO_ROOT, 'tools', 'compare_decoders.py')
BENCHMARK = osp.join(REPO_ROOT, 'tools', 'benchmark_decode.py')


def _table_row(out, name, after=''):
    """The cells of the row starting with ``name`` (after a heading)."""
    out = out[out.index(after):]
    match = re.search(rf'^{re.escape(name)}\s+(.*)$', out, re.MULTILINE)
    assert match, f'no row {name!r} in\n{out}'
    return match.group(1).split()


def test_compare_decoders_on_the_demo_config(train_env):
    out = run_command([
        sys.executable, COMPARE, DEMO_CONFIG, '--num-files', '12',
        '--repeats', '1'
    ],
                      env=train_env).stdout
    assert ('compare_decoders: 12 of 64 files of the train dataset of '
            f'{DEMO_CONFIG} (12 JPEG, 0 other)') in out
    # The decode size comes from the demo's own resize (in the cached head).
    assert ('at least scale=(87, 4096), keep_ratio=True (from the pipeline '
            'resize), exact_shapes=True') in out
    for variant in ('cv2', 'pillow', 'cv2 reduced', 'pillow reduced'):
        median_ms, mean_ms, p90_ms, speed = _table_row(out, variant)[:4]
        assert float(median_ms) > 0 and speed.endswith('x')
    # Both libraries wrap libjpeg-turbo: same pixels at full size.
    mean_abs, max_abs, psnr_median = _table_row(out, 'pillow',
                                                'pixel difference')[:3]
    assert float(mean_abs) < 1 and float(psnr_median) > 40
    assert float(_table_row(out, 'cv2 reduced', 'pixel difference')[2]) > 30


def test_compare_decoders_reads_size_and_mode_from_the_loader_or_wrapper(
        tmp_path, train_env):
    config = tmp_path / 'wrapped.py'
    config.write_text(
        f'_base_ = [{DEMO_CONFIG!r}]\n'
        'val_dataloader = dict(dataset=dict(pipeline=[dict('
        "type='ReducedDecodePipeline', exact_shapes=False, transforms=["
        "dict(type='LoadImageFromFile'), dict(type='Resize', "
        "scale=(72, 4096), keep_ratio=True)])]))\n"
        "train_dataloader = dict(dataset=dict(pipeline=[dict(type="
        "'LoadImageFromFileReduced', scale=(50, 60), keep_ratio=False)]))\n")
    for split, expected in (
        ('val', 'scale=(72, 4096), keep_ratio=True (from the pipeline '
         'resize), exact_shapes=False'),
        ('train', 'scale=(50, 60), keep_ratio=False (from the pipeline '
         'loader), exact_shapes=True')):
        out = run_command([
            sys.executable, COMPARE,
            str(config), '--split', split, '--num-files', '4', '--repeats',
            '1'
        ],
                          env=train_env).stdout
        assert f'4 of {dict(val=32, train=64)[split]} files of the {split}' \
            in out
        assert f'at least {expected}' in out


def test_compare_decoders_on_a_folder_reports_broken_files(
        tmp_path, train_env):
    folder = tmp_path / 'photos'
    (folder / 'sub').mkdir(parents=True)
    frame = camera_like_image(640, 360, seed=3)
    (folder / 'a.jpg').write_bytes(encode_jpeg(frame))
    (folder / 'sub' / 'b.JPEG').write_bytes(encode_jpeg(frame[::-1]))
    cv2.imwrite(str(folder / 'c.png'), frame)
    (folder / 'broken.jpg').write_bytes(encode_jpeg(frame)[:3000])
    (folder / 'notes.txt').write_text('not an image')
    out = run_command([
        sys.executable, COMPARE,
        str(folder), '--short-side', '64', '--repeats', '1'
    ],
                      env=train_env).stdout
    assert f'4 files under {folder} (3 JPEG, 1 other)' in out
    assert 'from --short-side' in out
    # 360 / 8 < 64 <= 360 / 4; the PNG is decoded in full.
    assert re.search(r'^cv2 reduced .* 1/4: 2, 1: 1$', out, re.MULTILINE)
    assert f'cv2 reduced failed on {folder / "broken.jpg"}: ' in out
    assert 'truncated JPEG' in out


def test_benchmark_decode_compares_odd_frames_at_the_baseline_shape(
        train_env):
    """961x1929 to a 224 short side, reduced although 961 does not divide by
    4: ours came out 449 px wide instead of 450 once, and the tool crashed.
    (The default, exact_shapes=True, decodes it in full.)"""
    out = run_command([
        sys.executable, BENCHMARK, '--sizes', '961x1929', '--short-sides',
        '224', '--images', '1', '--repeats', '1', '--backends', 'cv2',
        '--no-exact-shapes'
    ],
                      env=train_env).stdout
    assert 'ReducedDecodePipeline(exact_shapes=False)' in out
    short, backend, *_, scale, psnr = _table_row(out, '961x1929')[:7]
    assert (short, backend, scale) == ('224', 'cv2', '1/4')
    assert float(psnr) > 28


def test_benchmark_decode_prints_speedup_psnr_and_goal(train_env):
    out = run_command([
        sys.executable, BENCHMARK, '--sizes', '3840x2160', '--short-sides',
        '224', '--images', '1', '--repeats', '1', '--backends', 'cv2'
    ],
                      env=train_env).stdout
    row = _table_row(out, '3840x2160')
    short, backend, base_ms, ours_ms, speedup, scale = row[:6]
    assert (short, backend, scale) == ('224', 'cv2', '1/8')
    assert float(base_ms) > 0 and float(ours_ms) > 0
    assert speedup.endswith('x')
    psnr, psnr_min, psnr_vs_area = (float(v) for v in row[6:9])
    assert psnr_vs_area > 35  # the reduced path is close to alias-free
    assert psnr >= psnr_min > 25
    assert 'goal: >= 3x on 3840x2160 -> 224 with PSNR >= 30 dB' in out
    assert re.search(r'^  cv2 .*x, PSNR .* dB \(min .*\): ', out,
                     re.MULTILINE)
