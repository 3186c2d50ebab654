"""Tensors kept as state: outputs handed over once, then taken by address like parameters.

Note [Outputs kept as state]
----------------------------
Some outputs are not results but state: a tensor that compiled code makes and stores on an
object the caller keeps, and that later graphs write in place. A Hugging Face ``StaticCache``
makes its key and value tensors lazily, at its first update: inside the compiled prefill
(``torch.zeros`` there, then ``index_copy_``), so they are outputs of that graph (or of its
warmup), in the pool; every decode step then takes them as inputs and writes them. Running
statistics or optimizer state made inside compiled code are the same. Retired as results
(``handed_out``), they would go stale with the prefill's step and the cache would be dead.

They announce themselves, before anything is retired, in one of three ways (and a fourth,
below):

- the call that starts the next generation passes such an output at a position its callable
  writes. That call is where the generation ends, so the decision comes before anything is
  retired (``HandedOut.keep_mutated``);
- that call is a graph's first partition and a later partition writes it: the generated
  ``call`` tells the first partition which of its inputs the later ones write
  (``trees.keep_state_written_later``), a cache whose attention is partitioned out, say;
- a later call of the generation that made it writes it in place (a graph after a graph
  break): noted where that call warms up or records, never on a replay
  (``Generation.note_written``), and kept when the generation ends if the caller still holds it.

Each such output's memory is *handed over* instead of made stale, one device copy of its
block out of the pool, after which every tensor over it (the cache's own, views included)
keeps its values in memory of its own, and the graph keeps its pool memory. That happens once
per tensor: from then on it lies outside the pool, is never again an output of this tree, and
recordings take it where it lies, a static input by address (``KeptState``), as they take a
parameter. Nothing is copied per call, and nothing the caller holds goes stale silently.

Copying once is correct because nothing can write that memory in between: the generation
that made the tensor has ended and the new one has not run a graph yet. It costs one copy of
each tensor and, until the graph that made it is dropped, its memory twice (the pool keeps
the graph's copy; a warmup's copy goes back to the pool at once). An output that a later call
wrote but that is a temporary the caller happened to hold is copied too: at most at the few
generations that warm up or record, never at a replay.

A fourth way covers the tensor that no call writes in the generation that made it and that a
later generation first writes in a call other than its first (the graph after a graph
break): such state is made by the first call of the code that makes it, an un-graphed run,
whose held outputs stay readable through the next generation; the call that writes one keeps
it, and its position is remembered for the recordings of its callable (Note [Un-graphed
outputs go stale a generation late] in ``handed_out``).

It cannot cover such a tensor made by a recording whose callable never showed it to be state
in an un-graphed run: by then the new generation has started and may have overwritten it, so
it went stale. Where this runtime is the first to read it (``GraphedCallable``), the call
that writes it raises, once, naming the object that holds it and how to make it outside the
compiled code (``messages.stale_state``); the tensor is given zeros in memory of its own
first (``revive``) and kept from then on, so the object works again after its own reset (a
cache's ``reset()``) and the next request runs graphed. Where Dynamo compiles the graph after
the break for the first time, or Inductor checks the alignment of the inputs a graph writes
(on GPUs), they read it first: the plain stale-output error is what is raised there.

A tensor made outside compiled code and passed again at a position the graph writes (the
cache's length counter on the CPU, a running total) is state too: ``GraphedCallable`` takes
it by address from its second call. Upstream's trees take the lazily made cache as a
managed input of the decode graph, and the next generation overwrites it: the stale-output
error, or the process crashes (segmentation fault on an H100, torch 2.11); a mutated plain
input is never captured there.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import messages
from .source_lines import caller_source

# What every stale-output message starts with (the step's end, or a reset, dropped it).
STALE_MESSAGE_PREFIX = messages.STALE_OUTPUT[: messages.STALE_OUTPUT.index("{")]


class KeptState:
    """The storages handed over as state, by address. A storage that died leaves its entry
    (another tensor may get its address)."""

    def __init__(self) -> None:
        self._storages: dict[int, StorageWeakRef] = {}

    def keep(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        self._storages[storage.data_ptr()] = StorageWeakRef(storage)

    def __contains__(self, tensor: torch.Tensor) -> bool:
        if not self._storages:
            return False
        storage = tensor.untyped_storage()
        ref = self._storages.get(storage.data_ptr())
        if ref is None:
            return False
        if ref.expired() or ref.cdata != storage._cdata:
            del self._storages[storage.data_ptr()]
            return False
        return True


class PassedAgain:
    """Which of a callable's written positions hold the very tensor (storage) they held at
    its last call that was noted: state the caller keeps and passes again, which a recording
    takes where it lies (a replay writes it in place, as the plain call does). And which
    held a new tensor at this call and at the one before too (``new_twice``): state that the
    caller replaces at every call (beam search reorders its cache into new tensors), which a
    recording copies in and back (``Recording``'s written-back inputs)."""

    def __init__(self, positions: Sequence[int]) -> None:
        self.positions = tuple(positions)
        self._last: dict[int, StorageWeakRef] = {}
        self._new_last: frozenset[int] = frozenset()
        self.new_twice: frozenset[int] = frozenset()

    def note(self, args: Sequence[Any]) -> frozenset[int]:
        again = []
        new = []
        for i in self.positions:
            arg = args[i]
            if not isinstance(arg, torch.Tensor):
                continue
            now = StorageWeakRef(arg.untyped_storage())
            before = self._last.get(i)
            # A weak reference keeps the storage's C++ object allocated: the same ``cdata``
            # while it is alive is the same storage, never a new one at a reused address.
            if before is not None and before.cdata == now.cdata and not before.expired():
                again.append(i)
            elif before is not None:
                new.append(i)
            self._last[i] = now
        self.new_twice = self._new_last.intersection(new)
        self._new_last = frozenset(new)
        return frozenset(again)


def stale_state_error(
    args: Sequence[Any],
    positions: Sequence[int],
    keep: Callable[[torch.Tensor], None],
    graph: str,
    describe: Callable[[Sequence[int]], str],
) -> RuntimeError | None:
    """The error for the tensors at ``positions`` that went stale although they are state
    (see the module docstring), or None: each is given zeros of its own first and ``keep``
    is called on it. ``describe`` names positions for the message."""
    stale = stale_positions(args, positions)
    if not stale:
        return None
    holders = describe_holders(args[stale[0]])
    for i in stale:
        if revive(args[i]):
            keep(args[i])
    return RuntimeError(messages.stale_state(graph, describe(stale), holders, caller_source()))


def stale_positions(args: Sequence[Any], positions: Sequence[int]) -> list[int]:
    """The ``positions`` of ``args`` holding a tensor that retiring made stale."""
    return [i for i in positions if isinstance(args[i], torch.Tensor) and is_stale(args[i])]


def is_stale(tensor: torch.Tensor) -> bool:
    """Whether retiring made ``tensor`` stale (reading it raises the stale-output error)."""
    try:
        tensor.data_ptr()
    except RuntimeError as error:
        return str(error).startswith(STALE_MESSAGE_PREFIX)
    return False


def revive(tensor: torch.Tensor) -> bool:
    """Give a stale tensor zeros in memory of its own, in place (the same Python object, so
    every holder sees it); False where torch cannot swap it (a view, a tensor autograd saved)."""
    fresh = torch.empty_strided(
        tensor.size(), tensor.stride(), dtype=tensor.dtype, device=tensor.device
    ).zero_()
    try:
        torch.utils.swap_tensors(tensor, fresh)
    except RuntimeError:
        return False
    return True


def describe_holders(tensor: torch.Tensor, depth: int = 3) -> str:
    """Who keeps ``tensor``, for the message: ``held as `keys` by a StaticLayer, in `layers`
    of a StaticCache (transformers.cache_utils)``; an error path, so the garbage collector's
    referrers may be searched."""
    chain: list[str] = []
    target: Any = tensor
    for _ in range(depth):
        found = _owner_of(target)
        if found is None:
            break
        owner, attribute = found
        kind = type(owner)
        chain.append(f"`{attribute}` of a {kind.__qualname__}")
        target = owner
    if not chain:
        return "which no object of yours was found to hold"
    module = type(target).__module__
    return "held as " + ", in ".join(chain) + (f" ({module})" if module != "builtins" else "")


def _owner_of(target: Any, seen: set[int] | None = None, depth: int = 3) -> tuple[Any, str] | None:
    """An object whose attribute (or a list or tuple in one) is ``target``."""
    seen = set() if seen is None else seen
    referrers = gc.get_referrers(target)
    seen.update((id(target), id(referrers)))  # the list just made refers to ``target`` too
    for referrer in referrers:
        if id(referrer) in seen:
            continue
        if isinstance(referrer, dict):
            for owner in gc.get_referrers(referrer):
                if getattr(owner, "__dict__", None) is referrer:
                    name = next((k for k, v in referrer.items() if v is target), "?")
                    return owner, name
        elif isinstance(referrer, (list, tuple)):
            if depth > 1:
                found = _owner_of(referrer, seen, depth - 1)
                if found is not None:
                    return found
        elif not isinstance(referrer, type):  # an object whose attributes lie inline (3.11+)
            name = next(
                (k for k, v in getattr(referrer, "__dict__", {}).items() if v is target), None
            )
            if name is not None:
                return referrer, name
    return None
