"""Which source files a pipeline head can serve from its own entries.

A :class:`~mmdata_plugin.transforms.CachedPipelineHead` entry stands in
for reading its sample's image file. The node cache's prefetcher plans
downloads of files, and must not download a file the head will not read.
It cannot compute the head's key itself: the key holds the remote object's
ETag (a request per sample) and a digest of the sample's other inputs. So
the head leaves, per source path, a symbolic link to the entry it last
stored or served for that path; the link resolves while that entry is on
disk, and one ``stat`` tells the prefetcher. A miss links its source
before its transforms run, to the entry it is about to store: the file's
read is reported to the prefetcher before the entry exists, and a link
made only then would let the prefetcher plan the sample's next read as a
download in between. A dangling link counts for ``PRODUCING_SECONDS``
(the entry may still be coming), then not (it could not be stored, or
was evicted).

A link that resolves while the head would still miss (the object changed
under its URL, the sample's annotations changed, or two samples share the
file and the other one's entry is the linked one) costs an on-demand
download at the read, never a wrong sample: the head decides at the read
as before.
"""
import contextlib
import hashlib
import os
import time

#: Where the links live in the head's store directory, one folder per
#: head fingerprint (two heads of other transforms serve other entries).
SOURCES_DIR = 'head_sources'
#: Seconds a link to an entry not on disk yet counts: the entry is being
#: produced (a head's transforms take milliseconds, a loaded machine more).
PRODUCING_SECONDS = 10.0


class HeadSources:
    """Links ``source path -> head entry`` of one head, in its store.

    Args:
        cache_dir (str): The head's node store directory.
        fingerprint (str): The head's fingerprint (its transforms and
            storage settings).
    """

    def __init__(self, cache_dir: str, fingerprint: str) -> None:
        self.root = os.path.join(
            os.path.abspath(cache_dir), SOURCES_DIR, fingerprint[:16])

    def link_path(self, source: str) -> str:
        digest = hashlib.sha256(source.encode()).hexdigest()[:40]
        return os.path.join(self.root, digest[:2], digest)

    def record(self, source: str, entry_path: str,
               producing: bool = False) -> None:
        """Link ``source`` to the head entry at ``entry_path``; a link
        already there costs one ``readlink`` (and, when ``producing`` the
        entry now, one ``utime`` that makes it count as coming)."""
        link = self.link_path(source)
        target = os.path.relpath(entry_path, os.path.dirname(link))
        with contextlib.suppress(OSError):
            if os.readlink(link) == target:
                if producing:
                    os.utime(link, follow_symlinks=False)
                return
        os.makedirs(os.path.dirname(link), exist_ok=True)
        # Replaced in one rename: a reader sees the old link or the new.
        temporary = f'{link}.{os.getpid()}.tmp'
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        os.symlink(target, temporary)
        os.replace(temporary, link)

    def serves(self, source: str) -> bool:
        """Whether the head has an entry for ``source`` on disk, or is
        producing one."""
        link = self.link_path(source)
        try:
            os.stat(link)
            return True
        except FileNotFoundError:
            pass
        try:
            return time.time() - os.lstat(link).st_mtime < PRODUCING_SECONDS
        except FileNotFoundError:
            return False
