"""A Ray worker started in a fork of the warm interpreter.

Given as a Ray node's ``worker_path`` (``ray.cluster_utils.Cluster``'s
``add_node(worker_path=...)``), this script is what the node's raylet runs
for each new worker, with the arguments of Ray's ``default_worker.py``. It
asks the warm interpreter (:mod:`.warm_python`) whose socket
``MMDATA_WARM_PYTHON`` names to run ``default_worker.py`` with them, in
this environment, and waits for that process: an actor then starts in
about a second instead of the ~3.5 s its imports (torch, mmengine, this
package) take in a fresh interpreter. The worker is a real process of its
own: it registers with the raylet under its own pid, and killing it kills
the actor as it would a cold one; killing this process kills it too (the
warm interpreter stops a run whose caller is gone).

Without the variable, or with no warm interpreter answering, it becomes
``default_worker.py`` itself. It imports neither Ray nor this package, so
that it starts in milliseconds.
"""
import importlib.util
import json
import os
import os.path as osp
import socket
import sys

SOCKET_ENV = 'MMDATA_WARM_PYTHON'


def _default_worker() -> str:
    ray_dir = importlib.util.find_spec('ray').submodule_search_locations[0]
    return osp.join(ray_dir, '_private', 'workers', 'default_worker.py')


def _startup_output() -> str:
    """Where this process's stderr goes (the raylet's log file), for the
    fork's: a cold worker writes what fails before it redirects its own
    output (imports, arguments, connecting) there."""
    try:
        path = os.readlink('/proc/self/fd/2')
    except OSError:
        return os.devnull
    return path if osp.isabs(path) and osp.isfile(path) else os.devnull


def main() -> None:
    worker, args = _default_worker(), sys.argv[1:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(os.environ[SOCKET_ENV])
    except (KeyError, OSError):
        conn.close()
        os.execv(sys.executable, [sys.executable, worker, *args])
    # warm_python's protocol: one JSON line each way per message. Once
    # connected the worker writes its own log files; before, the raylet's
    # (appended to, as a cold worker's stderr is). A session of its own:
    # the raylet kills a worker's whole process group when it exits, and
    # the warm interpreter's group is the test process's.
    conn.sendall(json.dumps(dict(
        script=worker, args=args, env=dict(os.environ), cwd=os.getcwd(),
        output=_startup_output(), new_session=True)).encode() + b'\n')
    with conn, conn.makefile('r') as stream:
        stream.readline()  # its pid
        end = stream.readline()
    sys.exit(json.loads(end)['returncode'] if end else 1)


if __name__ == '__main__':
    main()
