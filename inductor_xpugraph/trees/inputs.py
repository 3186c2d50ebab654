"""How a recording takes its inputs, decided once at record time.

A tensor input is either *static*, read where it lies (a parameter, a buffer, an output of an
earlier graph of the path: ``StaticInput``), so that a replay needs it at the same address; or
*copied*: the capture reads it from a buffer of its own in the pool (``InputBuffers``), and
each replay copies the caller's tensor into that buffer first (``input_copier``, specialised
for what the graph has). ``input_identity`` tells one set of static inputs from another: two
calls with the same identity can replay the same recording.

A static input whose memory moves under it is copied instead (``MovingStorages``): the same
storage object at a new address is memory given back and taken again in place
(``untyped_storage().resize_()``), as FSDP2 frees each layer's gathered parameters after use
and gathers them again at the next step, wherever the allocator puts them. Read where it lies,
such an input would be recorded again at nearly every step; copied, one recording replays at
every step, for one device copy of it per replay. A parameter replaced by a new tensor (a
model loaded again, another parameter set) is a new storage: it is recorded again, as a
*variant*, and the thrash guard (``recording_policy``) counts it.

Memory that moved once often settles: the caching allocator hands FSDP2 the same blocks at
every step once the optimizer's state exists (created by the first step, after the warmup,
which is why the gathers lie elsewhere at the record). A recording that copies such inputs
watches them (``SettlingWatch``): when they lie at the record's addresses for its first
``SETTLE_REPLAYS`` replays, their storages are noted as *settled* there, and the recording
stops matching, so that the next call records one that reads them where they lie, copying
nothing (where a capture can replace it: ``decision``). Memory seen moving after the record
is copied for good. A capture changes which blocks the allocator has free, so the gathers
may lie elsewhere after it, and a capture that replaced the recording would move them again:
on an H200, a transformer's gathers move once or twice after the record, then stay put;
waiting for that and replacing each graph makes 35 records in 10 steps instead of 12, each
replacement moving them once more. A graph may read one storage at several addresses
(FSDP2 gathers again for the backward, perhaps elsewhere): each is noted. A storage seen off
every address where it settled is *restless*: copied from then on, never watched again, so
memory that settles and then moves costs two more records of a graph, no more.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import messages
from .storages import alias_over, unowned


class StaticInput(NamedTuple):
    """A tensor input a replay does not copy, as it was at capture: a parameter, a buffer, an
    output of an earlier graph of the path. A replay needs it at the same address."""

    index: int  # argument position
    address: int  # data_ptr()
    storage_address: int  # untyped_storage().data_ptr(): tells which path block it lies in

    @classmethod
    def of(cls, args: Sequence[Any], index: int) -> StaticInput:
        tensor = args[index]
        return cls(index, tensor.data_ptr(), tensor.untyped_storage().data_ptr())


def input_identity(
    args: Sequence[Any], static_indices: Sequence[int], object_indices: Sequence[int]
) -> tuple[int, ...]:
    """The addresses of the static tensors and the identities of the object inputs: two
    calls with the same identity can replay the same recording."""
    return tuple(args[i].data_ptr() for i in static_indices) + tuple(
        id(args[i]) for i in object_indices
    )


# Replays at the record's addresses after which copied inputs whose memory moved before the
# record count as settled there (the record's own replay included): enough to see FSDP2's
# allocator settle, few enough that a training loop copies for two more steps.
SETTLE_REPLAYS = 3


class _Seen:
    """What ``MovingStorages`` knows of one storage."""

    __slots__ = ("ref", "address", "moved", "settled_at", "restless")

    def __init__(self, storage: torch.UntypedStorage, address: int) -> None:
        self.ref = StorageWeakRef(storage)
        self.address = address  # where it lay last
        self.moved = False  # seen at two addresses
        self.settled_at: frozenset[int] = frozenset()  # where replays saw it stay
        self.restless = False  # seen off every address where it settled


class MovingStorages:
    """The storages a tree's static inputs were seen in, at the address each had last, and
    whether one was seen at two addresses: memory that moves under its tensor; and where
    such memory settled, or whether it is restless (see the module docstring). Fed on the
    slow path (warmups and recordings), and by the ``SettlingWatch`` of a recording that
    copies moving memory; never by any other replay."""

    def __init__(self) -> None:
        # Storage (its C++ object's address) -> what is known of it.
        self._seen: dict[int, _Seen] = {}
        self._pruned_at = 0

    def note(self, args: Sequence[Any], positions: Sequence[int]) -> None:
        """Note where the tensors at ``positions`` lie now."""
        for i in positions:
            storage = args[i].untyped_storage()
            address = storage.data_ptr()
            if not address:  # no memory now (freed by resize_(0), or empty)
                continue
            seen = self._seen.get(storage._cdata)
            if seen is None or seen.ref.expired():
                self._seen[storage._cdata] = _Seen(storage, address)
                continue
            if seen.address != address:
                seen.address, seen.moved = address, True
            if seen.settled_at and address not in seen.settled_at:
                seen.settled_at, seen.restless = frozenset(), True
        if len(self._seen) > 2 * self._pruned_at + 64:
            self.forget_freed()

    def forget_freed(self) -> None:
        """Forget the storages freed since they were seen."""
        self._seen = {k: v for k, v in self._seen.items() if not v.ref.expired()}
        self._pruned_at = len(self._seen)

    def _entry(self, tensor: torch.Tensor) -> _Seen | None:
        seen = self._seen.get(tensor.untyped_storage()._cdata)
        return None if seen is None or seen.ref.expired() else seen

    def moved(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage was seen at another address before, and does not lie
        where it settled."""
        seen = self._entry(tensor)
        return (
            seen is not None
            and seen.moved
            and tensor.untyped_storage().data_ptr() not in seen.settled_at
        )

    def may_settle(self, tensor: torch.Tensor) -> bool:
        """Whether a recording that copies ``tensor`` should watch it settle: it is not
        restless."""
        seen = self._entry(tensor)
        return seen is None or not seen.restless

    def settle(self, tensors: Sequence[torch.Tensor]) -> None:
        """Note that ``tensors`` stayed where they lie for ``SETTLE_REPLAYS`` replays."""
        for tensor in tensors:
            seen = self._entry(tensor)
            if seen is not None and not seen.restless:
                address = tensor.untyped_storage().data_ptr()
                seen.address, seen.settled_at = address, seen.settled_at | {address}


class SettlingWatch:
    """Called at each replay of a recording that copies inputs whose memory moves, before the
    copy, from the record's own replay on: when ``indices`` lay at the same addresses for the
    first ``SETTLE_REPLAYS`` replays, it notes them settled there (``MovingStorages.settle``)
    and calls ``on_settled``. Memory seen moving after the record keeps moving: the watch
    stops at the first move, and at the settling, and costs nothing after that."""

    __slots__ = ("_indices", "_storages", "_on_settled", "_addresses", "_replays", "moved")

    def __init__(
        self, indices: Sequence[int], storages: MovingStorages, on_settled: Callable[[], None]
    ) -> None:
        self._indices = tuple(indices)
        self._storages = storages
        self._on_settled: Callable[[], None] | None = on_settled
        self._addresses: tuple[int, ...] | None = None  # at the record's replay
        self._replays = 0
        self.moved = False  # seen moving after the record: copied for good

    def __call__(self, args: Sequence[Any]) -> None:
        if self._on_settled is None:
            return
        addresses = tuple([args[i].data_ptr() for i in self._indices])
        if self._addresses is None:
            self._addresses = addresses
        elif addresses != self._addresses:
            self._on_settled, self.moved = None, True
            return
        self._replays += 1
        if self._replays == SETTLE_REPLAYS:
            self._storages.settle([args[i] for i in self._indices])
            on_settled, self._on_settled = self._on_settled, None
            on_settled()


class InputBuffers:
    """Places a capture's copied inputs in its pool: the static buffers replays copy into.

    Called inside the capture, before the captured callable (``GraphBackend.capture``): each
    copied input in ``args`` is replaced by a new tensor of its layout, allocated where the
    capture allocates. The graph then owns that memory like its scratch: the captured code
    frees it after its last use, unless an output keeps it (a forward returns its input
    batch, saved for the backward; the backward may consume it). ``views`` are tensors over
    the buffers that do not keep them allocated, in the order of ``indices``.

    ``copy_values``: for a capture that executes what it captures (the CPU emulator's), so
    that the callable never reads garbage; a stream capture executes nothing (a copy would
    only be captured into the graph).
    """

    def __init__(self, indices: Sequence[int], copy_values: bool) -> None:
        self.indices = indices
        self.copy_values = copy_values
        self.views: list[torch.Tensor] = []
        # The buffers' own storages, held weakly: an output is over a buffer only if it
        # shares that storage object. (An address says nothing: a buffer the captured code
        # freed after its last use may lie under a later output of the same capture.)
        self._storages: list[StorageWeakRef] = []

    def __call__(self, args: list[Any]) -> None:
        for i in self.indices:
            arg = args[i]
            buffer = torch.empty_strided(
                arg.size(), arg.stride(), dtype=arg.dtype, device=arg.device
            )
            if self.copy_values:
                writable_view(buffer).copy_(writable_view(arg))
            self.views.append(alias_over(buffer, unowned(buffer.untyped_storage())))
            self._storages.append(StorageWeakRef(buffer.untyped_storage()))
            args[i] = buffer

    def still_referenced(self, indices: Sequence[int]) -> dict[int, int]:
        """The buffers of the inputs at ``indices`` that something still references after the
        capture (an output over one of them): storage object (``_cdata``) -> input index."""
        return {
            ref.cdata: i
            for i, ref in zip(self.indices, self._storages)
            if i in indices and not ref.expired()
        }


# The per-replay input copy is specialised once, at record time, for what the graph has:
# most graphs have zero or one copied input, and a replay of ``x + 1`` is dominated by this
# Python (measured by ``benchmarks/latency.py --breakdown``).


def input_copier(
    indices: tuple[int, ...], targets: list[torch.Tensor], expanded: list[bool]
) -> Callable[[Sequence[Any]], Any]:
    if not indices:
        return _no_inputs_to_copy
    if len(indices) == 1 and not expanded[0]:
        (index,), (target,) = indices, targets
        return lambda args: target.copy_(args[index])
    if not any(expanded):
        return lambda args: torch._foreach_copy_(targets, [args[i] for i in indices])

    def copy_expanded(args: Sequence[Any]) -> None:
        sources = [
            writable_view(args[i]) if is_expanded else args[i]
            for i, is_expanded in zip(indices, expanded)
        ]
        torch._foreach_copy_(targets, sources)  # one batched launch for all inputs

    return copy_expanded


def _no_inputs_to_copy(args: Sequence[Any]) -> None:
    pass


def writable_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` narrowed to one element along each expanded (stride 0) dimension."""
    for dim, (size, stride) in enumerate(zip(t.size(), t.stride())):
        if stride == 0 and size > 1:
            t = t.narrow(dim, 0, 1)
    return t


# The file of the user's line that ends an input's name (``... at <path>:<line> in <function>``).
_SOURCE_PATH = re.compile(r"(?<= at )(?P<path>.+?)(?=:\d+ in )")


def _with_short_path(name: str) -> str:
    """``name`` with an absolute path to its source file cut to the file's name: a file
    outside the working directory (the source lines keep the path of one below it relative),
    mostly a library's (``/opt/venv/lib/python3.12/site-packages/transformers/cache_utils.py``
    is ``cache_utils.py``), whose directories would be most of a message listing inputs."""

    def shortened(source: re.Match) -> str:
        path = source["path"]
        return os.path.basename(path) if os.path.isabs(path) else path

    return _SOURCE_PATH.sub(shortened, name, count=1)


class InputNames:
    """What a callable's static, mutated and object inputs are, by position (placeholder and
    first use; codegen provides them), for the messages about them."""

    def __init__(self, names: Mapping[int, str]) -> None:
        self.names = dict(names)

    def describe(self, positions: Sequence[int], shown: int = 4) -> str:
        """``input 3 (arg3_1, read by L['self'].head (Linear) at model.py:20 in forward)``
        (the first ``shown`` of them, and how many more; a source file outside the working
        directory by its name alone)."""
        parts = [
            f"{i} ({_with_short_path(self.names[i])})" if i in self.names else f"{i}"
            for i in positions
        ]
        more = f" and {len(parts) - shown} more" if len(parts) > shown else ""
        return ("input " if len(parts) == 1 else "inputs ") + ", ".join(parts[:shown]) + more

    def changed(self, moved: list[int], replaced: list[int]) -> str:
        """Which non-copied inputs moved, and which were replaced, since the capture."""
        return messages.moved_and_replaced(
            self.describe(moved) if moved else None,
            self.describe(replaced) if replaced else None,
        )
