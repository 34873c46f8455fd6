"""Downloads the plan reads once more and then drops: freed at that read.

A file the node's plan does not keep after its next read (a bypassed
sample, or a kept one whose last read is near) only has to stay on disk
until a DataLoader worker has read it. Waiting for the training loop to
pass its tick instead would hold every batch the DataLoaders read ahead --
``batch_size x workers x prefetch_factor x ranks`` samples -- out of the
budget the plan keeps samples in.

The prefetcher *marks* such a file (an empty file named by the entry's
digest in ``planner/once``); a reader that has read an entry moves its
mark, if any, to ``planner/read`` (one ``rename``, the only cost on the
read path); the prefetcher takes the moved marks and evicts those entries.
Only the prefetcher evicts, so a mark taken back before the read (the plan
changed its mind) never loses a file. A reader that did not find the file
reports its read even unmarked: it may be ahead of the plan, which then
downloads nothing for that read.
"""
import contextlib
import os
from typing import List


class ReadOnceMarks:
    """The marks of one node cache directory.

    Args:
        cache_dir (str): The node cache directory.
    """

    def __init__(self, cache_dir: str) -> None:
        self.once_dir = os.path.join(cache_dir, 'planner', 'once')
        self.read_dir = os.path.join(cache_dir, 'planner', 'read')

    def reset(self) -> None:
        """Drop every mark (a new prefetcher plans from scratch)."""
        for directory in (self.once_dir, self.read_dir):
            os.makedirs(directory, exist_ok=True)
            for name in os.listdir(directory):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))

    def mark(self, digest: str) -> None:
        """The entry ``digest`` may go once read."""
        os.close(
            os.open(
                os.path.join(self.once_dir, digest),
                os.O_CREAT | os.O_WRONLY, 0o644))

    def unmark(self, digest: str) -> None:
        """The entry must stay after its next read (read already or not)."""
        for directory in (self.once_dir, self.read_dir):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, digest))

    def report_read(self, digest: str, waited: bool = False) -> None:
        """A reader has read the entry ``digest``; ``waited``: it was not on
        disk when the reader looked (reported whether marked or not, so
        the plan learns of reads ahead of it)."""
        marked = os.path.join(self.once_dir, digest)
        read = os.path.join(self.read_dir, digest)
        try:
            os.rename(marked, read)
        except FileNotFoundError:
            if waited:
                with contextlib.suppress(FileNotFoundError):
                    os.close(os.open(read, os.O_CREAT | os.O_WRONLY, 0o644))

    def reported(self, digest: str) -> bool:
        """Whether a read of ``digest`` was reported and not taken yet."""
        return os.path.exists(os.path.join(self.read_dir, digest))

    def read_reports(self) -> List[str]:
        """Digests of the entries whose reads were reported and not
        forgotten yet (:meth:`forget_reports`)."""
        try:
            return os.listdir(self.read_dir)
        except FileNotFoundError:
            return []

    def forget_reports(self, digests: List[str]) -> None:
        """The plan has taken these reports: they stop being
        :meth:`reported` (a download process asks that)."""
        for name in digests:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.read_dir, name))
