# The compatibility matrix: each stack of docs/compatibility.md in a fresh
# virtualenv, the user's packages first, then our install
# (tools/bootstrap.py, the README's), then the checks:
#
# 1. a plain `pip install` of the package's wheel, then our install, changed
#    nothing that was there (`pip freeze` before and after: only additions),
# 2. `import mmdata_plugin` works from outside the checkout (the installed
#    copy),
# 3. with the tests' extras added (bootstrap --extras tests), the
#    compatibility selection of the suite (`pytest -m compat`: every
#    torch/mmengine internal and every component once, the README's demo
#    shrunk) passes against that stack.
#
# CI runs it after the whole suite (.ci/run). pip's cache makes a second run
# download nothing; the virtualenvs are made anew each run, so every run
# installs as a new user does.
import argparse
import contextlib
import glob
import os
import os.path as osp
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, NamedTuple, Optional

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


class Stack(NamedTuple):
    name: str
    title: str
    python: str  # major.minor
    packages: List[str]  # what the user had before our install
    disk_gb: float  # the virtualenv at its largest, with pip's downloads


STACKS = (
    Stack('floor', 'classic OpenMMLab floor: torch 2.1, numpy 1, mmengine '
          '0.10.3, mmcv-lite 2.1', '3.10',
          ['torch==2.1.2', 'numpy==1.26.4', 'mmengine==0.10.3',
           'mmcv-lite==2.1.0'], 8),
    Stack('onedl', 'OneDL engine: onedl-mmengine 0.10.12, numpy 2', '3.11',
          ['torch==2.13.0', 'onedl-mmengine==0.10.12'], 3),
    Stack('newest', 'newest torch served here, Python 3.12, nothing else',
          '3.12', ['torch==2.14.1'], 10),
)
# What a failed stack's log shows in CI's own output (its log file does not
# outlive the CI machine).
LOG_TAIL_LINES = 25


class Result(NamedTuple):
    stack: Stack
    versions: str
    stack_s: float
    install_s: float
    deps_s: float
    test_s: float
    outcome: str


def find_python(version: str) -> Optional[str]:
    """An interpreter of ``version``: on PATH, else a pyenv install."""
    found = shutil.which(f'python{version}')
    if found and subprocess.run([found, '--version'],
                                capture_output=True).returncode == 0:
        return found
    pyenv_root = os.environ.get('PYENV_ROOT', osp.expanduser('~/.pyenv'))
    candidates = sorted(
        glob.glob(
            osp.join(pyenv_root, 'versions', f'{version}.*', 'bin',
                     f'python{version}')))
    return candidates[-1] if candidates else None


def run(cmd: List[str], log, **kwargs) -> float:
    """Run ``cmd`` with its output in ``log``; seconds taken. Raises on a
    non-zero exit, naming the command and the log."""
    log.write(f'\n+ {" ".join(cmd)}\n')
    log.flush()
    start = time.monotonic()
    done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                          **kwargs)
    if done.returncode:
        raise RuntimeError(f'exit {done.returncode}: {" ".join(cmd)} '
                           f'(see {log.name})')
    return time.monotonic() - start


def freeze(python: str) -> Dict[str, str]:
    out = subprocess.run([python, '-m', 'pip', 'list', '--format=freeze'],
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split('==', 1) for line in out.splitlines()
                if '==' in line)


def freeze_changes(before: Dict[str, str], after: Dict[str, str]) -> List[str]:
    return [
        f'{name} {version} -> {after.get(name, "removed")}'
        for name, version in sorted(before.items())
        if after.get(name) != version
    ]


def stack_versions(python: str) -> str:
    code = ('import importlib.metadata as m, sys\n'
            'names = ["torch", "numpy", "mmengine", "onedl-mmengine", '
            '"mmcv", "mmcv-lite", "onedl-mmcv", "opencv-python"]\n'
            'found = []\n'
            'for n in names:\n'
            '    try: found.append(f"{n} {m.version(n)}")\n'
            '    except m.PackageNotFoundError: pass\n'
            'print(f"Python {sys.version.split()[0]}, " + ", ".join(found))')
    return subprocess.run([python, '-c', code], capture_output=True,
                          text=True, check=True).stdout.strip()


class DiskBudget:
    """Lets a stack start only when the disk has room for its virtualenv
    beside what the stacks already running have still to write; otherwise
    it waits for one of them to finish and remove its own. The machines'
    disk is shared, and a pip install that runs out of it fails with a
    message no one reads (CI keeps only what the command prints)."""

    def __init__(self, path: str):
        self.path = path
        self.running: Dict[str, float] = {}  # venv -> GB reserved
        self.changed = threading.Condition()

    def free_gb(self) -> float:
        return shutil.disk_usage(self.path).free / 2**30

    def still_to_write_gb(self) -> float:
        """What the running stacks reserved and have not written yet (what
        they wrote is gone from the free space already)."""
        return sum(
            max(0.0, reserved - _tree_gb(venv))
            for venv, reserved in self.running.items())

    def acquire(self, stack: Stack, venv: str) -> Optional[str]:
        """None once reserved; else why the stack cannot run at all."""
        with self.changed:
            while (self.free_gb() - self.still_to_write_gb() <
                   stack.disk_gb):
                if not self.running:
                    return (f'{self.free_gb():.1f} GB free on the disk of '
                            f'{self.path}, {stack.name} needs about '
                            f'{stack.disk_gb:.0f} GB')
                self.changed.wait(timeout=30)
            self.running[venv] = stack.disk_gb
            return None

    def release(self, venv: str) -> None:
        with self.changed:
            del self.running[venv]
            self.changed.notify_all()


def _tree_gb(path: str) -> float:
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(osp.join(folder, name)).st_size
    return total / 2**30


def check_stack(stack: Stack, work: str, wheel: str, pytest_args: List[str],
                disk: DiskBudget, keep_venv: bool) -> Result:
    log_path = osp.join(work, f'{stack.name}.log')
    # A log of an earlier run must not pass for this run's.
    with contextlib.suppress(FileNotFoundError):
        os.remove(log_path)
    interpreter = find_python(stack.python)
    if interpreter is None:
        return Result(stack, '', 0, 0, 0, 0,
                      f'FAILED: no Python {stack.python} on this machine')
    venv = osp.join(work, stack.name)
    shutil.rmtree(venv, ignore_errors=True)
    short_of_disk = disk.acquire(stack, venv)
    if short_of_disk:
        return Result(stack, '', 0, 0, 0, 0, f'FAILED: {short_of_disk}')
    print(f'== {stack.name}: {stack.title} (log: {log_path})', flush=True)
    try:
        return install_and_test(stack, interpreter, venv, log_path, wheel,
                                pytest_args)
    finally:
        if not keep_venv:
            shutil.rmtree(venv, ignore_errors=True)
        disk.release(venv)


def install_and_test(stack: Stack, interpreter: str, venv: str,
                     log_path: str, wheel: str,
                     pytest_args: List[str]) -> Result:
    stack_s = install_s = deps_s = test_s = 0.0
    versions = ''
    work = osp.dirname(venv)
    with open(log_path, 'w') as log:
        try:
            python = osp.join(venv, 'bin', 'python')
            stack_s = run([interpreter, '-m', 'venv', venv], log)
            stack_s += run(
                [python, '-m', 'pip', 'install', *stack.packages], log)
            before = freeze(python)
            install_s = run([python, '-m', 'pip', 'install', wheel], log)
            bootstrap = [python, osp.join(ROOT, 'tools', 'bootstrap.py')]
            install_s += run(bootstrap, log)
            after = freeze(python)
            changes = freeze_changes(before, after)
            versions = stack_versions(python)
            log.write(f'\nadded by our install: '
                      f'{sorted(set(after) - set(before))}\n')
            if changes:
                raise RuntimeError('the install changed the stack: ' +
                                   '; '.join(changes))
            # From outside the checkout: the installed copy.
            run([python, '-c', 'import mmdata_plugin'], log, cwd=work)
            # The tests' own needs (moto, boto3, ray) may move packages the
            # stack does not protect (botocore pins python-dateutil < 3);
            # bootstrap still keeps the protected ones.
            deps_s = run(bootstrap + ['--extras', 'tests'], log)
            test_s = run([python, '-m', 'pytest', '-m', 'compat', '-q',
                          '-p', 'no:cacheprovider', *pytest_args, 'tests'],
                         log, cwd=ROOT)
        except (RuntimeError, subprocess.CalledProcessError) as error:
            return Result(stack, versions, stack_s, install_s, deps_s,
                          test_s, f'FAILED: {error}')
    with open(log_path) as log:
        summary = [line.strip() for line in log if ' passed' in line]
    return Result(stack, versions, stack_s, install_s, deps_s, test_s,
                  summary[-1].strip('= ') if summary else 'passed')


def print_failed_logs(results: List[Result], work: str) -> None:
    for r in results:
        log_path = osp.join(work, f'{r.stack.name}.log')
        if not (failed(r) and osp.exists(log_path)):
            continue
        with open(log_path, errors='replace') as log:
            tail = log.readlines()[-LOG_TAIL_LINES:]
        print(f'\n== {r.stack.name} failed; the end of {log_path}:')
        print(''.join(tail).rstrip())


def failed(result: Result) -> bool:
    return result.outcome.startswith('FAILED') or ' failed' in result.outcome


def build_wheel(work: str) -> str:
    """The package's wheel, as a user would install it without us."""
    folder = osp.join(work, 'wheel')
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '-q',
                    '-w', folder, ROOT], check=True)
    return glob.glob(osp.join(folder, 'mmdata_plugin-*.whl'))[0]


def print_table(results: List[Result]) -> None:
    print('\n| stack | versions | stack install s | our install s | '
          'test extras s | compat tests s | result |\n'
          '| --- | --- | --- | --- | --- | --- | --- |')
    for r in results:
        print(f'| {r.stack.name} | {r.versions} | {r.stack_s:.0f} | '
              f'{r.install_s:.0f} | {r.deps_s:.0f} | {r.test_s:.0f} | '
              f'{r.outcome} |')


def main(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(
        description='Install into each supported stack in a fresh '
        'virtualenv and run the compatibility selection there')
    parser.add_argument(
        '--stacks',
        default=','.join(stack.name for stack in STACKS),
        help='comma-separated, of: ' + ', '.join(s.name for s in STACKS))
    parser.add_argument(
        '--work-dir',
        default=osp.join(ROOT, 'work_dirs', 'compat'),
        help='virtualenvs and logs (each stack\'s made anew each run)')
    parser.add_argument(
        '--jobs',
        type=int,
        default=len(STACKS),
        help='stacks checked at once (their downloads and installs wait on '
        'the network and the disk, and overlap)')
    parser.add_argument(
        'pytest_args', nargs='*', help='more pytest arguments, after --')
    parser.add_argument(
        '--keep-venvs',
        action='store_true',
        help='leave each virtualenv in the work dir (by default each is '
        'removed once checked: together they take ~20 GB)')
    args = parser.parse_args(argv)
    wanted = args.stacks.split(',')
    unknown = set(wanted) - {stack.name for stack in STACKS}
    if unknown:
        parser.error(f'--stacks: unknown {sorted(unknown)}')
    os.makedirs(args.work_dir, exist_ok=True)
    wheel = build_wheel(args.work_dir)
    disk = DiskBudget(args.work_dir)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(
            pool.map(
                lambda stack: check_stack(stack, args.work_dir, wheel,
                                          args.pytest_args, disk,
                                          args.keep_venvs),
                [stack for stack in STACKS if stack.name in wanted]))
    print_table(results)
    print_failed_logs(results, args.work_dir)
    if any(failed(r) for r in results):
        sys.exit(1)


if __name__ == '__main__':
    main()
