"""Allocator checkpoints of a device pool: one implementation over each device's bindings.

``trees.memory.CheckpointedPool`` lets sibling branches of a tree share pool memory. It needs
the caching allocator to save and restore its bookkeeping of a pool, as upstream's CUDA Graph
Trees do, through five bindings in ``torch._C``. CUDA builds have had them since torch 2.0.
torch 2.15 lists the same five for XPU, with the same arguments, in its stubs
(``torch/_C/__init__.pyi``; pytorch#188259 proposed the first three); torch 2.11-2.14 have
none, and no XPU build was checked. What the checkpoint operations do is the same on either
device, so they are written once, here, over the bindings that the device's record names
(``devices.Device.checkpoint_bindings``).

A backend has checkpoints only where every one of its five bindings exists in the installed
torch (``AllocatorCheckpoints``); otherwise ``supports_pool_checkpoints`` stays False and the
tree keeps each graph's outputs allocated (``trees.memory.OwnedOutputs``), which needs no
allocator support. A binding missing, renamed or moved therefore costs memory, never
correctness. ``config.allocator_checkpointing=False`` turns checkpoints off where they exist.
"""

from __future__ import annotations

from typing import Any

import torch

from .devices import CheckpointBindings, device


def checkpoint_bindings(device_type: str) -> CheckpointBindings | None:
    """The device's checkpoint bindings in the installed torch, or None unless all exist."""
    names = device(device_type).checkpoint_bindings
    if names is None:
        return None
    found = [getattr(torch._C, name, None) for name in names]
    if any(binding is None for binding in found):
        return None
    return CheckpointBindings(*found)


class AllocatorCheckpoints:
    """The checkpoint operations of ``GraphBackend`` over the bindings of the backend's
    ``device_type``. A mixin, listed before the backend's base class; pools are
    ``device_graphs.DevicePool``s. Found once, when the backend is made."""

    device_type: str
    device_index: int

    def __init__(self, device_index: int) -> None:
        super().__init__(device_index)  # type: ignore[call-arg]
        self.checkpoint_bindings = checkpoint_bindings(self.device_type)
        self.supports_pool_checkpoints = self.checkpoint_bindings is not None

    def checkpoint_pool(self, pool: Any) -> Any:
        return self.checkpoint_bindings.get_checkpoint_state(self.device_index, pool.handle)

    def restore_pool(self, pool: Any, checkpoint: Any, new_owners: list[Any]) -> None:
        bindings = self.checkpoint_bindings
        stale_storages: list[int] = []  # nothing allocated now is missing from the checkpoint
        owners = [storage._cdata for storage in new_owners]
        bindings.set_checkpoint_pool_state(self.device_index, checkpoint, stale_storages, owners)
        if not all(bindings.has_standard_deleter(owner) for owner in owners):
            raise RuntimeError(
                f"inductor_xpugraph internal error: restoring a {self.device_type} pool "
                "checkpoint did not re-allocate the outputs of the graphs on the path"
            )

    def free_storages(self, storages: list[Any]) -> None:
        for storage in storages:
            self.checkpoint_bindings.free_and_remove_deleter(storage._cdata)

    def pool_holds_exactly(self, pool: Any, storages: list[Any]) -> bool:
        ptrs = {storage.data_ptr() for storage in storages}
        return self.checkpoint_bindings.check_pool_live_allocations(
            self.device_index, pool.handle, ptrs
        )
