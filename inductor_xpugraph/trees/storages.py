"""Storages over memory someone else owns: how the runtime points tensors at graph memory.

A graph's memory is owned by one storage (or by nothing: ``trees.memory``); every other view
of it goes through a storage that does not own it, so that dropping that view frees nothing.
"""

from __future__ import annotations

import torch


def unowned(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A storage over the same memory that does not free it when it dies."""
    return torch._C._construct_storage_from_data_pointer(
        storage.data_ptr(), storage.device, storage.nbytes()
    )


def tensor_over(storage: torch.UntypedStorage, offset, size, stride, dtype) -> torch.Tensor:
    """A new tensor over ``storage`` with this layout."""
    return torch.empty((0,), dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


def alias_over(t: torch.Tensor, storage: torch.UntypedStorage) -> torch.Tensor:
    """A new tensor with ``t``'s layout over ``storage``."""
    return tensor_over(storage, t.storage_offset(), t.size(), t.stride(), t.dtype)
