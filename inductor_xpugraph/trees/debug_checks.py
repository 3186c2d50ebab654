"""Opt-in debugging aids around graphed calls: a check that no graphed call changes an output
the caller still holds, and a device synchronization after each call.

The tree's memory design promises that a replay, a capture or a warmup never writes into
the memory of an output handed out earlier in the same generation while the caller holds
it (tree.py, "Memory"; Note [Retiring held outputs] covers the generation boundary). A bug
there is silent corruption, so this is the invariant worth checking directly, by value:
with ``config.debug_checks`` on when a graph is loaded, its callable is a
``CheckedGraphedCallable``. Before each call it copies every output of the tree's current
generation that is still alive (handed out by any checked callable on that tree), and after
the call it compares them bit for bit, and raises ``GraphMemoryOverwritten`` naming the
output, its producer and the callable that changed it.

Not compared: outputs of an earlier generation (a call that starts a generation retires
them: they raise or were copied out of the pool), outputs over the memory of an input that
this call mutates (a legal write), output objects that after the call only their recording
holds (nobody can read them: a backward reuses the memory of saved activations it consumed),
and what changes between calls (the user's own in-place ops, ``AccumulateGrad``). Outputs the
caller dropped are not seen, nor views of them.

The cost is a device copy and a comparison (a synchronization) per live output per call:
a debugging tool, off by default; the replay fast path of an unchecked callable is untouched.
Upstream's ``triton.fast_path_cudagraph_asserts`` switches it on too.

With upstream's ``triton.force_cudagraph_sync``, a callable synchronizes the device after
each call (``SynchronizedGraphedCallable``), so that a device error surfaces in the call that
caused it. ``graphify`` picks the class when a graph is loaded, from the settings baked into
it: a callable without these aids pays nothing for them.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch

from .. import config
from . import messages, stats
from .graphed_callable import GraphedCallable
from .per_thread import thread_trees, tree_for
from .recording_policy import RecordingSettings
from .tree import GraphTree


class GraphMemoryOverwritten(RuntimeError):
    """A graphed call changed an output that the caller held (a bug of ours: please report it
    with the model)."""


class _HandedOut(NamedTuple):
    producer: str
    position: int
    tensor: weakref.ref


# Per tree: (generation count when its list was started, what checked calls handed out).
_handed_out: weakref.WeakKeyDictionary[GraphTree, tuple[int, list[_HandedOut]]] = (
    weakref.WeakKeyDictionary()
)


class CheckedGraphedCallable(GraphedCallable):
    def __call__(self, args: list[Any]) -> Any:
        tree = thread_trees().get(self.device) or tree_for(self.device)
        generation, before = self._snapshot(tree, args)
        outputs = super().__call__(args)
        if tree.generations_started == generation:
            # Objects only a recording still holds are unreadable: their memory is free for
            # the step's later graphs (a backward reuses the saved activations it consumed).
            unreadable = {
                id(kept)
                for node in tree.generation.replayed_nodes
                for kept in node.recording.objects_only_kept_here()
            }
            stats.counters["outputs_checked"] += len(before)
            for entry, copy in before:
                tensor = entry.tensor()
                if id(tensor) not in unreadable and not _same_bits(tensor, copy):
                    raise GraphMemoryOverwritten(
                        messages.overwritten_output(entry.position, entry.producer, self.name)
                    )
        self._note(tree, outputs)
        return outputs

    def _snapshot(
        self, tree: GraphTree, args: list[Any]
    ) -> tuple[int, list[tuple[_HandedOut, torch.Tensor]]]:
        generation, entries = _handed_out.get(tree, (-1, []))
        if generation != tree.generations_started:
            return tree.generations_started, []
        written = {
            args[i].untyped_storage().data_ptr()
            for i in self.mutated_inputs
            if isinstance(args[i], torch.Tensor)
        }
        copies = []
        for entry in entries:
            tensor = entry.tensor()
            try:
                if not _readable(tensor) or tensor.untyped_storage().data_ptr() in written:
                    continue
                copies.append((entry, tensor.detach().clone()))
            except RuntimeError:  # made stale (a dropped recording's output): it raises
                continue
        return generation, copies

    def _note(self, tree: GraphTree, outputs: Any) -> None:
        generation, entries = _handed_out.get(tree, (-1, []))
        if generation != tree.generations_started:
            entries = []
            _handed_out[tree] = (tree.generations_started, entries)
        items = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        for position, out in enumerate(items):
            if isinstance(out, torch.Tensor) and out.layout is torch.strided:
                entries.append(_HandedOut(self.name, position, weakref.ref(out)))


class _SynchronizeAfterEachCall:
    device: str

    def __call__(self, args: list[Any]) -> Any:
        outputs = super().__call__(args)  # type: ignore[misc]
        tree_for(self.device).backend.synchronize()
        return outputs


class SynchronizedGraphedCallable(_SynchronizeAfterEachCall, GraphedCallable):
    """A ``GraphedCallable`` that synchronizes the device after each call."""


class SynchronizedCheckedGraphedCallable(_SynchronizeAfterEachCall, CheckedGraphedCallable):
    """A ``CheckedGraphedCallable`` that synchronizes the device after each call."""


def graphed_type(settings: RecordingSettings) -> type[GraphedCallable]:
    """The class of a graphed callable loaded with ``settings``: with the aids they ask for
    (``config.debug_checks`` is read now, at load)."""
    checked = config.debug_checks or settings.check_held_outputs
    if settings.sync_after_call:
        return SynchronizedCheckedGraphedCallable if checked else SynchronizedGraphedCallable
    return CheckedGraphedCallable if checked else GraphedCallable


def _same_bits(tensor: torch.Tensor | None, copy: torch.Tensor) -> bool:
    """Equal bit for bit (NaNs included); a tensor freed or made stale meanwhile counts as
    unchanged (it can no longer be read silently)."""
    if not _readable(tensor):
        return True
    try:
        as_bytes = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in (tensor, copy)]
    except RuntimeError:
        return True
    return tensor.shape == copy.shape and torch.equal(*as_bytes)


def _readable(tensor: torch.Tensor | None) -> bool:
    """Alive, and its storage still spans its elements: FSDP frees a gathered parameter (which
    a forward graph returns for its backward) by resizing its storage to nothing."""
    if tensor is None or tensor.numel() == 0:
        return tensor is not None
    extent = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    needed = (tensor.storage_offset() + extent) * tensor.element_size()
    return tensor.untyped_storage().nbytes() >= needed
