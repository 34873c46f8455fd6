"""Kill a training run right after it saved a given checkpoint.

Simulates a preempted or crashed job for resume tests and for the demo.
"""
import contextlib
import os
import os.path as osp
import signal
import subprocess
import time
from typing import Dict, Optional, Sequence



def last_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint path mmengine's CheckpointHook recorded last, if any."""
    record = osp.join(work_dir, 'last_checkpoint')
    if not osp.isfile(record):
        return None
    with open(record) as f:
        return f.read().strip() or None


def run_until_checkpoint_then_kill(cmd: Sequence[str],
                                   work_dir: str,
                                   checkpoint_name: str,
                                   env: Optional[Dict[str, str]] = None,
                                   cwd: Optional[str] = None,
                                   timeout: float = 600,
                                   extra_delay: float = 0.0,
                                   stdout=None) -> int:
    """Run ``cmd`` and SIGKILL its whole process group after a checkpoint.

    The kill happens once ``work_dir/last_checkpoint`` names
    ``checkpoint_name`` (mmengine writes that record only after the file is
    complete), plus ``extra_delay`` seconds, so the job dies at an arbitrary
    point after the checkpoint, DataLoader workers included.

    Args:
        cmd (Sequence[str]): The training command.
        work_dir (str): Its work dir.
        checkpoint_name (str): E.g. ``'iter_150.pth'``.
        env (dict, optional): The whole environment of the run (default:
            this process's, unbuffered). Tests pass :func:`cpu_env`.
        cwd (str, optional): Working directory.
        timeout (float): Seconds to wait for the checkpoint.
        extra_delay (float): Seconds to let it run after the checkpoint.
        stdout: Where the output goes (inherited by default).

    Returns:
        int: The process's return code (negative: killed by that signal).
    """
    proc = subprocess.Popen(
        list(cmd),
        env=env or dict(os.environ, PYTHONUNBUFFERED='1'),
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.STDOUT if stdout is not None else None,
        start_new_session=True)
    return kill_after_checkpoint(proc, work_dir, checkpoint_name, timeout,
                                 extra_delay)


def kill_after_checkpoint(proc,
                          work_dir: str,
                          checkpoint_name: str,
                          timeout: float = 600,
                          extra_delay: float = 0.0) -> int:
    """SIGKILL the process group of a started run after a checkpoint, as
    :func:`run_until_checkpoint_then_kill` does.

    Args:
        proc: The run, in a session of its own: a ``subprocess.Popen`` or
            what :func:`~.warm_python.start_script` returns.
        work_dir (str): Its work dir.
        checkpoint_name (str): E.g. ``'iter_150.pth'``.
        timeout (float): Seconds to wait for the checkpoint.
        extra_delay (float): Seconds to let it run after the checkpoint.

    Returns:
        int: The process's return code (negative: killed by that signal).
    """
    deadline = time.monotonic() + timeout
    try:
        while not str(last_checkpoint(work_dir)).endswith(checkpoint_name):
            if proc.poll() is not None:
                raise RuntimeError(
                    f'the run ended (code {proc.returncode}) before saving '
                    f'{checkpoint_name}: {" ".join(map(str, proc.args))}')
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f'no {checkpoint_name} in {work_dir} after {timeout} s')
            time.sleep(0.05)
        time.sleep(extra_delay)
    finally:
        if proc.poll() is None:
            # It may end between poll and killpg.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode
