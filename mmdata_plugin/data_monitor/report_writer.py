"""A thread that writes DataMonitorHook's reports beside training."""
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
    job is logged and the next one runs. The thread is a daemon: a process
    that ends without :meth:`close` (an error in training, a kill) drops
    the jobs not yet done, and since every file is replaced atomically the
    last complete report stays.
    """

    def __init__(self, name: str = 'DataMonitorReportWriter') -> None:
        self._jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(
            target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, job: Callable, *args) -> None:
        self._jobs.put((job, args))

    def flush(self) -> None:
        """Wait until the jobs handed over so far are done."""
        self._jobs.join()

    def close(self) -> None:
        """Finish the jobs handed over so far, then stop the thread."""
        self._jobs.put(None)
        self.thread.join()

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, args = item
            try:
                job(*args)
            except Exception as error:  # the next report may well succeed
                print_log(
                    f'DataMonitorHook: writing the report failed: {error!r}',
                    logger='current',
                    level=logging.WARNING)
            finally:
                self._jobs.task_done()
