"""What the runtime and codegen know of each device type: one record per device, in one place.

A ``Device`` holds every fact about a device that code outside its backend's own module asks
for:

- ``unrecordable_ops``: the operators its graphs do not record, with why, and for which torch
  releases and recording modes (``unrecordable_ops`` reads the list in force);
- ``pool_calls``: its allocator's pool calls, which ``torch.accelerator.Graph`` lacks
  (``accelerator_graphs``);
- ``checkpoint_bindings``: the names of its allocator's five checkpoint bindings, where it can
  checkpoint a pool (``allocator_checkpoints``);
- ``empty_cache_after_pool_drop``, ``failure_leaves_host_routing``: how its allocator
  behaves around a dropped pool and a failed capture (``device_graphs`` says why each
  matters);
- for a stand-in, ``backend``, the backend that records and replays in the device's place,
  and ``stands_for``: where its operators have other names than those of the device it
  models, the operator each stands for (``config.allow_capture_ops`` takes either name).

Which backend a device itself uses is decided in one place, ``trees.backends.backend_class``:
it depends on ``config.xpu_graph_api`` and on what this torch has. The backend modules read
this record, so the record does not name them.

``device(device_type)`` gives the record in force. Something may stand in for a device type
for a while (``standing_in``): its record replaces the device's own for all of the above, and
is taken out after, whatever happens; ``inductor_xpugraph.sycl_rules.on_cpu`` puts the CPU
under SYCL Graph's rules this way. A device type without a record of its own (a PrivateUse1
backend) gets an empty one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .xpu_unrecordable_ops import XPU_UNRECORDABLE_OPS, Listed

if TYPE_CHECKING:
    from .base import GraphBackend


class PoolCalls(NamedTuple):
    """A device's own pool calls, as paths under ``torch``; None where it has none."""

    #: ``() -> pool id``: a new pool for a graph that needs one of its own.
    graph_pool_handle: str | None
    #: ``(device index, pool id)``: stop routing allocations into the pool; RuntimeError when
    #: the allocator does not route into it.
    end_allocate_to_pool: str | None
    #: ``(device index, pool id)``: give back a capture's hold on the pool.
    release_pool: str | None
    #: ``(device index, pool id)``: route this thread's allocations into the pool (warmups).
    begin_allocate_to_pool: str | None = None


NO_POOL_CALLS = PoolCalls(None, None, None)


class CheckpointBindings(NamedTuple):
    """A device's five allocator calls (as names in ``torch._C``, as functions once found
    there). Pools are named by their ``(int, int)`` id; storages by the address of their
    ``StorageImpl`` (``UntypedStorage._cdata``)."""

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


@dataclasses.dataclass(frozen=True)
class Device:
    """What one device type is to the package."""

    device_type: str
    #: Operator -> why its graphs do not record it (a ``Listed`` where that holds for some
    #: torch releases, recording modes or library versions only).
    unrecordable_ops: Mapping[str, str | Listed] = dataclasses.field(default_factory=dict)
    pool_calls: PoolCalls = NO_POOL_CALLS
    checkpoint_bindings: CheckpointBindings | None = None
    empty_cache_after_pool_drop: bool = False
    failure_leaves_host_routing: bool = False
    #: A stand-in's: the backend that records and replays in the device's place.
    backend: type[GraphBackend] | None = None
    #: A stand-in's: its operator -> the operator of the modelled device it stands for.
    stands_for: Mapping[str, str] = dataclasses.field(default_factory=dict)


def torch_release() -> tuple[int, int]:
    """The installed torch's (major, minor)."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


DEVICES: dict[str, Device] = {
    "xpu": Device(
        "xpu",
        unrecordable_ops=XPU_UNRECORDABLE_OPS,
        # Note [Pool routing after a failed capture].
        pool_calls=PoolCalls(
            graph_pool_handle="xpu.graph_pool_handle",
            end_allocate_to_pool="_C._xpu_endAllocateToPool",
            release_pool="_C._xpu_releasePool",
            begin_allocate_to_pool="_C._xpu_beginAllocateCurrentThreadToPool",
        ),
        # torch 2.15's stubs (XPU builds); absent from 2.11-2.14. A name that differs in a
        # real XPU build leaves xpu with owned outputs.
        checkpoint_bindings=CheckpointBindings(
            get_checkpoint_state="_xpu_getCheckpointState",
            set_checkpoint_pool_state="_xpu_setCheckpointPoolState",
            check_pool_live_allocations="_xpu_checkPoolLiveAllocations",
            has_standard_deleter="_xpu_has_standard_deleter",
            free_and_remove_deleter="_xpu_free_and_remove_deleter",
        ),
        empty_cache_after_pool_drop=True,
        # From torch 2.13, XPUGraph's capture_begin routes the host (pinned memory) allocator
        # into the pool too (Note [Recovering from a failed capture]).
        failure_leaves_host_routing=torch_release() >= (2, 13),
    ),
    "cuda": Device(
        "cuda",
        # torch/_C/__init__.pyi of every release this project supports (2.11-2.15), CUDA builds.
        checkpoint_bindings=CheckpointBindings(
            get_checkpoint_state="_cuda_getCheckpointState",
            set_checkpoint_pool_state="_cuda_setCheckpointPoolState",
            check_pool_live_allocations="_cuda_checkPoolLiveAllocations",
            has_standard_deleter="_has_Standard_Deleter",
            free_and_remove_deleter="_free_And_Remove_DeleterFn",
        ),
    ),
    "cpu": Device("cpu"),
}

_standing_in: dict[str, Device] = {}


def device(device_type: str) -> Device:
    """The record in force for ``device_type``: what stands in for it, else its own."""
    playing = _standing_in.get(device_type)
    if playing is not None:
        return playing
    known = DEVICES.get(device_type)
    return known if known is not None else Device(device_type)


def is_stood_in(device_type: str) -> bool:
    """Whether something stands in for ``device_type`` now."""
    return device_type in _standing_in


@contextlib.contextmanager
def standing_in(record: Device) -> Iterator[Device]:
    """``record`` is its ``device_type`` inside the block. One stand-in per device type at a
    time: a second raises, and the first stays in place."""
    if record.device_type in _standing_in:
        raise RuntimeError(
            f"something already stands in for {record.device_type!r}: leave its block first"
        )
    _standing_in[record.device_type] = record
    try:
        yield record
    finally:
        del _standing_in[record.device_type]
