"""The report's JSON text, its atomic writes and the writer thread."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

from helpers import REPO_ROOT

from mmdata_plugin.data_monitor import load_report
from mmdata_plugin.data_monitor.report import encode_report
from mmdata_plugin.data_monitor.report_writer import ReportWriter
from mmdata_plugin.data_monitor.verdict import SCHEMA
from mmdata_plugin.testing import python_path


def _point(step, steps=10, scale=1.0):
    return dict(
        step=step,
        steps=steps,
        wait=0.1 * scale,
        compute=2.5,
        worker=1.0 / 3,
        transfer=0.0,
        timed=1,
        stages={'00_Load': 0.25 * scale, 'collate': 0.5})


def _report(timelines):
    return dict(
        schema=SCHEMA,
        verdict=dict(summary='x'),
        ranks=[
            dict(rank=rank, steps=len(points), timeline=points, other=[1.5])
            for rank, points in enumerate(timelines)
        ])


def test_encoded_report_is_json_dumps_whatever_the_cache_holds():
    cache = {}
    first = [_point(s) for s in range(0, 50, 10)]
    report = _report([first, [_point(5)]])
    assert encode_report(report, cache) == json.dumps(report)
    assert encode_report(report) == json.dumps(report)
    # Later points added, neighbours merged (same last step, more steps),
    # and a point changed under an old key: the cache must not serve any
    # stale text.
    merged = [_point(10, steps=20), _point(30, steps=20), _point(40)]
    changed = [_point(5, scale=3.0), _point(15)]
    report = _report([merged + [_point(50)], changed])
    assert encode_report(report, cache) == json.dumps(report)
    # Only the points of the last report are kept.
    assert len(cache) == 6


def test_writer_runs_jobs_in_order_on_its_thread_and_flushes():
    writer = ReportWriter(max_pending=8)
    done = []
    release = threading.Event()

    def job(n):
        release.wait()
        done.append((n, threading.current_thread() is writer.thread))

    for n in range(3):
        writer.submit(job, n)
    writer.submit(lambda: 1 / 0)  # logged; the next job still runs
    writer.submit(job, 3)
    assert done == []  # handed over, not run by the caller
    release.set()
    writer.flush()
    assert done == [(n, True) for n in range(4)]
    writer.close()
    assert not writer.thread.is_alive()


def test_a_writer_that_falls_behind_holds_up_submit():
    writer = ReportWriter(max_pending=2)
    release, started = threading.Event(), threading.Event()

    def job():
        started.set()
        release.wait()

    writer.submit(job)
    started.wait()
    writer.submit(job)
    writer.submit(job)  # two wait now
    third = threading.Thread(target=writer.submit, args=(job, ))
    third.start()
    third.join(0.2)
    assert third.is_alive()  # held up, not dropped, not queued beyond two
    release.set()
    third.join(5)
    assert not third.is_alive()
    writer.close()


EXIT_CHILD = '''
import atexit, sys, time
from mmdata_plugin.data_monitor.report_writer import ReportWriter

path, seconds, exit_timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
# Registered first, run last: after the writer's.
atexit.register(lambda: print(time.monotonic(), flush=True))
writer = ReportWriter(exit_timeout=exit_timeout)

def write(n):
    time.sleep(seconds)
    with open(path, 'a') as f:
        f.write(f'{n}\\n')

for n in range(3):
    writer.submit(write, n)
print(time.monotonic(), flush=True)
raise RuntimeError('training failed')
'''


def _exit_child(path, seconds, exit_timeout):
    env = dict(os.environ, PYTHONPATH=python_path(REPO_ROOT))
    child = subprocess.run(
        [sys.executable, '-c', EXIT_CHILD, path,
         str(seconds), str(exit_timeout)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60)
    assert child.returncode == 1 and 'training failed' in child.stderr
    written = open(path).read().split() if os.path.exists(path) else []
    raised_at, *log, done_at = child.stdout.splitlines()
    return written, float(done_at) - float(raised_at), log


def test_an_exit_on_an_error_finishes_the_pending_jobs(tmp_path):
    written, _, log = _exit_child(str(tmp_path / 'a'), 0.1, 10.0)
    assert written == ['0', '1', '2'] and log == []


def test_an_exit_waits_no_longer_than_its_deadline(tmp_path):
    written, spent, log = _exit_child(str(tmp_path / 'a'), 2.0, 1.0)
    assert written == [] and 1.0 <= spent < 1.5  # not 3 jobs of 2 s
    assert 'did not finish within 1 s' in log[0]
    # exit_timeout=0 (several ranks): the pending jobs are dropped.
    written, _, log = _exit_child(str(tmp_path / 'b'), 0.1, 0.0)
    assert written == [] and 'did not finish' in log[0]


WRITING_CHILD = '''
import sys
from mmdata_plugin.data_monitor import save_report
from mmdata_plugin.data_monitor.report_writer import ReportWriter
from mmdata_plugin.data_monitor.verdict import SCHEMA

path, cache, writer = sys.argv[1], {}, ReportWriter()
points = [dict(step=s, steps=1, wait=s / 7, stages={'a': s / 3})
          for s in range(8000)]
for n in range(10**6):
    timeline = points[:4000 + n]
    timeline[-1] = dict(timeline[-1], n=n)
    report = dict(schema=SCHEMA, n=n, ranks=[dict(rank=0, timeline=timeline)])
    writer.submit(save_report, report, path, cache)
    writer.flush()
    if n == 1:
        print('written', flush=True)
'''


def test_a_killed_writer_leaves_the_last_complete_report(tmp_path):
    path = str(tmp_path / 'data_monitor.json')
    env = dict(os.environ, PYTHONPATH=python_path(REPO_ROOT))
    # The child spends nearly all its time writing: a kill lands mid-write.
    for delay in (0.0, 0.2):
        child = subprocess.Popen(
            [sys.executable, '-c', WRITING_CHILD, path],
            stdout=subprocess.PIPE,
            env=env,
            text=True)
        try:
            assert child.stdout.readline() == 'written\n'
            time.sleep(delay)
            child.send_signal(signal.SIGKILL)
        finally:
            child.wait()
            child.stdout.close()
        report = load_report(path)  # whole: it parses
        assert len(report['ranks'][0]['timeline']) == 4000 + report['n']
        assert report['ranks'][0]['timeline'][-1]['n'] == report['n']
