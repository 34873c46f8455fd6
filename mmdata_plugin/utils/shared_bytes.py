"""uint8 tensors over whole storages, and storages born in shared memory."""
import torch

from .torch_internals import new_shared_storage


def storage_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """The whole of ``storage`` as a uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def new_shared_bytes(nbytes: int) -> torch.Tensor:
    """A uint8 tensor over a new shared-memory segment of ``nbytes``.

    torch's public ``share_memory_()`` moves an existing storage into shared
    memory by copying it (and a DataLoader worker's returned tensors are
    moved so); DataLoader's collate allocates its shared batches in shared
    memory from the start for the same reason.
    """
    return storage_bytes(new_shared_storage(nbytes))
