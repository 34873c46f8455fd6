"""tools/compat_matrix.py runs its stacks only as far as the disk allows and
says why a stack failed in its own output (CI keeps nothing else)."""
import threading
import time

import pytest
from helpers import load_tool


def _stack(matrix, name, disk_gb):
    return matrix.Stack(name, name, '3.11', [], disk_gb)


def test_a_stack_waits_for_the_disk_a_running_one_frees(tmp_path):
    matrix = load_tool('compat_matrix')
    disk = matrix.DiskBudget(str(tmp_path))
    free = [12.0]
    disk.free_gb = lambda: free[0]
    first, second = _stack(matrix, 'a', 8), _stack(matrix, 'b', 8)
    assert disk.acquire(first, str(tmp_path / 'a')) is None
    started = threading.Event()
    threading.Thread(
        target=lambda: disk.acquire(second, str(tmp_path / 'b')) or
        started.set(),
        daemon=True).start()
    time.sleep(0.3)
    assert not started.is_set(), 'both stacks ran on 12 GB'
    disk.release(str(tmp_path / 'a'))
    assert started.wait(5), 'the second stack never ran'
    assert disk.running == {str(tmp_path / 'b'): 8}


def test_what_a_running_stack_wrote_is_not_counted_twice(tmp_path):
    matrix = load_tool('compat_matrix')
    disk = matrix.DiskBudget(str(tmp_path))
    venv = tmp_path / 'a'
    venv.mkdir()
    (venv / 'torch.so').write_bytes(b'\0' * (1 << 20))
    disk.running[str(venv)] = 1 / 1024 + 2  # 1 MB of it written already
    assert abs(disk.still_to_write_gb() - 2) < 1e-6


def test_a_stack_bigger_than_the_free_disk_fails_naming_both(tmp_path):
    matrix = load_tool('compat_matrix')
    disk = matrix.DiskBudget(str(tmp_path))
    disk.free_gb = lambda: 2.5
    why = disk.acquire(_stack(matrix, 'newest', 10), str(tmp_path / 'n'))
    assert why == (f'2.5 GB free on the disk of {tmp_path}, newest needs '
                   'about 10 GB')
    assert disk.running == {}


def test_main_checks_the_stacks_asked_for_and_fails_on_a_failure(
        tmp_path, monkeypatch, capsys):
    matrix = load_tool('compat_matrix')
    checked = []

    def check_stack(stack, work, wheel, pytest_args, disk, keep_venv):
        checked.append((stack.name, wheel, pytest_args, keep_venv))
        outcome = 'FAILED: exit 1: pip' if stack.name == 'newest' else \
            '3 passed'
        return matrix.Result(stack, 'Python 3', 1, 2, 3, 4, outcome)

    monkeypatch.setattr(matrix, 'check_stack', check_stack)
    monkeypatch.setattr(matrix, 'build_wheel', lambda work: 'the.whl')
    matrix.main(['--stacks', 'floor', '--work-dir', str(tmp_path),
                 '--keep-venvs', '--', '-x'])
    assert checked == [('floor', 'the.whl', ['-x'], True)]
    assert '| floor | Python 3 | 1 | 2 | 3 | 4 | 3 passed |' in (
        capsys.readouterr().out)
    with pytest.raises(SystemExit):
        matrix.main(['--stacks', 'floor,newest', '--work-dir',
                     str(tmp_path)])
    assert [c[0] for c in checked[1:]] == ['floor', 'newest']
    assert checked[-1][3] is False


def test_a_failed_stack_prints_the_end_of_its_log(tmp_path, capsys):
    matrix = load_tool('compat_matrix')
    stack = _stack(matrix, 'floor', 8)
    lines = [f'line {i}' for i in range(40)] + ['OSError: [Errno 28] No '
                                                'space left on device']
    (tmp_path / 'floor.log').write_text('\n'.join(lines) + '\n')
    failed = matrix.Result(stack, '', 13, 0, 0, 0, 'FAILED: exit 1: pip')
    passed = matrix.Result(_stack(matrix, 'onedl', 3), '', 1, 1, 1, 1,
                           '71 passed')
    (tmp_path / 'onedl.log').write_text('onedl output\n')
    matrix.print_failed_logs([failed, passed], str(tmp_path))
    out = capsys.readouterr().out
    assert 'No space left on device' in out
    assert f'line {40 - matrix.LOG_TAIL_LINES + 1}' in out
    assert f'line {40 - matrix.LOG_TAIL_LINES}\n' not in out
    assert 'onedl output' not in out
