"""Bounded retries with exponential backoff and full jitter."""
import random
import time
from typing import Callable, Optional, TypeVar

from .errors import RemoteUnavailableError, RetryableError

T = TypeVar('T')


class RetryPolicy:
    """Retry an attempt that raised :class:`RetryableError`, a few times.

    The n-th retry waits a uniform random time in
    ``[0, min(max_backoff, backoff * 2**n)]`` ("full jitter"): many workers
    failing together (a 503 burst) do not come back in lockstep. The jitter
    comes from a private generator, never from the global ``random`` module,
    whose state belongs to the data pipeline's seeded augmentations.

    Args:
        retries (int): Retries after the first attempt (0: no retry).
        backoff (float): Seconds of the first backoff bound.
        max_backoff (float): Largest backoff bound in seconds.
    """

    def __init__(self,
                 retries: int = 5,
                 backoff: float = 0.2,
                 max_backoff: float = 10.0) -> None:
        if retries < 0 or backoff < 0 or max_backoff < 0:
            raise ValueError(
                f'retries, backoff and max_backoff must be >= 0, got '
                f'{retries}, {backoff}, {max_backoff}')
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.retried = 0  # retries made by this process, for monitoring
        self._random = random.Random()

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        bound = min(self.max_backoff, self.backoff * (2**retry))
        return self._random.uniform(0.0, bound)

    def call(self,
             attempt: Callable[[], T],
             url: str,
             on_retry: Optional[Callable[[], None]] = None) -> T:
        """``attempt()``, retried on :class:`RetryableError`.

        Args:
            attempt: One try; raises ``RetryableError`` when worth retrying.
            url (str): Named in the final error.
            on_retry: Called before each retry (e.g. to rewind a file).

        Raises:
            RemoteUnavailableError: Every attempt failed retryably.
        """
        for retry in range(self.retries + 1):
            try:
                return attempt()
            except RetryableError as error:
                last = error
                if retry == self.retries:
                    break
            self.retried += 1
            time.sleep(self.delay(retry))
            if on_retry is not None:
                on_retry()
        raise RemoteUnavailableError(
            url, f'{last.reason}; gave up after {self.retries + 1} '
            f'attempt(s)') from last
