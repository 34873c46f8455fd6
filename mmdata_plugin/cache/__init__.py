"""Node-local caches: one bounded store directory per node (see node_store)."""
from .node_store import (CacheBudgetError, NodeStore, Reservation, StoreEntry,
                         StoreUsage)
from .size_units import format_size, parse_size

__all__ = [
    'CacheBudgetError', 'NodeStore', 'Reservation', 'StoreEntry', 'StoreUsage',
    'format_size', 'parse_size'
]
