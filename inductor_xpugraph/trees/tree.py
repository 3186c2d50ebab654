"""The graph tree of one device: nodes, paths, generations, and stale outputs.

Algorithm
---------
Compiled callables (an Inductor ``call`` or ``partition_N``, forward, backward or
inference) are called in sequences: a training step runs forward graphs, then backward
graphs; a graph break splits one step into several callables. Each sequence, from the
start of a *generation*, is a path in a tree. A ``GraphNode`` is one recording of one
callable (for one set of sizes) *at one place in the tree*: the same callable reached after
different predecessors gets different nodes. Every node records into the device's single
memory pool.

Memory: scratch memory is returned to the pool after each capture; outputs stay allocated
as ``memory`` decides. Both of its strategies guarantee that when a node is captured, the
outputs of all its ancestors are allocated, so the capture places nothing in them; and a
node is always captured after its ancestors. Replaying a path in order is therefore safe: a
node's scratch may only overlap outputs of nodes captured *later*, which on this path have
not run yet in this generation, and on other paths belong to older generations. Re-recording
a node drops its subtree (its descendants were captured before the new recording). The one
exception: a capture may reuse outputs of its path that were already unreferenced, or that
it consumed (a backward's saved activations); that node replays only while they still are,
and with owned outputs nothing is captured on a path through the lender that bypasses the
node that reused its memory (``memory``).

Generations: a generation starts when a call arrives in a new ``torch.compile`` invocation
and no backward of the one in progress can still run (Note [A backward that can no longer
run], ``generation``) — or, once the user has called ``mark_step_begin()``, exactly at each
such call. At that point the path restarts at the root and what the previous generation
handed out is retired (below). This is what makes replaying safe, and it is the semantics
CUDA users know from upstream's trees (the same generation counters are used, so
``torch.compiler.cudagraph_mark_step_begin()`` works too). Calls that bypass torch.compile
(loaded artifacts) never move that counter: there, a callable met again on the current path
starts the new generation (``restart_if_repeated``).

What a generation hands out is noted in ``generation``; how it is retired when the
generation ends (stale-output errors, gradients handed over, outputs passed back in):
``handed_out``.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch._inductor.cudagraph_trees import MarkStepBox
from torch.multiprocessing.reductions import StorageWeakRef

from . import messages, stats
from .backends import GraphBackend, backend_class
from .decision import Leave, Position, TreeView
from .generate_keeps import generate_imported, inside_generate
from .generation import Generation, current_generation
from .handed_out import HandedOut
from .inputs import InputBuffers, MovingStorages
from .invalidation import can_copy_out_of_pool
from .kept_state import KeptState
from .memory import (
    MemoryStrategy,
    OwnedOutputs,
    WarmupOutputs,
    memory_strategy,
    reserve_in_new_pool,
)
from .node import CallableIdentity, GraphNode, unlink
from .recording import Recording
from .trace import log_captures

log = logging.getLogger("inductor_xpugraph")


class GraphTree:
    def __init__(self, device: str) -> None:
        device_type, _, index = device.partition(":")
        self.device = device
        self.thread = threading.current_thread().name
        self.backend: GraphBackend = backend_class(device_type)(int(index or 0))
        self.backend.on_graphs_invalidated = self._start_over_after_invalidation
        self.root = GraphNode.marker("<root>")
        # Where a generation goes when it cannot stay in the tree: its calls run un-graphed.
        self.off_tree = GraphNode.marker("<off tree>")
        # Where a generation goes once a warmup ran in the pool: no graph may run until it
        # ends, or until every warmup output is dropped, and its calls run un-graphed in the
        # pool (``warm_up``).
        self.warming_up = GraphNode.marker("<warming up>")
        # Captures (and everything else off the replay fast path) are serialised.
        self.lock = threading.RLock()
        self._seq = itertools.count(1)
        # What a new pool reserves up front: set by the callable that records or warms up
        # first in it, from its settings (``initial_pool_allocation_gb``).
        self.initial_pool_bytes = 0
        # Where static inputs lay when seen, to tell memory that moves under its tensor
        # (FSDP2's gathered parameters): recordings copy those (``inputs``). Kept by ``reset``:
        # the graphs go, what the storages do stays true.
        self.moving_storages = MovingStorages()
        self._start_empty()

    def _start_empty(self) -> None:
        """The state of a tree with no nodes (``__init__``, ``reset``)."""
        self.current = self.root
        self.generation = Generation()
        # Generations started on this tree: a clock for how often things happen per step.
        self.generations_started = 0
        # What the generation that ended handed out, when retiring it is left to the first
        # call of the new one (see ``start_generation``); None once retired.
        self.unretired: HandedOut | None = None
        self._pool: Any = None
        # Outputs of warmups in the pool the caller may still hold (``warm_up``), the node
        # the generation was at when the first ran, and the calls run since.
        self.warmup_outputs = WarmupOutputs()
        self.warmed_up_below: GraphNode = self.root
        self.calls_warming_up = 0
        # Callables warmed up in the pool so far: the first warmup of each gives the device
        # what the allocator caches (its compilation's benchmarks), the next ones do not
        # (``force_cudagraphs_warmup`` warms up at every call).
        self.warmed_up_fns: weakref.WeakSet[Any] = weakref.WeakSet()
        self.memory = memory_strategy(self.backend)
        # Set when this tree must record again, from the next generation, with this strategy.
        self.next_memory: MemoryStrategy | None = None
        # Callables that no longer exist; their nodes are dropped off the fast path.
        self.forgotten_callables: list[int] = []
        # Recordings evicted and not recorded again yet, per (callable id, sizes).
        self.evicted: collections.Counter[tuple[int | None, tuple[int, ...]]] = (
            collections.Counter()
        )
        # Outputs handed over as state: recordings take them as static inputs.
        self.kept_state = KeptState()
        # Callable id -> the output positions found to be state (an un-graphed output that a
        # later call wrote: ``Generation.take_carried``): its recordings' outputs there are
        # kept when their generation ends, as the warmup's were (a cache made per request).
        self.state_outputs: dict[int, set[int]] = {}
        # Captures since the last summary line (``_log_captures``): how many, and seconds.
        self.captures_unlogged = 0
        self.capture_seconds_unlogged = 0.0

    @property
    def pool(self) -> Any:
        if self._pool is None:
            self._pool = self.backend.new_pool()
            if self.initial_pool_bytes:
                reserve_in_new_pool(self.backend, self._pool, self.initial_pool_bytes, self.device)
        return self._pool

    # -- generations --------------------------------------------------------------------------

    def maybe_start_generation(
        self,
        args: list[Any],
        passed_back: Sequence[int],
        mutated: Sequence[int],
        backward: bool,
        written_later: Sequence[torch.Tensor] = (),
    ) -> None:
        """Called when the generation counter moved: start a new one if that is safe.

        A backward never starts one (unless the user drives generations with
        mark_step_begin): it belongs to the iteration of its forward, even when another
        backward of that iteration already ran (two forwards, then their two backwards).
        ``args``, ``passed_back``, ``mutated``, ``written_later``: see ``start_generation``.
        """
        if MarkStepBox.mark_step_counter or not (backward or self.generation.backward_may_run()):
            self.start_generation(args, passed_back, mutated, written_later)

    def restart_if_repeated(
        self,
        callable_id: int,
        args: list[Any],
        passed_back: Sequence[int],
        mutated: Sequence[int],
        written_later: Sequence[torch.Tensor] = (),
    ) -> bool:
        """A callable met again on the current path starts a new generation, when allowed.

        Calls that do not go through ``torch.compile`` (a loaded standalone/AOT artifact, the
        generated module run directly) never move the invocation counter; without this rule
        each call of such a loop would record a new node below the previous one. Not applied
        once the user drives generations with mark_step_begin, to backward callables (a second
        backward through one forward is not a new iteration), or while a backward is pending:
        then the call records below the last one (several layers sharing one compiled graph,
        or a forward called again before the backward of the first).
        """
        if MarkStepBox.mark_step_counter:
            return False
        if self.current is self.warming_up:  # the path so far: what ran in this generation
            if not self.generation.ran(callable_id):
                return False
        else:
            node = self.current
            while node.callable_id != callable_id:
                if node.parent is None:  # reached the root: not on the path
                    return False
                node = node.parent
        if self.generation.backward_may_run():
            return False
        self.start_generation(args, passed_back, mutated, written_later)
        return True

    def start_generation(
        self,
        args: list[Any] | None = None,
        passed_back: Sequence[int] = (),
        mutated: Sequence[int] = (),
        written_later: Sequence[torch.Tensor] = (),
    ) -> None:
        """The path restarts at the root, and what the generation that ended handed out is
        retired: at once when retiring may copy memory out of the pool (the copy must be
        queued before any replay overwrites that memory) or nodes are about to be dropped;
        otherwise it is host work only, and the fast path does it right after its launch,
        while the device runs (``retire_ended_generation``).

        ``args`` are those of the call that starts the generation: the ones at positions
        ``passed_back`` that are outputs of the generation that ended are handed over, or
        replaced by copies where that cannot be (Note [Outputs passed back in]); those at
        positions ``mutated`` (the callable writes them), and ``written_later`` (the later
        partitions of its graph write them), are kept as state (Note [Outputs kept as
        state])."""
        self.retire_ended_generation()
        if self.captures_unlogged:
            log_captures(
                self.device, self.captures_unlogged, self.capture_seconds_unlogged, self.pool_bytes
            )
            self.captures_unlogged, self.capture_seconds_unlogged = 0, 0.0
        self.unretired = ended = self.generation.take_handed_out()
        # Inside Hugging Face generate, what the caller holds is handed over, not made
        # stale (Note [What generate keeps]).
        if generate_imported():
            ended.keep_what_the_caller_keeps(inside_generate)
        # (Before retiring: what it carries goes to the new generation.)
        self.generation = Generation(current_generation())
        if self.state_outputs:
            for node in ended.nodes:
                positions = self.state_outputs.get(node.callable_id)
                if positions:
                    ended.keep_outputs(node.recording, positions)
        if args is not None:
            if passed_back and can_copy_out_of_pool() and not self.backend.is_capturing():
                ended.keep_passed_back(args, passed_back)
            elif passed_back:
                ended.copy_passed_back(args, passed_back)
            if mutated or written_later:
                ended.keep_mutated([*(args[i] for i in mutated), *written_later])
        if self.next_memory is not None or ended.may_copy() or self.warmup_outputs:
            self.retire_ended_generation()
        # Before any graph runs: what warmups left in the pool that is still referenced (memory
        # docstring, "Warmups run in the pool") leaves it, now that retiring dropped the
        # output objects the caller held.
        if self.warmup_outputs:
            self.warmup_outputs.hand_over()
        if ended.kept_tensors or ended.written:  # out of the pool now: taken where it lies
            for tensor in ended.kept_state():
                self.keep_state(tensor)
        if self.next_memory is not None:
            for child in self.root.child_nodes():
                self.drop_node(child)
            # A fresh pool too: once its last graph is gone, a device may release the old one.
            self._pool = None
            self.memory, self.next_memory = self.next_memory, None
            self._release_dropped_pool()
        self.current = self.root
        self.generations_started += 1
        if self.forgotten_callables and not self.backend.is_capturing():
            self.retire_ended_generation()  # before its nodes go
            with self.lock:
                self.drop_forgotten()  # a freed model's memory goes back at its next step

    def note_state_written(
        self, identity: CallableIdentity, args: list[Any], positions: Sequence[int]
    ) -> None:
        """A call off the fast path writes ``args`` at ``positions`` in place (Note [Outputs
        kept as state]): what this generation made there is handed over at its end if the
        caller still holds it; what an un-graphed call of the generation before made there
        is state from now on, and so are its maker's outputs there when their generation ends
        (a cache made per request)."""
        self.generation.note_written(args, positions)
        for producer, position, state in self.generation.take_carried(args, positions):
            self.keep_state(state)
            self.state_outputs.setdefault(producer.id, set()).add(position)

    def keep_state(self, tensor: torch.Tensor) -> None:
        """``tensor`` is state from now on: recordings take it where it lies (Note [Outputs
        kept as state])."""
        self.kept_state.keep(tensor)
        stats.counters["handovers"] += 1

    def retire_ended_generation(self) -> bool:
        """Retire what the generation that ended handed out, if that is still to be done.
        Returns whether the caller held any of it (it raises the stale-output error now)."""
        ended, self.unretired = self.unretired, None
        return ended is not None and self._retire(ended)

    def retire_handed_out(self, dropped_by_reset: bool = False) -> None:
        """Retire everything handed out so far, now (``reset``)."""
        self.retire_ended_generation()
        self._retire(self.generation.take_handed_out(), dropped_by_reset)

    def _retire(self, ended: HandedOut, dropped_by_reset: bool = False) -> bool:
        # No copy may be queued inside someone else's capture of this stream. Un-graphed
        # outputs are carried through the generation in progress, the one after ``ended``
        # (Note [Un-graphed outputs go stale a generation late]); a reset carries nothing.
        carry = None if dropped_by_reset else self.generation.carried
        return ended.retire(self.device, self.backend.is_capturing(), dropped_by_reset, carry)

    # -- where a call stands -------------------------------------------------------------------

    @property
    def position(self) -> Position:
        """Where the generation stands. (Off the path, ``current`` is a marker node with no
        children, so that the fast path's lookup of a child misses there without a test of
        its own.)"""
        if self.current is self.off_tree:
            return Position.OFF_TREE
        if self.current is self.warming_up:
            return Position.WARMING_UP
        return Position.ON_PATH

    def settle(
        self,
        callable_id: int,
        key: tuple[int, ...],
        args: list[Any],
        read_only_static: Sequence[int] = (),
    ) -> TreeView:
        """Settle the tree for a call off the fast path, and say where the call stands.

        Settled only where a graph may run (no capture under way, the device records, the
        generation on the tree): the nodes of freed callables are dropped, where the call's
        read-only static inputs lie is noted (``moving_storages``), and a path held by
        warmups resumes once their outputs are dropped. The recordings here whose state died
        are found, after one garbage collection where none died but one is laid out as the
        call's inputs (the caller's old state may be garbage that only reference cycles keep:
        Dynamo's objects from compiling the call that made it)."""
        backend, position = self.backend, self.position
        capturing, cannot_record = backend.is_capturing(), backend.cannot_record
        if capturing or cannot_record or position is Position.OFF_TREE:
            return TreeView(position, self.device, capturing, cannot_record)
        self.drop_forgotten()
        if read_only_static:
            self.moving_storages.note(args, read_only_static)
        if position is Position.WARMING_UP and self.resume_after_warmups():
            position = Position.ON_PATH
        if position is Position.WARMING_UP:
            return TreeView(position, self.device, calls_warming_up=self.calls_warming_up)
        place, generation = self.current, self.generation
        variants = tuple(place.variants((callable_id, key)))
        matching = tuple(node for node in variants if node.recording.static_inputs_match(args))
        dead: tuple[GraphNode, ...] = ()
        if variants and not matching:
            dead = tuple(node for node in variants if node.recording.state_died())
            if not dead and any(node.recording.state.laid_out_as(args) for node in variants):
                gc.collect()
                dead = tuple(node for node in variants if node.recording.state_died())
        moved = self.moving_storages.moved
        settled = tuple(
            node
            for node in variants
            if node.recording.copies_settled and node.recording.changed_inputs(args) == ([], [])
        )
        return TreeView(
            position,
            self.device,
            place=place,
            variants=variants,
            matching=matching,
            dead=dead,
            can_capture=self.memory.can_capture_below(place),
            capture_refusal=backend.reason_not_to_capture(args),
            kept_state=self.kept_state,
            moving=frozenset(i for i in read_only_static if moved(args[i])),
            settled=settled,
            evicted_here=bool(self.evicted[callable_id, key]),
            pending_backward=generation.pending_backward,
            records_below_itself=(
                sum(node.callable_id == callable_id for node in place.path_from_root())
                if generation.pending_backward
                else 0
            ),
            generation=self.generations_started,
        )

    def leave(self, why: Leave, name: str, source: str | None) -> None:
        """The rest of this generation runs un-graphed, ``why`` (said where there is
        something to say); the next one starts at the root."""
        if why is Leave.LIVE_MEMORY:
            stats.record_event(
                stats.EventKind.LIVENESS_FALLBACK, messages.LIVENESS_FALLBACK, name, source
            )
            stats.counters["liveness_fallbacks"] += 1
        elif why is Leave.LENT_MEMORY:  # the tree records again from the next one, not lending
            log.warning(messages.LENT_MEMORY_CONFLICT, self.device, self.current.name)
            self.next_memory = OwnedOutputs(lending=False)
        self.current = self.off_tree

    # -- nodes --------------------------------------------------------------------------------

    def capture(
        self, fn: Any, args: list[Any], place_inputs: InputBuffers
    ) -> tuple[Any, Any, frozenset[int]]:
        """Capture ``fn(args)`` as a child of the current node (``add_node`` adds it).

        ``args`` must hold the only references the caller has to its tensors: path outputs
        that nothing else references are lent to the capture (``memory``), and the copied
        inputs are replaced by buffers in the pool (``place_inputs``). Returns the graph,
        its outputs, and the addresses of the path outputs it consumed (freed after their
        last use; its own outputs may lie there now). When the capture raises, ``args``
        holds the call's own arguments again, for an un-graphed run.
        """
        started = time.perf_counter()
        try:
            self.memory.prepare_capture(self.current, self.pool)  # may make the pool
        except BaseException:
            self.start_over()
            raise
        lent = self.memory.lend_inputs(args)
        # The call's own arguments, for an un-graphed run if the capture fails: the lent ones
        # are not held here (the capture may free them), ``take_back_loans`` rebuilds them.
        call_args = [None if i in lent else arg for i, arg in enumerate(args)]
        try:
            graph, outputs = self.backend.capture(fn, args, self.pool, place_inputs)
        except BaseException:
            self.memory.take_back_loans(call_args)
            args[:] = call_args
            self.start_over()
            raise
        consumed = self.memory.settle_loans()
        self.captures_unlogged += 1
        self.capture_seconds_unlogged += time.perf_counter() - started
        return graph, outputs, consumed

    def warm_up(self, fn: Any, args: list[Any]) -> Any:
        """Run ``fn(args)`` un-graphed before its capture: in the pool, where the captures
        that follow reuse its memory, wherever a capture below the current node would be
        admitted; elsewhere outside it (``memory``, "Warmups run in the pool"). After one in
        the pool, no graph runs until the generation ends or every warmup output is dropped
        (``resume_after_warmups``): its memory may lie in any graph's scratch. Until then the
        calls of the generation run un-graphed in the pool too."""
        if self.current is not self.warming_up:
            memory = self.memory
            if not (
                self.backend.warms_up_in_pool
                and self.current is not self.off_tree
                and self.next_memory is None
                and memory.can_capture_below(self.current)
                and can_copy_out_of_pool()
            ):
                return self.backend.warmup(fn, args)
            if fn not in self.warmed_up_fns:  # what its compilation left cached goes
                with contextlib.suppress(TypeError):  # a callable no weak reference can hold
                    self.warmed_up_fns.add(fn)
                self.backend.release_cached_memory()
            try:
                memory.prepare_warmup(self.current, self.pool)  # may make the pool
            except Exception:  # the pool cannot be made or restored: no capture here either
                self.start_over()
                return self.backend.warmup(fn, args)
            self.warmed_up_below, self.current = self.current, self.warming_up
            self.calls_warming_up = 0
        inputs = [StorageWeakRef(a.untyped_storage()) for a in args if isinstance(a, torch.Tensor)]
        outputs = self.backend.warmup_in_pool(fn, args, self.pool)
        self.warmup_outputs.note(outputs, inputs)
        self.calls_warming_up += 1
        return outputs

    def resume_after_warmups(self) -> bool:
        """Once nothing a warmup left in the pool is referenced, graphs may run again: the
        path goes on from where the first warmup ran, as if it had run outside the pool.
        Returns whether it did."""
        if self.warmup_outputs.any_alive():
            return False
        self.current, self.warmup_outputs = self.warmed_up_below, WarmupOutputs()
        return True

    def start_over(self) -> None:
        """The rest of this generation runs un-graphed (its outputs so far stay valid), and
        the next one starts from an empty tree, a fresh pool and a fresh memory strategy.

        For a capture that raised: memory it was lent, or that was freed for it, may be gone,
        and no node records who reused it, so no later capture could be placed safely. For
        graphs the backend reports invalid (``_start_over_after_invalidation``)."""
        self.next_memory = memory_strategy(self.backend)
        self.current = self.off_tree

    def _start_over_after_invalidation(self, reason: str) -> None:
        """The backend's ``on_graphs_invalidated``: no graph of this tree may replay again.
        May be called from any thread, between any two calls (it writes two attributes)."""
        if self.root.child_nodes():
            stats.record_event(
                stats.EventKind.START_OVER, messages.graphs_invalidated(self.device, reason)
            )
            self.start_over()

    def add_node(
        self, identity: CallableIdentity, key: tuple[int, ...], recording: Recording
    ) -> GraphNode:
        node = GraphNode(identity, self.current, recording, next(self._seq))
        node.sizes = key
        self.current.use_variant((identity.id, key), node)
        if not self.memory.adopt(node, self.pool):
            self._fall_back_to_owned_outputs(node)
        return node

    def _fall_back_to_owned_outputs(self, node: GraphNode) -> None:
        """The pool holds memory the strategy does not know of: no restore is safe now.

        ``node`` keeps the outputs its capture allocated; the rest of this generation runs
        un-graphed (``enter``), and the next one starts from an empty tree with owned outputs
        (outputs handed out in this one stay valid until then).
        """
        log.warning(messages.UNKNOWN_POOL_MEMORY, self.device, node.name)
        OwnedOutputs().adopt(node, self.pool)
        self.next_memory = OwnedOutputs()

    def replayed(self, node: GraphNode) -> None:
        """``node`` replayed: the path goes on from it."""
        self.current = node
        self.generation.replayed_nodes.append(node)
        node.replays += 1
        stats.counters["replays"] += 1

    def replayed_variant(self, node: GraphNode) -> None:
        """``replayed``, for a recording found off the fast path: it becomes the variant used
        last here (addresses, or a liveness pattern, seen before came back)."""
        key = (node.callable_id, node.sizes)
        if self.current.children.get(key) is not node:
            self.current.use_variant(key, node)
        self.replayed(node)

    def recorded(self, node: GraphNode) -> None:
        """``node`` was just recorded, and replayed once to compute its call's result: the
        path goes on from it, unless the tree starts over from the next generation."""
        self.enter(node)
        self.generation.replayed_nodes.append(node)

    def enter(self, node: GraphNode) -> None:
        """Make the node just run the current one (the end of the path so far)."""
        self.current = self.off_tree if self.next_memory is not None else node

    def evict_variant(self, node: GraphNode) -> None:
        """Drop a variant that the bound on kept variants pushes out
        (``config.static_input_variants``), noting the recordings below it that go with
        it: recording one of those again counts toward the thrash guard (``take_evicted``).
        The variant itself is its callable's to count, when its address set comes back
        (``GraphedCallable._decide_variant``)."""
        self.evicted.update((n.callable_id, n.sizes) for n in node.subtree()[1:])
        self.drop_node(node)

    def take_evicted(self, callable_id: int, sizes: tuple[int, ...]) -> bool:
        """Whether a recording of this callable for these sizes went with an evicted variant
        and is not recorded again yet; if so, it counts as recorded again now."""
        if not self.evicted[callable_id, sizes]:
            return False
        self.evicted[callable_id, sizes] -= 1
        return True

    def drop_node(self, node: GraphNode) -> None:
        """Forget ``node`` and its subtree; their graph memory returns to the pool."""
        parent = node.parent
        if parent is None:  # dropped already
            return
        parent.remove_child(node)
        subtree = node.subtree()
        self.memory.forget(subtree)
        if self.current in subtree:
            self.current = parent
        if self.warmed_up_below in subtree:
            self.warmed_up_below = parent
        unlink(subtree)

    def forget_callable(self, callable_id: int) -> None:
        """Note that a callable no longer exists (its compiled graph was freed, see Note
        [What keeps a graph alive] in ``lifetime``); see drop_forgotten.

        Called from a finalizer, at any time and on any thread: only records the id.
        """
        self.forgotten_callables.append(callable_id)

    def drop_forgotten(self) -> None:
        """Drop the nodes of callables that no longer exist, and forget the storages freed
        with them (``moving_storages``).

        Nodes on the current path stay until a later generation: outputs they handed out in
        this one may still be in use.
        """
        if not self.forgotten_callables:
            return
        forgotten, self.forgotten_callables = set(self.forgotten_callables), []
        path_end = self.warmed_up_below if self.current is self.warming_up else self.current
        on_path = set(path_end.path_from_root())
        for node in self.nodes():
            if node.callable_id not in forgotten:
                continue
            if node in on_path:
                self.forgotten_callables.append(node.callable_id)
            else:
                self.drop_node(node)
        self.moving_storages.forget_freed()  # their parameters' storages, freed with them

    def reset(self) -> None:
        with self.lock:
            self.retire_handed_out(dropped_by_reset=True)
            self.warmup_outputs.hand_over()  # the pool goes: nothing of the caller's may stay
            nodes = self.nodes()
            self.memory.forget(nodes)
            self.root.children.clear()
            self.root.other_variants.clear()
            unlink(nodes)
            self._start_empty()
            self._release_dropped_pool()

    def _release_dropped_pool(self) -> None:
        if not self.backend.is_capturing():
            self.backend.release_dropped_pools()

    def nodes(self) -> list[GraphNode]:
        return self.root.subtree()[1:]

    def pool_bytes(self) -> int:
        """Bytes of graph outputs that the pool keeps allocated."""
        return self.memory.held_bytes(self.nodes())
