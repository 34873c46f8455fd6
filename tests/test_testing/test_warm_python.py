"""run_script: a script run in a fork of a warm interpreter behaves as
``python script args`` run by run_command."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO_ROOT

from mmdata_plugin.testing import (ProcessFailed, descendants, python_path,
                                   run_ranks, run_script, start_script)
from mmdata_plugin.testing import warm_python

SCRIPT = """
import atexit, os, sys, threading, time
print('argv', sys.argv[1:], 'cwd', os.getcwd(), 'env', os.environ['PROBE'])
print('path0', sys.path[0], 'path1', sys.path[1])
print('main', __name__, 'pid', os.getpid(), 'ppid', os.getppid(),
      'grandparent', open(f'/proc/{os.getppid()}/stat').read().split()[3])
import mmdata_plugin, torch
print('package', mmdata_plugin.__file__, 'threads', torch.get_num_threads())
atexit.register(lambda: print('atexit ran', flush=True))
# A non-daemon thread: a normal exit waits for it.
threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))
                 ).start()
if sys.argv[1] == 'sleep':
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def _zygote(env):
    (zygote, ) = [z for z in warm_python._zygotes if z.serves(
        warm_python.cpu_env(env))]
    return zygote


@pytest.fixture
def script(tmp_path):
    path = tmp_path / 'probe.py'
    path.write_text(SCRIPT)
    return str(path)


def test_runs_as_python_script_would_in_a_warm_fork(script, tmp_path):
    env = dict(PYTHONPATH=python_path(REPO_ROOT), PROBE='p1')
    out = run_script(script, ['0'], env=env, cwd=str(tmp_path)).stdout
    assert f"argv ['0'] cwd {tmp_path} env p1" in out
    assert f'path0 {tmp_path} path1 {REPO_ROOT}' in out
    assert f'package {REPO_ROOT}/mmdata_plugin/__init__.py threads 1' in out
    assert 'main __main__' in out
    # A normal interpreter exit: the thread is joined, atexit runs.
    assert out.index('thread done') < out.index('atexit ran')
    # Not a child of this process: forked by a supervisor the zygote forked.
    assert f'grandparent {_zygote(env).process.pid}' in out
    with pytest.raises(ProcessFailed, match='exit code 3'):
        run_script(script, ['3'], env=dict(env, PROBE='p2'))


def test_a_run_past_its_timeout_is_killed(script):
    env = dict(PYTHONPATH=python_path(REPO_ROOT), PROBE='p3')
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_script(script, ['sleep'], env=env, timeout=3)
    assert time.monotonic() - start < 30
    # The zygote serves the next run.
    assert 'atexit ran' in run_script(script, ['0'], env=env).stdout


def test_another_import_time_environment_gets_its_own_zygote(script):
    # torch reads OMP_NUM_THREADS when imported (cpu_env's is 1).
    env = dict(PYTHONPATH=python_path(REPO_ROOT), PROBE='p4',
               OMP_NUM_THREADS='2')
    out = run_script(script, ['0'], env=env).stdout
    assert 'threads 2' in out


def test_another_checkout_first_on_the_path_is_the_one_imported(
        script, tmp_path):
    os.symlink(os.path.join(REPO_ROOT, 'mmdata_plugin'),
               tmp_path / 'mmdata_plugin')
    env = dict(PYTHONPATH=python_path(str(tmp_path), REPO_ROOT), PROBE='p5')
    out = run_script(script, ['0'], env=env).stdout
    assert f'package {tmp_path}/mmdata_plugin/__init__.py' in out
    assert 'threads 1' in out


RANKS_SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group('gloo')
rank = dist.get_rank()
total = torch.tensor([rank + 1])
dist.all_reduce(total)
# One write per line: the ranks append to one file at once.
sys.stdout.write(f'rank {rank} of {dist.get_world_size()} local '
                 f"{os.environ['LOCAL_RANK']} {os.environ['LOCAL_WORLD_SIZE']}"
                 f' sum {int(total)} ppid {os.getppid()} grandparent '
                 + open(f'/proc/{os.getppid()}/stat').read().split()[3]
                 + '\\n')
if sys.argv[1] == 'fail' and rank == 1:
    sys.exit(5)
if sys.argv[1] == 'fail':
    time.sleep(60)  # stopped by the failed rank, as torchrun stops it
dist.destroy_process_group()
"""


def test_ranks_rendezvous_as_torchrun_ranks_and_share_one_output(tmp_path):
    script = tmp_path / 'ranks.py'
    script.write_text(RANKS_SCRIPT)
    env = dict(PYTHONPATH=python_path(REPO_ROOT))
    out = run_ranks(str(script), ['ok'], nproc=3, env=env).stdout
    for rank in range(3):
        assert f'rank {rank} of 3 local {rank} 3 sum 6' in out
    # One supervisor, forked by the zygote, forked the three.
    (parent, ) = set(re.findall(r'ppid (\d+)', out))
    assert out.count(f'grandparent {_zygote(env).process.pid}') == 3


def test_a_failed_rank_stops_the_others(tmp_path):
    script = tmp_path / 'ranks.py'
    script.write_text(RANKS_SCRIPT)
    env = dict(PYTHONPATH=python_path(REPO_ROOT))
    start = time.monotonic()
    with pytest.raises(ProcessFailed, match='exit code 5'):
        run_ranks(str(script), ['fail'], nproc=2, env=env, timeout=50)
    assert time.monotonic() - start < 40


def test_a_started_run_is_killed_as_a_popen_and_the_zygote_serves_meanwhile(
        script, tmp_path):
    env = dict(PYTHONPATH=python_path(REPO_ROOT), PROBE='p6')
    log = tmp_path / 'started.log'
    proc = start_script(script, ['sleep'], str(log), env=env,
                        new_session=True)
    assert isinstance(proc, warm_python.WarmProcess)
    # Another run while the first sleeps: the zygote is not waiting on it.
    assert 'atexit ran' in run_script(script, ['0'], env=env).stdout
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    assert f'pid {proc.pid}' in log.read_text()
    assert os.getsid(proc.pid) == proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert proc.poll() == -signal.SIGKILL


CALLER = """
import sys, time
from mmdata_plugin.testing import start_script
run = start_script(sys.argv[1], ['sleep'], sys.argv[2], new_session=True)
print(run.pid, flush=True)
time.sleep(120)
"""


def test_a_run_ends_with_the_test_process_that_started_it(script, tmp_path):
    """A caller killed (CI's timeout, a crashed xdist worker) takes its
    zygote and the runs it started with it."""
    caller = tmp_path / 'caller.py'
    caller.write_text(CALLER)
    env = warm_python.cpu_env(
        dict(PYTHONPATH=python_path(REPO_ROOT), PROBE='p7'))
    with subprocess.Popen([sys.executable, str(caller), script,
                           str(tmp_path / 'run.log')], env=env,
                          stdout=subprocess.PIPE, text=True) as proc:
        run = int(proc.stdout.readline())
        zygotes = [p for p in descendants([proc.pid]) if p != run]
        assert zygotes and os.getpgid(run) == run
        proc.kill()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in [run, *zygotes]):
        assert time.monotonic() < deadline, 'the run outlived its caller'
        time.sleep(0.05)


def _alive(pid):
    try:
        with open(f'/proc/{pid}/stat') as stat:
            return stat.read().split()[2] != 'Z'
    except FileNotFoundError:
        return False
