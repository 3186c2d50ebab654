"""Allocator checkpoints of a device pool: one implementation over each device's bindings.

``trees.memory.CheckpointedPool`` lets sibling branches of a tree share pool memory. It needs
the caching allocator to save and restore its bookkeeping of a pool, as upstream's CUDA Graph
Trees do, through five bindings in ``torch._C``. CUDA builds have had them since torch 2.0.
torch 2.15 lists the same five for XPU, with the same arguments, in its stubs
(``torch/_C/__init__.pyi``; pytorch#188259 proposed the first three); torch 2.11-2.14 have
none, and no XPU build was checked. What the checkpoint operations do is the same on either
device, so they are written once, here, over the bindings that ``BINDING_NAMES`` names for
the backend's device type.

A backend has checkpoints only where every one of its five bindings exists in the installed
torch (``AllocatorCheckpoints``); otherwise ``supports_pool_checkpoints`` stays False and the
tree keeps each graph's outputs allocated (``trees.memory.OwnedOutputs``), which needs no
allocator support. A binding missing, renamed or moved therefore costs memory, never
correctness. ``config.allocator_checkpointing=False`` turns checkpoints off where they exist.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class CheckpointBindings(NamedTuple):
    """A device's five allocator calls (as names in ``BINDING_NAMES``, as functions once
    found in ``torch._C``). Pools are named by their ``(int, int)`` id; storages by the
    address of their ``StorageImpl`` (``UntypedStorage._cdata``)."""

    #: ``(device index, pool id) -> state``: which blocks of the pool are allocated now.
    get_checkpoint_state: Any
    #: ``(device index, state, stale storages, storages to give deleters)``: make the pool's
    #: allocated blocks those of ``state``; the listed storages become the owners of the
    #: blocks this allocates, in order.
    set_checkpoint_pool_state: Any
    #: ``(device index, pool id, set of data pointers) -> bool``: the pool's live blocks are
    #: exactly these.
    check_pool_live_allocations: Any
    #: ``(storage) -> bool``: the storage frees its block through the allocator when it dies.
    has_standard_deleter: Any
    #: ``(storage)``: free the storage's block now; the storage no longer owns it.
    free_and_remove_deleter: Any


BINDING_NAMES: dict[str, CheckpointBindings] = {
    # torch/_C/__init__.pyi of every release this project supports (2.11-2.15), CUDA builds.
    "cuda": CheckpointBindings(
        get_checkpoint_state="_cuda_getCheckpointState",
        set_checkpoint_pool_state="_cuda_setCheckpointPoolState",
        check_pool_live_allocations="_cuda_checkPoolLiveAllocations",
        has_standard_deleter="_has_Standard_Deleter",
        free_and_remove_deleter="_free_And_Remove_DeleterFn",
    ),
    # torch 2.15's stubs (XPU builds); absent from 2.11-2.14. A name that differs in a real
    # XPU build leaves xpu with owned outputs.
    "xpu": CheckpointBindings(
        get_checkpoint_state="_xpu_getCheckpointState",
        set_checkpoint_pool_state="_xpu_setCheckpointPoolState",
        check_pool_live_allocations="_xpu_checkPoolLiveAllocations",
        has_standard_deleter="_xpu_has_standard_deleter",
        free_and_remove_deleter="_xpu_free_and_remove_deleter",
    ),
}


def checkpoint_bindings(device_type: str) -> CheckpointBindings | None:
    """The device's checkpoint bindings in the installed torch, or None unless all exist."""
    names = BINDING_NAMES.get(device_type)
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
