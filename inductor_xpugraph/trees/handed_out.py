"""What one generation hands out, and how it is retired when the generation ends.

Note [Retiring held outputs]
----------------------------
When a generation ends, the graph memory it handed out is about to be overwritten by the
next replays. No tensor may read it silently afterwards, whatever route reached it: the
output object itself, a view, ``.data``, ``detach()``, a tensor an autograd.Function saved,
optimizer state built from it, or the ``.grad`` that autograd *stole* from a gradient (when a
parameter's ``.grad`` is None, ``AccumulateGrad`` keeps the incoming gradient itself, without
a copy). All of them share one storage object per block of memory (``OutputBlock``), so one
reference count, and the reference counts of the output objects the recordings hand out
again while nobody holds them (``recording``), tell whether the caller still uses a block.
``GraphTree.retire_handed_out``:

1. makes each output object of a forward or inference graph that the caller still holds
   raise the stale-output error, and gives its position a new object. This drops its
   reference to the memory: the usual ``out = f(x)`` loop ends here, at the cost of one call
   per held output. Output objects of un-graphed runs (warmups) go stale one generation
   later (Note [Un-graphed outputs go stale a generation late]);
2. retires every block handed out in the generation that is still referenced some other
   way, or whose output object the caller holds (a gradient, which step 1 keeps). Its
   storage object leaves with the caller's tensors and the graph continues with a
   new one over the same memory (``OutputBlock.retire_stale``, ``recording.hand_over``; each
   recording with outputs over retired blocks rebuilds them once):
   - a block of a **backward** graph holds gradients: it is *handed over*, its storage
     object given a copy of the data outside the pool (``copy_out_of_pool``). Gradient
     accumulation (a backward per micro-batch, one optimizer step), ``zero_grad(
     set_to_none=False)`` and gradients kept from ``torch.autograd.grad`` therefore give
     eager's values while graphs replay. The cost is one device copy of each gradient kept
     past its step, once per step (``stats()["handovers"]``); with ``zero_grad()`` before
     the next forward nothing is kept and nothing is copied;
   - so is every block of a graph compiled with ``config.generation_cloning`` (upstream's
     ``triton.cudagraph_trees_generation_cloning = "user_visible"``), whose held output
     objects step 1 keeps too, as are its un-graphed outputs: outputs kept past their step
     keep their values, at the price of that copy;
   - any other block is made stale at the storage level (``storage_invalidator``), so every
     tensor over it raises the stale-output error, views included, as upstream's do.
   Without a way to invalidate (no binding, no extension), every block is handed over:
   correct, at the price of a copy; without a way to hand over (torch 2.11 and no
   extension), gradients are made stale like the rest: loud, as upstream's trees are.
``reset()`` retires the same way (the message says that reset dropped the output), and makes
every un-graphed output stale at once.

Note [Un-graphed outputs go stale a generation late]
----------------------------------------------------
State that compiled code makes shows itself only when a later call writes it (Note [Outputs
kept as state] in ``kept_state``). When that call is not the first of the next generation
(a graph after a graph break: a decoder layer's hook, a cache made by one graph and first
written by the graph after a break, an encoder-decoder whose cross-attention cache one
decoder step makes and later steps only read), retiring at the generation's end would make
it stale before the call that writes it: Dynamo, compiling that call, reads it first.

Such state is made by the first call of the code that makes it, and a first call is a
warmup: an un-graphed run. So the output objects of un-graphed runs that the caller still
holds when their generation ends are not made stale then: their memory leaves the pool with
the warmups' other held memory (``WarmupOutputs.hand_over``, before any graph runs), and they
are carried through the next generation (``Generation.carried``). A call of that generation
that writes one keeps it as state (``Generation.take_carried``); the others go stale when it
ends, and the position of the output it was is remembered for its callable: when a recording
of that callable makes such state again (a cache made per request, where graph breaks split
the step), the caller's tensor there is kept when its generation ends
(``HandedOut.keep_outputs``). Nothing a graph replays over is read: a carried output lies
outside the pool. The cost is one copy of each held warmup output, at the few generations
that warm up; a graph's outputs (replays) go stale at their generation's end as before. Code
that reads a result of the step before therefore fails at the second step of a warmup rather
than the first.

Note [Outputs passed back in]
-----------------------------
A loop that feeds a step's output into the next step (``state = step(state)``: a recurrent
cell, an ODE or diffusion integrator, a decode loop that passes its cache back, an
encoder-decoder whose first decoder step makes the cross-attention keys and values that every
later step reads) hands the generation's first call an output that retiring is about to make
stale. Nothing has overwritten it yet, but the new generation's replays may (sibling branches
share memory). So before anything is retired, each such argument of that call is noted
(``HandedOut.keep_passed_back``) and its memory is handed over when the generation is retired,
before any graph of the new one runs: one device copy out of the pool, after which the
caller's tensor (the same object, views included) keeps its value in memory of its own and
the call reads it there. One copy per step and output passed back, as eager makes none; the
caller may go on reading it, or pass it to any later step, as in eager. Positions the callable
mutates are handed over too, and kept as state from then on (Note [Outputs kept as state] in
``kept_state``). Where memory cannot be handed over (torch 2.11 without the compiled module,
or inside someone else's capture), the call reads a copy made for it alone, and the caller's
tensor goes stale as usual (``copy_passed_back``).
An output passed to any later call of the new generation, but not to its first, raises: the
generation's replays may have overwritten it. Upstream's trees raise when such a call warms up
or records (``try_end_curr_warmup`` and ``try_end_curr_recording`` invalidate the path's
outputs first).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import messages, stats
from .invalidation import can_copy_out_of_pool, storage_invalidator, tensor_invalidator
from .kept_state import is_stale
from .node import CallableIdentity, GraphNode, Phase
from .recording import OutputBlock, Recording, hand_over
from .storages import tensor_over


class HandedOut:
    """What one generation handed to the caller: the nodes that ran, in order and each once
    (their output objects are their recordings'), and the outputs of its un-graphed runs, as
    (callable identity, weak references to its outputs) pairs."""

    __slots__ = (
        "nodes",
        "eager_outputs",
        "carried",
        "kept",
        "kept_tensors",
        "written",
        "keep_held",
    )

    def __init__(
        self,
        nodes: list[GraphNode],
        eager_outputs: list[tuple[CallableIdentity, list[weakref.ref]]],
        written: list[tuple[weakref.ref, int]] | None = None,
        carried: list[tuple[CallableIdentity, list[weakref.ref]]] | None = None,
    ) -> None:
        self.nodes = nodes
        self.eager_outputs = eager_outputs
        # Un-graphed outputs of the generation before, carried through this one and not
        # written by it: they go stale now (Note [Un-graphed outputs go stale a generation
        # late]).
        self.carried = carried or []
        # Outputs that a later call of the generation wrote in place, with their storage
        # addresses then (``Generation.note_written``).
        self.written = written or []
        # Storage addresses of the outputs handed over rather than made stale: those, and
        # ``keep_mutated``'s and ``keep_passed_back``'s.
        self.kept: set[int] = {address for _, address in self.written}
        self.kept_tensors: list[torch.Tensor] = []  # ``keep_mutated``'s
        # Everything the caller holds is handed over, not made stale: the caller keeps
        # outputs across steps (``keep_what_the_caller_keeps``).
        self.keep_held = False

    def keep_mutated(self, tensors: Sequence[Any]) -> None:
        """Note [Outputs kept as state]: those of ``tensors`` (the call that starts the next
        generation writes them) that are outputs of this generation about to go stale; their
        memory is handed over when it is retired, instead of made stale."""
        if not self.nodes and not self.eager_outputs:
            return
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and self.goes_stale(tensor):
                self.kept.add(tensor.untyped_storage().data_ptr())
                self.kept_tensors.append(tensor)

    def keep_outputs(self, recording: Recording, positions: set[int]) -> None:
        """Note [Outputs kept as state]: the outputs of ``recording`` at ``positions`` that
        the caller holds are state (found so at an un-graphed run of its callable): handed
        over when this is retired, and kept."""
        for i in recording.held_positions():
            if i in positions:
                output = recording.output_object(i)
                self.kept.add(output.untyped_storage().data_ptr())
                self.kept_tensors.append(output)

    def keep_passed_back(self, args: list[Any], positions: Sequence[int]) -> None:
        """Note [Outputs passed back in]: those tensors of ``args`` at ``positions`` that are
        about to go stale are handed over when this is retired, instead of made stale; call
        only where memory can be copied out of the pool now (``can_copy_out_of_pool``, no
        capture under way)."""
        for i in positions:
            arg = args[i]
            if self.goes_stale(arg):
                self.kept.add(arg.untyped_storage().data_ptr())

    def copy_passed_back(self, args: list[Any], positions: Sequence[int]) -> None:
        """Replace each tensor of ``args`` at ``positions`` that is about to go stale (in an
        output block of a forward or inference graph, or an un-graphed output, of this
        generation) by a tensor of the same layout over a copy of its memory, for this call
        alone: where memory cannot be handed over (Note [Outputs passed back in]). Arguments
        that shared memory share the copy."""
        copies: dict[int, torch.UntypedStorage] = {}
        for i in positions:
            arg = args[i]
            if not self.goes_stale(arg):
                continue
            storage = arg.untyped_storage()
            address = storage.data_ptr()
            copy = copies.get(address)
            if copy is None:
                copy = copies[address] = storage.clone()
            args[i] = tensor_over(copy, arg.storage_offset(), arg.size(), arg.stride(), arg.dtype)

    def kept_state(self) -> list[torch.Tensor]:
        """The tensors kept as state (``keep_mutated``, ``written``) that retiring handed over
        (out of the pool now: unless no copy could be queued, which made them stale), each
        once. Call after ``retire`` and the warmups' hand-over."""
        kept = dict.fromkeys(self.kept_tensors)  # (two positions may hold one tensor)
        for ref, address in self.written:
            tensor = ref()
            if tensor is not None and not is_stale(tensor):
                if tensor.untyped_storage().data_ptr() != address:  # moved out of the pool
                    kept[tensor] = None
        return [tensor for tensor in kept if not is_stale(tensor)]

    def goes_stale(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lies in memory this generation handed out, which retiring makes
        stale (gradients and cloned outputs are handed over instead)."""
        address = tensor.data_ptr()
        for node in self.nodes:
            if _hands_over(node) or not node.recording.may_hold(address):
                continue
            return True
        storage = tensor.untyped_storage()
        for producer, refs in self.eager_outputs:
            if producer.clones_live_outputs:
                continue
            for ref in refs:
                out = ref()
                if out is not None and out.untyped_storage().data_ptr() == storage.data_ptr():
                    return True
        return False

    def keep_what_the_caller_keeps(self, caller_keeps: Callable[[], bool]) -> None:
        """Hand over everything the caller holds when this is retired if ``caller_keeps()``
        (Note [What generate keeps]), asked only when the caller holds something: an
        output object, a view of one (a cache ``crop`` sliced), an un-graphed output."""
        for node in self.nodes:  # a loop, not any(): this runs at every generation
            if node.recording.memory_referenced():  # an output object, or a view of one
                break
        else:  # un-graphed outputs: this generation's, and those carried through it
            un_graphed = (*self.eager_outputs, *self.carried)
            if not any(ref() is not None for _, refs in un_graphed for ref in refs):
                return
        self.keep_held = caller_keeps()

    def may_copy(self) -> bool:
        """Whether retiring it may copy memory out of the pool (``hand_over``): gradients
        are handed over, and every block is when storages cannot be made stale, or when
        the caller keeps what it holds."""
        if self.kept or self.keep_held or storage_invalidator() is None:
            return True
        for node in self.nodes:  # a loop, not any(): this runs at every generation
            if _hands_over(node):
                return True
        return False

    def retire(
        self,
        device: str,
        capturing: bool,
        dropped_by_reset: bool = False,
        carry: list[tuple[CallableIdentity, list[weakref.ref]]] | None = None,
    ) -> bool:
        """Note [Retiring held outputs]: on ``device``, where a capture is under way on the
        current stream when ``capturing``. The un-graphed outputs the caller still holds are
        appended to ``carry`` (the next generation's), or made stale now when it is None.
        With ``keep_held``, everything the caller holds is handed over, none made stale
        (Note [What generate keeps]). Returns whether the caller held anything."""
        nodes, eager_outputs, kept, keep_held = (
            self.nodes,
            self.eager_outputs,
            self.kept,
            self.keep_held,
        )
        caller_held = False
        invalidate_tensor = tensor_invalidator()
        # 1. Output objects the caller holds: those of forward and inference graphs raise
        #    from now on (and their positions get new objects); gradients are kept, below.
        #    Un-graphed ones go stale a generation late, unless written (state) by then.
        stale_now = self.carried if carry is not None else self.carried + eager_outputs
        if invalidate_tensor is not None:
            for producer, refs in stale_now:
                if producer.clones_live_outputs:  # not graph memory: nothing to copy
                    continue
                held_outputs = [out for ref in refs if (out := ref()) is not None]
                if kept:  # a warmup's: they leave the pool with its other held outputs
                    held_outputs = [
                        out for out in held_outputs if out.untyped_storage().data_ptr() not in kept
                    ]
                if held_outputs:
                    caller_held = True
                    if keep_held:  # out of the pool already (``WarmupOutputs.hand_over``)
                        continue
                    message = messages.stale_output(
                        device, producer.name, producer.source, dropped_by_reset
                    )
                    for output in held_outputs:
                        invalidate_tensor(output, message)
        if carry is not None:
            for producer, refs in eager_outputs:
                if producer.clones_live_outputs:
                    continue
                held = [
                    ref
                    for ref in refs
                    if (out := ref()) is not None
                    and not is_stale(out)
                    and out.untyped_storage().data_ptr() not in kept
                ]
                if held:
                    caller_held = True
                    carry.append((producer, held))
        held_by_objects: set[OutputBlock] = set()
        for node in nodes:
            recording = node.recording
            if not recording.autograd_outputs_found:
                recording.find_outputs_autograd_took()
            positions = recording.held_positions()
            if not positions:
                continue
            caller_held = True
            if _hands_over(node) or invalidate_tensor is None or keep_held:
                held_by_objects |= recording.blocks_at(positions)
                continue
            if kept:
                state = [i for i in positions if recording.blocks_at((i,)).pop().address in kept]
                if state:
                    held_by_objects |= recording.blocks_at(state)
                    positions = [i for i in positions if i not in state]
            message = messages.stale_output(device, node.name, node.source, dropped_by_reset)
            for i in positions:
                invalidate_tensor(recording.output_object(i), message)
            recording.renew_outputs(positions)
        # 2. Memory still referenced otherwise (views, .data, saved tensors, gradients).
        held = {
            block: node
            for node in nodes
            for block in node.recording.blocks
            if block in held_by_objects or not block.storage_unreferenced()
        }
        if not held:
            return caller_held
        invalidate_storage = storage_invalidator()
        handed = []
        for block, producer in held.items():
            hand = (
                _hands_over(producer)
                or invalidate_storage is None
                or block.address in kept
                or keep_held
            )
            if hand and not capturing and can_copy_out_of_pool():
                handed.append(block)
            elif invalidate_storage is not None:
                message = messages.stale_output(
                    device, producer.name, producer.source, dropped_by_reset
                )
                block.retire_stale(invalidate_storage, message)
            # else: neither is possible here; ``invalidation`` warned once.
        if handed:
            hand_over(handed)  # outputs kept as state are counted where they are kept
            stats.counters["handovers"] += sum(block.address not in kept for block in handed)
        for recording in {r: None for block in held for r in block.aliased_by}:
            recording.rebuild_aliases()
        return True


def _hands_over(node: GraphNode) -> bool:
    """Whether memory of ``node``'s outputs still referenced when its generation ends is copied
    out of the pool rather than made stale: gradients, and the outputs of callables compiled
    with ``generation_cloning``."""
    return node.phase is Phase.BACKWARD or node.clones_live_outputs
