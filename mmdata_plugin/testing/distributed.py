"""Helpers for tests that need several real processes (torchrun, gloo).

They are shipped with the package so that downstream projects can test
their own multi-rank data code on CPU machines the same way we do.
"""
import os
import socket
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import torch.multiprocessing as mp

from ..utils.torch_internals import LAZY_TRAINING_MODULES

#: What a training run imports: a process that starts many of them (the
#: warm interpreter, :func:`spawn_gloo`'s fork server) imports it once,
#: before it forks (~4 s of CPU per process otherwise).
TRAINING_IMPORTS = ('numpy', 'cv2', 'torch', *LAZY_TRAINING_MODULES,
                    'mmengine.runner', 'mmengine.config',
                    'yapf.yapflib.yapf_api', 'mmcv', 'mmcv.transforms',
                    'mmdata_plugin', 'mmdata_plugin.engine')


def find_free_port() -> int:
    """A TCP port on localhost that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def python_path(*dirs: str) -> str:
    """A ``PYTHONPATH`` that puts ``dirs`` before the caller's own.

    A subprocess given ``PYTHONPATH=dir`` alone loses every package the
    caller finds through ``PYTHONPATH`` (e.g. mmengine installed with
    ``pip install --target``); it must see what the caller sees.
    """
    inherited = os.environ.get('PYTHONPATH')
    return os.pathsep.join([*dirs, inherited] if inherited else dirs)


def cpu_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The current environment, made to run training on the CPU quietly.

    Hides GPUs (so gloo is used even on a GPU box), pins math libraries to
    one thread per process (ranks x workers would oversubscribe the cores)
    and makes Python output unbuffered so logs of killed runs are complete.
    """
    env = dict(os.environ)
    env.update(
        CUDA_VISIBLE_DEVICES='',
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1',
        PYTHONUNBUFFERED='1')
    env.update(extra or {})
    return env


class ProcessFailed(AssertionError):
    """A launched command exited with a non-zero code."""


def run_command(cmd: Sequence[str],
                env: Optional[Dict[str, str]] = None,
                cwd: Optional[str] = None,
                timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``cmd``; raise :class:`ProcessFailed` with its output on failure."""
    result = subprocess.run(
        list(cmd),
        env=cpu_env(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout)
    return raise_if_failed(result)


def raise_if_failed(
        result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``result``; :class:`ProcessFailed` with its output if it failed."""
    if result.returncode != 0:
        raise ProcessFailed(
            f'command failed with exit code {result.returncode}: '
            f'{" ".join(map(str, result.args))}\n--- output ---\n'
            f'{result.stdout[-20000:]}')
    return result


def torchrun_command(script: str,
                     args: Sequence[str] = (),
                     nproc: int = 2,
                     port: Optional[int] = None) -> List[str]:
    """The ``torchrun --nproc_per_node=N`` command line for ``script``."""
    return [
        sys.executable, '-m', 'torch.distributed.run',
        f'--nproc_per_node={nproc}', '--master_addr=127.0.0.1',
        f'--master_port={port or find_free_port()}', script, *args
    ]


def run_torchrun(script: str,
                 args: Sequence[str] = (),
                 nproc: int = 2,
                 env: Optional[Dict[str, str]] = None,
                 cwd: Optional[str] = None,
                 timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``script`` under ``torchrun`` with ``nproc`` CPU ranks.

    Args:
        script (str): Python file to launch (e.g. ``tools/train.py``).
        args (Sequence[str]): Its arguments.
        nproc (int): Number of ranks.
        env (dict, optional): Extra environment variables.
        cwd (str, optional): Working directory.
        timeout (float): Seconds before the whole run is killed.

    Returns:
        subprocess.CompletedProcess: With the combined output in ``stdout``.
    """
    return run_command(
        torchrun_command(script, args, nproc), env=env, cwd=cwd,
        timeout=timeout)


def _gloo_entry(rank: int, fn, world_size: int, port: int, args,
                environ: Dict[str, str]) -> None:
    import torch.distributed as dist

    # The fork server's environment is the caller's when the server
    # started; a rank runs in the caller's environment of now.
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(
        MASTER_ADDR='127.0.0.1',
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size))
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def spawn_gloo(fn, world_size: int = 2, args: Sequence = ()) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` gloo ranks.

    Lighter than :func:`run_torchrun` for testing a function rather than a
    script. ``fn`` must be importable (a module-level function): the ranks
    are forked from a fork server (``forkserver``: a fresh interpreter, not
    a copy of the caller's threads and connections) that imports
    :data:`TRAINING_IMPORTS` once for all calls of a process, instead of
    once per rank. An exception in any rank fails the call.
    """
    mp.set_forkserver_preload(list(TRAINING_IMPORTS))
    mp.start_processes(
        _gloo_entry,
        args=(fn, world_size, find_free_port(), tuple(args),
              dict(os.environ)),
        nprocs=world_size,
        start_method='forkserver')
