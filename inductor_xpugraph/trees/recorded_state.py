"""The state a recording writes, and how the next request's state moves into its memory.

Note [State moved into a recording's memory]
--------------------------------------------
A graph writes state at fixed addresses: a cache's key and value tensors, its length
counter. Hugging Face's own compile path (``cache_implementation="static"``) makes a new
cache for every ``generate`` call, at new addresses, and drops it when the call returns; the
next call's cache has the same shapes. Recording every call again costs a capture per request
(and, for short requests, the thrash guard's fallback); upstream's trees record at every call.

Instead a recording keeps the *memory* of the state it writes (``RecordedState``): it holds
the storages, and the tensors only weakly. When the caller drops its state (the request's
cache dies), the memory stays the recording's, unused. When a later call passes new state
whose tensors are laid out as the dead ones were (same sizes, strides, offsets, dtypes,
storage sizes), and every other input matches the recording, the new state *moves in*
(``adopt``): each new storage's bytes are copied into the kept memory once, and each tensor
of the call over it is set to that memory in place (``Tensor.set_``: the same Python object,
so the cache that holds it sees the move). The recording then replays. One device copy of
the state per request instead of one capture; the new storage is freed.

Only what can be moved without anyone noticing is moved: a tensor that is not a view, not an
inference tensor, needs no gradient, and whose storage no tensor but the call's own
arguments uses (otherwise a view elsewhere would keep the old memory and the two would
diverge). Anything else records, as before (``GraphedCallable._decide_variant``).

The cost: a recording keeps the memory of its state after the caller dropped it, as long as
the recording lives (at most ``config.static_input_variants`` recordings per place), and a
second copy while the next request makes its state, before it moves in. For a long context
that is large: ``config.keep_state_memory = False`` frees the memory with the state, and new
state is recorded again (the recording it replaces is dropped). State that lives as long as
its owner (a model's buffers, an optimizer's moments) is kept no longer than its owner keeps
it. Parameters are never taken as state.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

# Counts the references to a storage: one per tensor over it, one per Python storage object.
_use_count = torch._C._storage_Use_Count


class _StateSlot:
    """One state input: its position, the caller's tensor (weakly), the storage (strongly:
    the recording's memory from now on) and the tensor's layout over it."""

    __slots__ = ("index", "tensor", "storage", "layout")

    def __init__(self, index: int, tensor: torch.Tensor) -> None:
        self.index = index
        self.tensor = weakref.ref(tensor)
        self.storage: torch.UntypedStorage = tensor.untyped_storage()
        self.layout = _layout(tensor)


class RecordedState:
    """The state inputs of one recording (Note [State moved into a recording's memory])."""

    __slots__ = ("_slots", "_tensors", "positions")

    def __init__(
        self, state_inputs: Sequence[tuple[int, torch.Tensor]], keep_memory: bool = True
    ) -> None:
        """``keep_memory`` (``config.keep_state_memory``): False holds the tensors weakly and
        nothing else: the memory is freed with them, and nothing can move in."""
        slots = tuple(_StateSlot(i, tensor) for i, tensor in state_inputs)
        self._slots = slots if keep_memory else ()
        self._tensors = tuple(slot.tensor for slot in slots)
        self.positions = frozenset(slot.index for slot in self._slots)

    def died(self) -> bool:
        """Whether the caller dropped some of the state (a cache made for one request)."""
        return any(ref() is None for ref in self._tensors)

    def laid_out_as(self, args: Sequence[Any]) -> bool:
        """Whether ``args`` hold, at every state position, a tensor laid out as the state is
        but over other memory: new state that could move in once this state died."""
        return bool(self._slots) and all(
            isinstance(arg := args[slot.index], torch.Tensor)
            and _layout(arg) == slot.layout
            and arg.untyped_storage()._cdata != slot.storage._cdata
            for slot in self._slots
        )

    def adoptable(self, args: Sequence[Any], moved: Sequence[int]) -> bool:
        """Whether the call's new state at ``moved`` (the positions whose address is not the
        recording's) can move into the kept memory: every state tensor died, ``moved`` are
        state positions, and each new tensor is laid out as the dead one was, over a storage
        of the same size that only the call's arguments use, no other tensor."""
        if not self._slots or not moved or not set(moved) <= self.positions:
            return False
        if any(slot.tensor() is not None for slot in self._slots):
            return False
        users: dict[int, int] = {}  # new storage -> the arguments over it
        for slot in self._slots:
            if slot.index not in moved:
                return False  # new state at the dead state's address: not ours to judge
            arg = args[slot.index]
            if not _movable(arg) or _layout(arg) != slot.layout:
                return False
            if _use_count(slot.storage._cdata) != 1:
                return False  # some other tensor still uses the kept memory
            cdata = arg.untyped_storage()._cdata
            users[cdata] = users.get(cdata, 0) + 1
        for slot in self._slots:
            storage = args[slot.index].untyped_storage()
            # The arguments over it, and ``storage`` itself: nothing else.
            if _use_count(storage._cdata) != users[storage._cdata] + 1:
                return False
        return True

    def adopt(self, args: Sequence[Any]) -> None:
        """Move the call's state into the kept memory (``adoptable`` said it can): one copy
        of each new storage, then each argument set to the kept memory, in place."""
        copied: set[int] = set()
        for slot in self._slots:
            arg = args[slot.index]
            storage = arg.untyped_storage()
            if storage._cdata not in copied:
                copied.add(storage._cdata)
                slot.storage.copy_(storage)
        for slot in self._slots:
            arg = args[slot.index]
            offset, size, stride, _, _ = slot.layout
            with torch.no_grad():
                arg.set_(slot.storage, offset, size, stride)
            slot.tensor = weakref.ref(arg)
        self._tensors = tuple(slot.tensor for slot in self._slots)


def _layout(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (
        tensor.storage_offset(),
        tensor.size(),
        tensor.stride(),
        tensor.dtype,
        tensor.untyped_storage().nbytes(),
    )


def _movable(tensor: Any) -> bool:
    """Whether ``tensor`` can be set to other memory in place without anyone noticing."""
    return (
        isinstance(tensor, torch.Tensor)
        and not isinstance(tensor, torch.nn.Parameter)
        and not tensor._is_view()
        and not tensor.requires_grad
        and not torch.is_inference(tensor)
    )
