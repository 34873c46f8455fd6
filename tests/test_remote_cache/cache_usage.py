"""What a node-cache training test runs with, and what the cache holds
while it goes on."""
import os
import threading

from mmdata_plugin.cache.node_store import MARKER, NodeStore


def run_env(base_env, srv, tmp):
    """Environment of a training run reading from ``srv`` (the demo's
    remote configs), with its index and fetched files under ``tmp``."""
    return dict(
        base_env,
        MMDATA_REMOTE_ROOT=srv.base_url,
        MMDATA_REMOTE_FILES_DIR=str(tmp / 'remote_files'),
        MMDATA_INDEX_DIR=str(tmp / 'index'))


def disk_bytes(cache_dir):
    """Bytes of entries and temp files in the cache directory now."""
    total = 0
    for sub in ('entries', 'tmp'):
        for directory, _, names in os.walk(os.path.join(cache_dir, sub)):
            for name in names:
                try:
                    total += os.path.getsize(os.path.join(directory, name))
                except FileNotFoundError:
                    pass
    return total


class UsageSampler(threading.Thread):
    """Peak of the store's committed + in-flight bytes while a run goes on
    (the ledger's one snapshot; a directory walk is not atomic). A context
    manager: sampling runs inside the block."""

    def __init__(self, cache_dir, limit):
        super().__init__(daemon=True)
        self.cache_dir, self.limit, self.peak = cache_dir, limit, 0
        self.done = threading.Event()

    def run(self):
        store = None
        while not self.done.wait(0.01):
            if store is None:
                if not os.path.exists(os.path.join(self.cache_dir, MARKER)):
                    continue
                store = NodeStore(self.cache_dir, self.limit)
            usage = store.usage()
            self.peak = max(self.peak,
                            usage.committed_bytes + usage.inflight_bytes)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join()
