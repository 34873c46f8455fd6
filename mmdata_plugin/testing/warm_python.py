"""Python scripts run in forks of an interpreter that has imported torch,
mmengine and this package already.

A test that runs ``tools/train.py`` to completion pays 5-8 s of imports
(torch, mmengine's runner with torch.distributed, the optimizer's dynamo,
yapf for the config dump) before the first line of its own work; the suite
runs it dozens of times. :func:`run_script` runs such a script in a fork of
one warm interpreter per test process (a "zygote"): a new process, as the
test means, started with the modules in memory. The fork then runs the
script as ``python script.py`` would: ``__main__``, ``sys.argv``, the
script's folder and the caller's ``PYTHONPATH`` first on ``sys.path``, the
caller's environment, working directory and exit code, output to a file,
and a normal interpreter exit (atexit handlers, non-daemon threads).

What the fork cannot take from the caller is what was read while the
modules were imported: the environment variables torch reads then, and
which checkout of this package is imported. Each combination of those gets
a zygote of its own; where the package is not found on the caller's
``PYTHONPATH`` (installed), a fresh interpreter runs the script
(:func:`~.distributed.run_command`).

:func:`start_script` starts such a run without waiting (a run a test
kills), :func:`run_ranks` runs one fork per rank with torchrun's
environment. Their processes are the zygote's grandchildren, not the
caller's children: what the caller has is their pids and, from the
zygote, their exit codes.
"""
import atexit
import contextlib
import ctypes
import json
import os
import os.path as osp
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

from .distributed import (TRAINING_IMPORTS, cpu_env, find_free_port,
                          raise_if_failed, run_command, torchrun_command)

#: Environment variables read while TRAINING_IMPORTS is imported: a call
#: whose values differ from the zygote's gets a fresh interpreter.
IMPORT_TIME_ENV = ('CUDA_VISIBLE_DEVICES', 'OMP_NUM_THREADS',
                   'MKL_NUM_THREADS')
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b'\n')


def _receive(stream) -> dict:
    line = stream.readline()
    if not line:
        raise ConnectionError('the warm interpreter closed the connection')
    return json.loads(line)


def _serve(path: str) -> Optional[dict]:
    """Answer requests until told to stop (returns None); in a forked
    child, return the request it is to run.

    Each request gets a supervisor fork that starts the run's processes,
    waits for them and reports; the zygote goes back to accepting at once,
    so a test can start a run and ask for another while the first goes on.
    """
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    package = osp.dirname(osp.dirname(sys.modules['mmdata_plugin'].__file__))
    print(json.dumps(dict(ready=True, package_root=package)), flush=True)
    while True:
        conn, _ = listener.accept()
        _reap_supervisors()
        with conn, conn.makefile('r') as stream:
            request = _receive(stream)
            if request.get('stop'):
                listener.close()
                return None
            if os.fork() == 0:
                listener.close()
                return _supervise(conn, request)


def _reap_supervisors() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _supervise(conn: socket.socket, request: dict) -> dict:
    """In the supervisor: fork the run's processes (one, or one per rank);
    in one of them, return its request; else report and exit."""
    new_session = bool(request.get('new_session'))
    pids = []
    for rank_env in request.get('ranks') or [{}]:
        started, done = os.pipe()
        pid = os.fork()
        if pid == 0:
            conn.close()
            os.close(started)
            if new_session:
                os.setsid()
            # Popen returns once the child is in its own session: a killpg
            # right after the start must find the group.
            os.close(done)
            request['env'].update(rank_env)
            return request
        os.close(done)
        os.read(started, 1)  # end of file once the child has set up
        os.close(started)
        pids.append(pid)
    try:
        _send(conn, dict(pids=pids))
    except OSError:
        pass  # the caller is gone: _wait_all sees it and stops the run
    returncode = _wait_all(pids, conn, new_session)
    with contextlib.suppress(OSError):
        _send(conn, dict(returncode=returncode))
    os._exit(0)


def _caller_gone(conn: socket.socket) -> bool:
    """Whether the caller closed its end (it exited, or was killed)."""
    readable, _, _ = select.select([conn], [], [], 0.05)
    if not readable:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b''
    except OSError:
        return True


def _wait_all(pids: List[int], conn: socket.socket,
              new_session: bool) -> int:
    """Wait for every pid; the first failure's exit code, else 0. As
    torchrun does, a failed rank stops the others (a rank waiting on a
    collective with a dead peer would wait for gloo's 30-minute timeout);
    a caller gone (killed, crashed) stops them all, so no run outlives the
    test that started it."""
    returncode = 0
    running = set(pids)
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if _caller_gone(conn):
                _kill_all(running, new_session)
            continue
        if pid not in running:
            continue
        running.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code and not returncode:
            returncode = code
            _kill_all(running, new_session)
    return returncode


def _kill_all(pids, new_session: bool) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            if new_session:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)


def _become(request: dict) -> None:
    """Turn this fork into ``python script args`` as the caller asked."""
    # Appending: the ranks of one run share the file, as torchrun's ranks
    # share its output.
    output = os.open(request['output'],
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.close(stdin)
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    script = osp.abspath(request['script'])
    first = [osp.dirname(script)] + [
        p for p in request['env'].get('PYTHONPATH', '').split(os.pathsep)
        if p
    ]
    sys.path[:] = first + [p for p in sys.path[1:] if p not in first]
    sys.argv = [request['script'], *request['args']]
    threads = request['env'].get('OMP_NUM_THREADS', '')
    if threads.isdigit() and 'torch' in sys.modules:
        # A forked child's intra-op pool starts at one thread, whatever
        # torch read from OMP_NUM_THREADS when the zygote imported it.
        sys.modules['torch'].set_num_threads(int(threads))


def _die_with_caller() -> None:
    """Linux: SIGKILL this zygote when the process that started it dies
    (a test process killed by CI would leave it waiting in accept)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG,
                                                signal.SIGKILL)


def _main(path: str, caller: int) -> None:
    _die_with_caller()
    if os.getppid() != caller:
        return  # it died before prctl took effect
    for name in TRAINING_IMPORTS:
        try:
            __import__(name)
        except ImportError:
            pass  # the script imports it (or fails) itself
    request = _serve(path)
    if request is None:
        return
    _become(request)
    runpy.run_path(request['script'], run_name='__main__')


class WarmPython:
    """A zygote serving one caller process; see :func:`run_script`.

    Args:
        env (dict): Its environment (what the imports read).
    """

    def __init__(self, env: Dict[str, str], package_root: str) -> None:
        self.env = dict(env)
        self.package_root = package_root
        self._dir = tempfile.mkdtemp(prefix='warm_python_')
        self.path = osp.join(self._dir, 'socket')
        self.process = subprocess.Popen(
            [sys.executable, '-m', __name__, self.path,
             str(os.getpid())],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True)
        try:
            imported = _receive(self.process.stdout)['package_root']
            if osp.realpath(imported) != package_root:
                raise ValueError(f'the warm interpreter imported '
                                 f'mmdata_plugin from {imported}, not from '
                                 f'{package_root}')
        except BaseException:
            self.close()
            raise

    def serves(self, env: Dict[str, str]) -> bool:
        """Whether a script run with ``env`` would import what the zygote
        imported: the same import-time variables, this package found first
        in the same checkout."""
        return (self.process.poll() is None
                and all(env.get(k) == self.env.get(k)
                        for k in IMPORT_TIME_ENV)
                and _package_root(env) == self.package_root)

    def start(self,
              script: str,
              args: Sequence[str],
              env: Dict[str, str],
              cwd: Optional[str],
              output: str,
              ranks: Sequence[Dict[str, str]] = (),
              new_session: bool = False) -> 'WarmProcess':
        """Start ``script`` in one fork, or in one fork per entry of
        ``ranks`` (each adds its variables to ``env``), its output appended
        to the file ``output``."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            _send(conn, dict(script=script, args=list(args), env=env,
                             cwd=cwd or os.getcwd(), output=output,
                             ranks=list(ranks), new_session=new_session))
            return WarmProcess(conn, [sys.executable, script, *args])
        except BaseException:
            conn.close()
            raise

    def run(self,
            script: str,
            args: Sequence[str],
            env: Dict[str, str],
            cwd: Optional[str],
            timeout: float,
            ranks: Sequence[Dict[str, str]] = ()
            ) -> subprocess.CompletedProcess:
        """:meth:`start`, then wait for the end; the output returned."""
        handle, output = tempfile.mkstemp(prefix='run_', dir=self._dir)
        os.close(handle)
        try:
            process = self.start(script, args, env, cwd, output, ranks)
            try:
                process.wait(timeout)
            except BaseException:  # a timeout, or pytest's own interrupt
                process.kill()
                raise
            with open(output, errors='replace') as file:
                stdout = file.read()
        finally:
            os.remove(output)
        return subprocess.CompletedProcess(process.args, process.returncode,
                                           stdout)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                with socket.socket(socket.AF_UNIX,
                                   socket.SOCK_STREAM) as conn:
                    conn.connect(self.path)
                    _send(conn, dict(stop=True))
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        for name in os.listdir(self._dir):
            os.remove(osp.join(self._dir, name))
        os.rmdir(self._dir)


class WarmProcess:
    """A run started in the zygote, as much of ``subprocess.Popen`` as the
    tests use: ``pid`` (the first rank's), ``pids``, ``poll()``,
    ``wait(timeout)``, ``kill()`` and ``returncode`` (negative: the signal
    that killed it). The processes are the zygote's grandchildren; the
    exit code comes from their supervisor over the socket.
    """

    def __init__(self, conn: socket.socket, args: List[str]) -> None:
        self.args = args
        self.returncode: Optional[int] = None
        self._conn = conn
        self._buffer = b''
        self.pids = self._message(None)['pids']
        self.pid = self.pids[0]

    def _message(self, timeout: Optional[float]) -> Optional[dict]:
        """The supervisor's next message; None if none came in
        ``timeout`` seconds (0: look only)."""
        self._conn.settimeout(timeout)
        while b'\n' not in self._buffer:
            try:
                piece = self._conn.recv(4096)
            except (BlockingIOError, socket.timeout):
                return None
            if not piece:
                raise ConnectionError(
                    'the warm interpreter closed the connection')
            self._buffer += piece
        line, self._buffer = self._buffer.split(b'\n', 1)
        return json.loads(line)

    def poll(self) -> Optional[int]:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            message = self._message(timeout)
            if message is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = message['returncode']
            self._conn.close()
        return self.returncode

    def kill(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


_zygotes: List[WarmPython] = []


def _package_root(env: Dict[str, str]) -> Optional[str]:
    """The ``PYTHONPATH`` entry ``mmdata_plugin`` is imported from under
    ``env``; None where it comes from elsewhere (installed)."""
    for entry in env.get('PYTHONPATH', '').split(os.pathsep):
        if entry and osp.isfile(
                osp.join(entry, 'mmdata_plugin', '__init__.py')):
            return osp.realpath(entry)
    return None


def _zygote_for(env: Dict[str, str]) -> Optional[WarmPython]:
    for zygote in _zygotes:
        if zygote.serves(env):
            return zygote
    root = _package_root(env)
    if root is None:
        return None
    try:
        zygote = WarmPython(env, root)
    except (OSError, ValueError, ConnectionError):
        return None
    if not _zygotes:
        atexit.register(lambda: [z.close() for z in _zygotes])
    _zygotes.append(zygote)
    return zygote


def run_script(script: str,
               args: Sequence[str] = (),
               env: Optional[Dict[str, str]] = None,
               cwd: Optional[str] = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """``python script args`` as :func:`~.distributed.run_command` runs it
    (the environment made by ``cpu_env(env)``, output and exit code
    returned, :class:`ProcessFailed` on failure), in a fork of a warm
    interpreter where the call allows it (see the module's docstring).
    """
    env = cpu_env(env)
    zygote = _zygote_for(env)
    if zygote is None:
        return run_command([sys.executable, script, *args], env=env,
                           cwd=cwd, timeout=timeout)
    return raise_if_failed(zygote.run(script, args, env, cwd, timeout))


def warm_socket(env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The socket of the warm interpreter for ``cpu_env(env)`` (started if
    none serves it yet), for a process that asks it for forks itself
    (:mod:`.warm_ray_worker`); None where the call does not allow one."""
    zygote = _zygote_for(cpu_env(env))
    return None if zygote is None else zygote.path


def start_script(script: str,
                 args: Sequence[str],
                 output: str,
                 env: Optional[Dict[str, str]] = None,
                 cwd: Optional[str] = None,
                 new_session: bool = False):
    """``python script args`` started, not waited for, as
    ``subprocess.Popen`` starts it (output appended to the file ``output``,
    in a session of its own with ``new_session``), in a fork of the warm
    interpreter where the call allows it. Returns the ``Popen`` or a
    :class:`WarmProcess`: both have ``pid``, ``poll``, ``wait``, ``kill``
    and ``returncode``. For runs a test kills: the pid is the script's own
    process, its DataLoader workers and helpers its descendants.
    """
    env = cpu_env(env)
    zygote = _zygote_for(env)
    if zygote is None:
        with open(output, 'ab') as file:
            return subprocess.Popen([sys.executable, script, *args], env=env,
                                    cwd=cwd, stdout=file,
                                    stderr=subprocess.STDOUT,
                                    start_new_session=new_session)
    return zygote.start(script, args, env, cwd, output,
                        new_session=new_session)


def rank_env(rank: int, nproc: int, port: int) -> Dict[str, str]:
    """What ``torchrun --nproc_per_node=nproc`` on one node puts into the
    environment of rank ``rank`` (its ``env://`` rendezvous, without the
    elastic agent's store: rank 0 hosts the store)."""
    return dict(
        MASTER_ADDR='127.0.0.1',
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        GROUP_RANK='0',
        ROLE_RANK=str(rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        ROLE_WORLD_SIZE=str(nproc),
        TORCHELASTIC_RESTART_COUNT='0',
        TORCHELASTIC_MAX_RESTARTS='0',
        TORCHELASTIC_RUN_ID='none')


def run_ranks(script: str,
              args: Sequence[str] = (),
              nproc: int = 2,
              env: Optional[Dict[str, str]] = None,
              cwd: Optional[str] = None,
              timeout: float = 600) -> subprocess.CompletedProcess:
    """``script`` on ``nproc`` ranks of one node, as
    :func:`~.distributed.run_torchrun` runs it (the ranks' environment of
    :func:`rank_env`, their output together, a failed rank stopping the
    others, :class:`ProcessFailed` on failure), each rank a fork of the
    warm interpreter where the call allows it, else under torchrun. The
    ranks are children of the zygote, not of torchrun: a test of
    torchrun itself (its restarts, its process tree) runs torchrun.
    """
    env = cpu_env(env)
    zygote = _zygote_for(env)
    if zygote is None:
        return run_command(torchrun_command(script, args, nproc), env=env,
                           cwd=cwd, timeout=timeout)
    port = find_free_port()
    ranks = [rank_env(rank, nproc, port) for rank in range(nproc)]
    return raise_if_failed(
        zygote.run(script, args, env, cwd, timeout, ranks=ranks))


if __name__ == '__main__':
    _main(sys.argv[1], int(sys.argv[2]))
