"""Node-local caches: one bounded store directory per node (see node_store)."""
from .node_store import (CacheBudgetError, NodeStore, Reservation, StoreEntry,
                         StoreUsage, default_cache_dir)
from .size_units import format_size, parse_size

__all__ = [
    'CacheBudgetError', 'NodeStore', 'Reservation', 'StoreEntry', 'StoreUsage',
    'default_cache_dir', 'format_size', 'parse_size'
]
