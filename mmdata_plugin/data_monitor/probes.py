"""Split file reading from image decoding in mmcv's loading path.

``LoadImageFromFile`` (and ``mmcv.imread``) read bytes with
``mmengine.fileio.get`` (or a ``FileClient``) and decode them with
``mmcv.imfrombytes``; both are looked up as module attributes at call time.
No hook or registry sits between them, so this module replaces those
attributes with timing probes -- the one place where the monitor patches
library code. The probes time only while a monitored fetch is running (any
other caller pays one list check) and are installed lazily in each process
that loads data, which is what makes them reach spawn workers too. Loaders
that bypass these functions (``cv2.imread``, PIL, custom readers) are timed
as part of their own transform: "loaded" as one stage. The clock is the
caller's (:mod:`.worker_timing` passes its own), so this module imports
none of the monitor.
"""
import importlib
from typing import Callable, List, Optional, Tuple

IO = 'io'
DECODE = 'decode'

# (module[:class], attribute, stage); functions of modules that are not
# installed are skipped. mmcv re-exports imfrombytes from mmcv.image.io, and
# its imread calls the module-global, so all three names are patched. This
# package's reduced-size JPEG decoding (LoadImageFromFileReduced) calls
# image_decoding.decode_image through its module for the same reason.
_TARGETS: Tuple[Tuple[str, str, str], ...] = (
    ('mmengine.fileio', 'get', IO),
    ('mmengine.fileio.io', 'get', IO),
    ('mmengine.fileio.file_client:FileClient', 'get', IO),
    ('mmcv', 'imfrombytes', DECODE),
    ('mmcv.image', 'imfrombytes', DECODE),
    ('mmcv.image.io', 'imfrombytes', DECODE),
    ('mmdata_plugin.transforms.image_decoding', 'decode_image', DECODE),
)

_installed: List[Tuple[object, str, Callable]] = []
# (owner, attribute, stage) of the targets found in this process. Resolved
# once: sampling installs and removes the probes around every timed batch,
# and looking for a module that is not installed searches the file system.
_owners: Optional[List[Tuple[object, str, str]]] = None


def _resolve(path: str):
    """The module ``path`` (``module:Class``: that class), or None."""
    module_path, _, class_name = path.partition(':')
    try:
        owner = importlib.import_module(module_path)
    except ImportError:
        return None
    return getattr(owner, class_name, None) if class_name else owner


def _targets() -> List[Tuple[object, str, str]]:
    global _owners
    if _owners is None:
        _owners = []
        for path, attr, stage in _TARGETS:
            owner = _resolve(path)
            if owner is not None:
                _owners.append((owner, attr, stage))
    return _owners


def _make_probe(original: Callable, stage: str, timed_call: Callable,
                inside_timed_region: Callable[[], bool]) -> Callable:

    def probe(*args, **kwargs):
        if not inside_timed_region():
            return original(*args, **kwargs)
        return timed_call(stage, original, *args, **kwargs)

    probe._data_monitor_original = original
    probe.__wrapped__ = original
    probe.__name__ = getattr(original, '__name__', stage)
    probe.__doc__ = original.__doc__
    return probe


def ensure_installed(timed_call: Callable,
                     inside_timed_region: Callable[[], bool]) -> None:
    """Install the probes in this process unless they are already there.

    Args:
        timed_call (callable): ``timed_call(stage, fn, *args, **kwargs)``
            calls ``fn`` and books its time under ``stage``.
        inside_timed_region (callable): Whether a monitored fetch is
            running; the probes time nothing else.
    """
    if _installed:
        return
    for owner, attr, stage in _targets():
        original = getattr(owner, attr, None)
        # A forked child inherits installed probes; never wrap twice.
        if original is None or hasattr(original, '_data_monitor_original'):
            continue
        setattr(owner, attr,
                _make_probe(original, stage, timed_call, inside_timed_region))
        _installed.append((owner, attr, original))


def uninstall() -> None:
    """Put the original functions back (in this process)."""
    while _installed:
        owner, attr, original = _installed.pop()
        setattr(owner, attr, original)


def installed() -> bool:
    return bool(_installed)
