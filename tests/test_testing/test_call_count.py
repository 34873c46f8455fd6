"""count_calls: which code runs, counted (tests of the data monitor's
per-batch and per-sample work use it)."""
import sys

from mmdata_plugin.testing import count_calls


def _leaf(value):
    return abs(value)


def _branch(n):
    return [_leaf(-i) for i in range(n)]


def test_calls_into_matching_files_are_counted_with_their_builtins():
    result, calls = count_calls(lambda: (_branch(3), len('ab')),
                                'test_call_count.py')
    assert result == ([0, 1, 2], 2)
    assert calls['_branch'] == 1
    assert calls['_leaf'] == 3 and calls['_leaf>abs'] == 3
    # Code in other files (the builtins it calls too) is not counted.
    _, calls = count_calls(lambda: sys.intern('x'), 'no/such/file.py')
    assert not calls


def test_the_previous_profiler_is_put_back():

    def previous(frame, event, arg):
        pass

    sys.setprofile(previous)
    try:
        count_calls(lambda: _branch(1), 'test_call_count.py')
        assert sys.getprofile() is previous
    finally:
        sys.setprofile(None)
