"""A thread that writes DataMonitorHook's reports beside training."""
import atexit
import logging
import queue
import threading
from typing import Callable

from mmengine.logging import print_log


class ReportWriter:
    """Runs the jobs handed to it one after another, on a thread of its
    own: the training thread only hands them over.

    Jobs run in the order given, so the collectives in them (the gathering
    of all ranks' figures) meet in the same order on every rank. A failing
    job is logged and the next one runs. At most ``max_pending`` jobs wait:
    a writer that falls behind holds up :meth:`submit` (each job holds
    steps to book, so memory stays bounded) instead of dropping one,
    which a rank could not do alone without its peers waiting in the
    dropped job's collective.

    The thread is a daemon. A process that ends without :meth:`close` (an
    error in training) still finishes the jobs handed over, for at most
    ``exit_timeout`` seconds (0 drops them: jobs whose collectives wait on
    peers that may be gone); a kill drops them. Every file is replaced
    atomically, so the last complete report stays either way.

    Args:
        name (str): The thread's name.
        max_pending (int): Jobs handed over and not yet started, at most.
            Defaults to 2.
        exit_timeout (float): Seconds the interpreter's exit waits for the
            jobs not done. Defaults to 10.
    """

    def __init__(self,
                 name: str = 'DataMonitorReportWriter',
                 max_pending: int = 2,
                 exit_timeout: float = 10.0) -> None:
        if max_pending < 1:
            raise ValueError(
                f'ReportWriter needs max_pending >= 1, got {max_pending}')
        # Two C queues, not queue.Queue: submit runs on the training
        # thread seconds apart, with cold caches, and Queue.put runs some
        # forty lines of Python condition code (0.2-0.8 ms there on a
        # virtual machine); SimpleQueue's put and get are one C call
        # each. A job may wait only with a token of `_room`, given back
        # when it starts.
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._room: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(max_pending):
            self._room.put(None)
        # Jobs handed over (counted by the submitting thread) and done
        # (by the writer's): each written by one thread only.
        self._handed = self._done = 0
        self.exit_timeout = exit_timeout
        self.thread = threading.Thread(
            target=self._run, name=name, daemon=True)
        self.thread.start()
        atexit.register(self._finish_at_exit)

    def submit(self, job: Callable, *args) -> None:
        """Hand ``job(*args)`` over; waits while ``max_pending`` jobs do."""
        self._room.get()
        self._handed += 1
        self._jobs.put((job, args))

    def flush(self) -> None:
        """Wait until the jobs handed over so far are done."""
        if not self.thread.is_alive():  # closed: all of them ran
            return
        done = threading.Event()
        self.submit(done.set)
        done.wait()

    def close(self) -> None:
        """Finish the jobs handed over so far, then stop the thread."""
        atexit.unregister(self._finish_at_exit)
        self._jobs.put(None)
        self.thread.join()

    def _finish_at_exit(self) -> None:
        if self._done == self._handed:
            return
        self._jobs.put(None)
        self.thread.join(self.exit_timeout)
        if self.thread.is_alive():
            print_log(
                'DataMonitorHook: the report writer did not finish within '
                f'{self.exit_timeout:g} s of the exit; the last complete '
                'report stays.',
                logger='current',
                level=logging.WARNING)

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            self._room.put(None)
            job, args = item
            try:
                job(*args)
            except Exception as error:  # the next report may well succeed
                print_log(
                    f'DataMonitorHook: writing the report failed: {error!r}',
                    logger='current',
                    level=logging.WARNING)
            finally:
                self._done += 1
