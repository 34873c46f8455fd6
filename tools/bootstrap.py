# Install mmdata_plugin and what it needs into the current Python, safely.
#
# The package is installed as a regular (non-editable) install: `mim train`
# looks for tools/ and configs/ in <site-packages>/mmdata_plugin/.mim, which
# an editable install does not have. Developers who prefer `pip install -e .`
# run `python tools/train.py` directly.
#
# Used by the README's two commands (via the Makefile). It never lets pip
# choose a torch build: an unpinned torch pulls gigabytes of CUDA packages,
# so torch==2.13.0 is installed only when no usable torch is present. It
# installs mmcv-lite only when no `mmcv` module exists, so a user's full mmcv
# (with compiled ops) is never replaced. Where pkg_resources is missing
# (setuptools >= 81) it says what configs/downstream/ need.
import argparse
import importlib.metadata
import importlib.util
import os.path as osp
import subprocess
import sys

TORCH_PIN = 'torch==2.13.0'
MIN_TORCH = (2, 0)
MMCV_LITE_PIN = 'mmcv-lite==2.2.0'
ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def pip_install(*args):
    cmd = [sys.executable, '-m', 'pip', 'install', *args]
    print('+', ' '.join(cmd), flush=True)
    subprocess.check_call(cmd)


def installed_torch_version():
    try:
        version = importlib.metadata.version('torch')
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = version.split('+')[0].split('.')
    return tuple(int(p) for p in parts[:2] if p.isdigit())


def ensure_torch():
    version = installed_torch_version()
    if version is not None and version >= MIN_TORCH:
        print(f'torch {".".join(map(str, version))} is present; keeping it')
        return
    pip_install(TORCH_PIN)


def ensure_mmcv():
    if importlib.util.find_spec('mmcv') is not None:
        print('an mmcv module is present; keeping it')
        return
    pip_install(MMCV_LITE_PIN)


def pkg_resources_note():
    """What to install for configs that inherit a codebase's config by its
    scoped name, when this Python cannot import pkg_resources; else None."""
    if importlib.util.find_spec('pkg_resources') is not None:
        return None
    # installed by now: the message the tools give for the same reason
    from mmdata_plugin.utils.tool_config import PKG_RESOURCES_HINT
    return f'note: no pkg_resources here. {PKG_RESOURCES_HINT}.'


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        '--extras',
        default='',
        help='comma-separated extras of the package, e.g. tests,mim')
    args = parser.parse_args()
    ensure_torch()
    ensure_mmcv()
    target = ROOT + (f'[{args.extras}]' if args.extras else '')
    pip_install(target)
    note = pkg_resources_note()
    if note:
        print(note)


if __name__ == '__main__':
    main()
