"""Which checkpoint an automatic ``--resume`` (no path) should resume from.

mmengine resumes from the file named in ``WORK_DIR/last_checkpoint``. When
that file is truncated (a run killed while saving, a full disk, a partial
copy) the resume dies on torch's unpickling error; when there is no
checkpoint at all, training silently starts from scratch. Here the newest
*readable* checkpoint is chosen instead, and every skipped file is reported.
"""
import glob
import os.path as osp
import zipfile
from typing import List, Optional, Tuple

from .checkpoint_safety import (UnreadableCheckpointError,
                                load_from_local_safely)
from .pickle_preflight import ZIP_MAGIC


def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be read as a checkpoint, or None if it can.

    torch's zip checkpoints are checked by their CRCs (each member read
    once, nothing unpickled); older formats by a full safe load.
    """
    if not osp.isfile(path):
        return 'the file does not exist'
    with open(path, 'rb') as f:
        is_zip_archive = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    if not is_zip_archive:
        try:
            load_from_local_safely(path, map_location='cpu')
        except UnreadableCheckpointError as error:
            return str(error)
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            corrupt = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f'truncated or not a checkpoint ({error})'
    return f'member {corrupt} is corrupt' if corrupt else None


def resume_candidates(work_dir: str) -> List[str]:
    """Checkpoints in ``work_dir``, the one mmengine would resume first.

    Then every other ``*.pth`` there, newest first.
    """
    candidates = []
    last_checkpoint = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(last_checkpoint):
        with open(last_checkpoint) as f:
            named = f.read().strip()
        if named:
            candidates.append(named)
    others = sorted(
        glob.glob(osp.join(work_dir, '*.pth')),
        key=lambda path: (osp.getmtime(path), path),
        reverse=True)
    known = {osp.realpath(path) for path in candidates}
    return candidates + [p for p in others if osp.realpath(p) not in known]


def find_resumable_checkpoint(
        work_dir: str) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """The newest readable checkpoint of ``work_dir`` and what was skipped.

    Returns:
        tuple: ``(path or None, [(skipped path, why), ...])``.
    """
    skipped = []
    for path in resume_candidates(work_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped
