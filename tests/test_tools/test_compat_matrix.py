"""tools/compat_matrix.py runs its stacks only as far as the disk allows and
says why a stack failed in its own output (CI keeps nothing else)."""
import threading
import time

from helpers import load_tool


def _stack(matrix, name, disk_gb):
    return matrix.Stack(name, name, '3.11', [], disk_gb)


def test_a_stack_waits_for_the_disk_a_running_one_frees(tmp_path):
    matrix = load_tool('compat_matrix')
    disk = matrix.DiskBudget(str(tmp_path))
    disk.free_gb = lambda: 12.0
    first, second = _stack(matrix, 'a', 8), _stack(matrix, 'b', 8)
    assert disk.acquire(first) is None
    started = threading.Event()
    threading.Thread(
        target=lambda: disk.acquire(second) or started.set(),
        daemon=True).start()
    time.sleep(0.3)
    assert not started.is_set(), 'both stacks ran on 12 GB'
    disk.release(first)
    assert started.wait(5), 'the second stack never ran'
    assert disk.reserved_gb == 8 and disk.running == 1


def test_a_stack_bigger_than_the_free_disk_fails_naming_both(tmp_path):
    matrix = load_tool('compat_matrix')
    disk = matrix.DiskBudget(str(tmp_path))
    disk.free_gb = lambda: 2.5
    why = disk.acquire(_stack(matrix, 'newest', 10))
    assert why == (f'2.5 GB free on the disk of {tmp_path}, newest needs '
                   'about 10 GB')
    assert disk.running == 0 and disk.reserved_gb == 0


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
