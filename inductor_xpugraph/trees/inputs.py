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


class MovingStorages:
    """The storages a tree's static inputs were seen in, at the address each had last, and
    whether one was seen at two addresses: memory that moves under its tensor (see the module
    docstring). Fed on the slow path only (warmups and recordings), never on a replay."""

    def __init__(self) -> None:
        # Storage (its C++ object's address) -> [weak reference, address last seen, moved].
        self._seen: dict[int, list[Any]] = {}
        self._pruned_at = 0

    def note(self, args: Sequence[Any], positions: Sequence[int]) -> None:
        """Note where the tensors at ``positions`` lie now."""
        for i in positions:
            storage = args[i].untyped_storage()
            address = storage.data_ptr()
            if not address:  # no memory now (freed by resize_(0), or empty)
                continue
            entry = self._seen.get(storage._cdata)
            if entry is None or entry[0].expired():
                self._seen[storage._cdata] = [StorageWeakRef(storage), address, False]
            elif entry[1] != address:
                entry[1], entry[2] = address, True
        if len(self._seen) > 2 * self._pruned_at + 64:  # storages freed since: forget them
            self._seen = {k: v for k, v in self._seen.items() if not v[0].expired()}
            self._pruned_at = len(self._seen)

    def moved(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage was seen at another address before."""
        entry = self._seen.get(tensor.untyped_storage()._cdata)
        return entry is not None and entry[2] and not entry[0].expired()


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
