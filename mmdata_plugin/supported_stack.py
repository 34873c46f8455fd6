"""The stacks mmdata_plugin supports, checked once at import.

The package follows the OpenMMLab convention (mmdet, mmpretrain): torch,
mmengine and mmcv are not install requirements -- a user's stack (classic
OpenMMLab, the OneDL fork, a current torch) is never replaced by an install
-- so what is present is checked here, before any module imports them, and
an unsupported stack gets one error naming what was found, the supported
range and what to install.

Only the standard library is imported before the check passes: a torch
import that fails (a torch built for numpy 1 under numpy 2 prints "Failed to
initialize NumPy" and goes on) must not hide the message.
"""
import importlib.metadata
import importlib.util
import re
import warnings
from typing import Dict, List, NamedTuple, Optional, Tuple

Version = Tuple[int, ...]


class Range(NamedTuple):
    """``low <= version < high``, and the newest release tested."""
    low: Version
    high: Version
    newest_tested: Version


#: The ranges docs/compatibility.md lists and the compatibility matrix
#: (tools/compat_matrix.py) runs.
TORCH = Range((2, 1), (3, ), (2, 14, 1))
MMENGINE = Range((0, 10, 3), (0, 11), (0, 10, 12))
MMCV = Range((2, 0, 0), (2, 4), (2, 3, 6))
#: torch releases before 2.3 were built against numpy 1: with numpy 2 their
#: numpy bridge is off (``tensor.numpy()`` raises) while the import goes on.
FIRST_TORCH_FOR_NUMPY_2 = (2, 3)

#: Distributions that install the same top-level module into one folder;
#: two of them at once overwrite each other's files.
MODULE_DISTRIBUTIONS: Dict[str, Tuple[str, ...]] = {
    'torch': ('torch', ),
    'numpy': ('numpy', ),
    'mmengine': ('mmengine', 'onedl-mmengine', 'mmengine-lite'),
    'mmcv': ('mmcv', 'mmcv-lite', 'onedl-mmcv', 'mmcv-full'),
    'cv2': ('opencv-python', 'opencv-python-headless',
            'opencv-contrib-python', 'opencv-contrib-python-headless'),
}

INSTALL_HINT = ('python tools/bootstrap.py (from a checkout) installs only '
                'what is missing and never replaces what is present; see '
                'docs/compatibility.md')


class UnsupportedStackError(ImportError):
    """The installed torch / numpy / mmengine / mmcv cannot run the
    package."""


def parse_version(text: str) -> Version:
    """``'2.1.2+cu121'`` -> ``(2, 1, 2)``; ``'2.0.0rc4'`` -> ``(2, 0, 0)``."""
    release = re.match(r'\s*v?(\d+(?:\.\d+)*)', text)
    if release is None:
        raise ValueError(f'not a version: {text!r}')
    return tuple(int(part) for part in release.group(1).split('.'))


def _dotted(version: Version) -> str:
    return '.'.join(map(str, version))


def installed_distributions(module: str) -> List[str]:
    """``'name version'`` of every installed distribution that ships
    ``module`` (of :data:`MODULE_DISTRIBUTIONS`)."""
    found = []
    for name in MODULE_DISTRIBUTIONS[module]:
        try:
            found.append(f'{name} {importlib.metadata.version(name)}')
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def module_version(module: str) -> Optional[str]:
    """The version of the importable ``module``, None where it is missing.

    Read from the distribution that ships it (no import), or from the
    module itself where it came without metadata (``PYTHONPATH``)."""
    if importlib.util.find_spec(module) is None:
        return None
    distributions = installed_distributions(module)
    if len(distributions) == 1:
        return distributions[0].split(' ', 1)[1]
    return str(getattr(importlib.import_module(module), '__version__', '0'))


def _outside(version: Version, allowed: Range) -> bool:
    # Compared on as many parts as the bound names: 2.14.1 is below (3,).
    return (version[:len(allowed.low)] < allowed.low
            or version[:len(allowed.high)] >= allowed.high)


def _range_text(allowed: Range) -> str:
    return (f'>= {_dotted(allowed.low)}, < {_dotted(allowed.high)} (newest '
            f'tested {_dotted(allowed.newest_tested)})')


def stack_problems() -> List[str]:
    """What keeps the installed stack from running the package, each
    naming what was found, the supported range and what to install."""
    problems = []
    torch = module_version('torch')
    if torch is None:
        problems.append(f'torch is not installed: torch '
                        f'{_range_text(TORCH)} is needed')
    elif _outside(parse_version(torch), TORCH):
        problems.append(f'torch {torch} is installed; supported: torch '
                        f'{_range_text(TORCH)}')
    numpy = module_version('numpy')
    if (torch is not None and numpy is not None
            and parse_version(numpy)[0] >= 2
            and parse_version(torch)[:2] < FIRST_TORCH_FOR_NUMPY_2):
        problems.append(
            f'numpy {numpy} is installed under torch {torch}, which was '
            "built for numpy 1: pip install 'numpy<2' (or a torch >= "
            f'{_dotted(FIRST_TORCH_FOR_NUMPY_2)})')
    mmengine = module_version('mmengine')
    if mmengine is None:
        problems.append(
            'mmengine is not installed: pip install "mmengine>=0.10.3,<0.11" '
            '(OpenMMLab) or onedl-mmengine (the OneDL fork), one of the two')
    elif _outside(parse_version(mmengine), MMENGINE):
        problems.append(
            f'mmengine {mmengine} is installed '
            f'({", ".join(installed_distributions("mmengine")) or "no "}'
            f'distribution); supported: mmengine {_range_text(MMENGINE)}')
    mmcv = module_version('mmcv')
    if mmcv is None:
        problems.append(
            'mmcv is not installed: keep your full mmcv or onedl-mmcv, or '
            'install mmcv-lite without letting it replace your mmengine: '
            'pip install --no-deps mmcv-lite==2.2.0 addict packaging pyyaml '
            'yapf')
    elif _outside(parse_version(mmcv), MMCV):
        problems.append(f'mmcv {mmcv} is installed; supported: mmcv, '
                        f'mmcv-lite or onedl-mmcv {_range_text(MMCV)}')
    if importlib.util.find_spec('cv2') is None:
        problems.append('cv2 is not installed: pip install opencv-python '
                        '(or opencv-python-headless)')
    return problems


def shared_module_warnings() -> List[str]:
    """Modules that two installed distributions both ship."""
    return [
        f'{module} is installed by {" and ".join(found)}: each overwrites '
        "the other's files, and uninstalling either breaks both; keep one"
        for module in MODULE_DISTRIBUTIONS
        for found in [installed_distributions(module)] if len(found) > 1
    ]


def newer_than_tested() -> List[str]:
    """Releases above the newest tested ones (they run, untested)."""
    notes = []
    for module, allowed in (('torch', TORCH), ('mmengine', MMENGINE),
                            ('mmcv', MMCV)):
        found = module_version(module)
        if found is not None and parse_version(found) > (
                allowed.newest_tested):
            notes.append(f'{module} {found} is newer than the newest tested '
                         f'({_dotted(allowed.newest_tested)})')
    return notes


def check_stack() -> None:
    """Raise :class:`UnsupportedStackError` for an unsupported stack; warn
    where the stack runs but is untested or has a module installed twice.

    Raises:
        UnsupportedStackError: Listing every problem found.
    """
    problems = stack_problems()
    if problems:
        raise UnsupportedStackError(
            'mmdata_plugin cannot run on this Python environment:\n  - ' +
            '\n  - '.join(problems) + f'\n{INSTALL_HINT}')
    for note in shared_module_warnings() + newer_than_tested():
        warnings.warn(f'mmdata_plugin: {note}', stacklevel=3)
