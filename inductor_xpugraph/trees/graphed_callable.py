"""Warmup -> record -> replay for one compiled callable, at its place in the device tree.

The wrapper Inductor generates calls ``graphify(call, ...)`` (or ``graphify(partition_N, ...)``)
once at load; the returned ``GraphedCallable`` replaces the callable. Each call:

1. checks whether a new generation starts (see ``tree``), then looks for a child of the tree's
   current node recorded for this callable and these sizes;
2. **replay** (the fast path): when there is one and every non-copied input (parameters,
   buffers, outputs of earlier graphs on the path) still has the address it had at capture,
   copy the other inputs into the node's static buffers and launch the graph; only then,
   while the device runs, retire what the generation before handed out (at a generation's
   first call, when that is host work only: ``GraphTree.start_generation``) and build the
   outputs;
3. **warmup**: the first ``warmup_runs`` calls for given sizes run the plain callable
   (Triton autotuning, lazy kernel loading, library handles: never inside a capture);
4. **record**: otherwise capture a new child node, replay it once to compute the result.
   When a non-copied input moved, the callable is recorded again as a *variant*, beside the
   recordings for the addresses seen before, and whichever matches replays (a KV cache or a
   parameter set that comes back). At most ``config.static_input_variants`` variants are kept
   per place, the least recently used dropped first. A parameter whose memory moves under it
   (the same storage at a new address: FSDP2 gathers each layer's parameters again at every
   step) is copied instead, like any other input, by one recording that replaces the ones it
   covers (``inputs.MovingStorages``).

Off the fast path, one place decides what the call does: ``decide`` returns a plain value
(``decision.Decision``: replay, record, warm up, run eagerly, run plain, fall back, with what
comes before it: recordings it replaces, counts of the thrash guard), from the tree's settled
position and the call's inputs, changing nothing; ``_carry_out`` then does it. The tree keeps
its own bookkeeping of what ran (``GraphTree.replayed``, ``GraphTree.recorded``).

Recordings are keyed by the callable's integer inputs (Inductor passes symbolic sizes as
ints): one recording per distinct size. How many warmups, which sizes, how many re-records
before the callable stops recording (the thrash guard): ``recording_policy``. An input the
callable writes is captured where it lies (static, an output of an earlier graph, or state
passed again: ``kept_state``), never copied into a buffer alone (a replay would write the
copy); one that is a new tensor at every call (beam search's reordered cache) is captured over
a tensor of the recording's own, which each replay fills before and copies back after. A
recording whose state died (a cache of a finished request) takes the next request's state
into its memory when it is laid out the same (``recorded_state``), else is replaced by the
next recording, not counted by the thrash guard when it replayed. A call made while
the stream is being captured (by anyone) runs the plain callable: captures never nest.

What keeps a callable's recordings alive, and what frees them: ``lifetime``.
"""

from __future__ import annotations

import gc
import itertools
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch._dynamo.mutation_guard import GenerationTracker
from torch._inductor.cudagraph_trees import MarkStepBox
from torch._inductor.utils import ALIGNMENT  # what Inductor's kernels assume of an input

from .. import config
from . import messages, stats
from .backends import unrecordable_ops
from .decision import EAGERLY, PLAIN, Action, Decision, Leave, RecordKind
from .failed_operator import operator_that_raised
from .inputs import InputBuffers, InputNames, StaticInput, input_identity
from .kept_state import PassedAgain, describe_holders, stale_state_error
from .lifetime import ReleaseHandle, forget_callable, release
from .node import CallableIdentity, GraphNode, Phase
from .per_thread import thread_trees, tree_for, written_later
from .recording import Recording
from .recording_policy import RecordingPolicy, RecordingSettings
from .trace import trace_recording
from .tree import GraphTree

log = logging.getLogger("inductor_xpugraph")

_callable_ids = itertools.count()
# Recordings of one callable on the current path from which a record below them is reported
# (a model may call one graph several times per step: layers sharing compiled code).
RECORDS_BELOW_ITSELF = 8
# Every live graphed callable, for ``reset_all_callables`` (held weakly: a compiled model that
# is deleted takes its callables with it).
_all_callables: weakref.WeakSet[GraphedCallable] = weakref.WeakSet()


def reset_all_callables() -> None:
    for graphed in list(_all_callables):
        graphed.reset()


class GraphedCallable:
    def __init__(
        self,
        fn: Callable[[list[Any]], Any],
        device: str,
        *,
        static_inputs: Sequence[int],
        mutated_inputs: Sequence[int],
        phase: Phase,
        name: str,
        source: str | None = None,
        input_names: Mapping[int, str] | None = None,
        aligned_inputs: Sequence[int] = (),
        recording: RecordingSettings | None = None,
    ) -> None:
        self.fn = fn
        self.device = device
        settings = recording or RecordingSettings.current()
        clones = settings.clone_live_outputs and phase is not Phase.BACKWARD  # (handed over)
        self.identity = CallableIdentity(next(_callable_ids), name, phase, source, clones)
        self.id, self.name, self.phase, self.source, _ = self.identity
        self.static_inputs = frozenset(static_inputs)
        self.mutated_inputs = tuple(mutated_inputs)
        # Written positions that may hold an output of the step before (state to keep:
        # Note [Outputs kept as state]); parameters and buffers never do.
        self._may_be_state = tuple(i for i in self.mutated_inputs if i not in self.static_inputs)
        # Static inputs the graph only reads: copied instead where their memory moves under
        # them (FSDP2's gathered parameters: ``inputs.MovingStorages``).
        self._read_only_static = (
            tuple(sorted(i for i in self.static_inputs if i not in self.mutated_inputs))
            if settings.copy_moving_inputs
            else ()
        )
        # Static inputs Inductor's kernels take as aligned without checking them at each call
        # (``codegen.eligibility.assumed_aligned_inputs``): a replay meets them where its
        # recording checked them; every other call checks them (``_observe``).
        self.aligned_inputs = tuple(aligned_inputs)
        # What the static, mutated and object inputs are (placeholder and first use), by
        # position, for the messages about them; codegen provides them.
        self.input_names = InputNames(input_names or {})
        # The compile that loaded this callable (None outside one), for the structured trace.
        self.compile_id = torch._guards.CompileContext.current_compile_id()
        self._after_run = {
            Phase.FORWARD: _set_pending_backward,
            Phase.BACKWARD: _clear_pending_backward,
        }.get(phase, _nothing)
        # A backward is never a new iteration: met again on the path, it is another backward
        # through the same forward (``retain_graph=True``, two losses, a gradient penalty);
        # called in a new torch.compile invocation, it is its forward's iteration still.
        self._may_restart_generation = phase is not Phase.BACKWARD
        # What the recording policy obeys, read on the thread that loads this callable (or
        # baked into the generated code): never read again per call (``recording_policy``).
        self.recording_settings = settings
        self.reset()
        weakref.finalize(self, forget_callable, self.id)
        _all_callables.add(self)

    def release_handle(self, module_globals: dict[str, Any]) -> ReleaseHandle:
        """An object whose freeing drops this graphed ``call``'s recordings from every tree
        and gives its module back the names Inductor bound (Note [What keeps a graph
        alive]): nothing of ours stays with a module that Inductor keeps."""
        handle = ReleaseHandle()
        weakref.finalize(handle, release, self, module_globals)
        return handle

    def reset(self) -> None:
        """Forget this callable's warmups, re-records and fallback (its nodes live in the
        tree): it warms up and records again, as if new."""
        self.policy = RecordingPolicy(self.name, self.source, self.recording_settings)
        # Positions of int (size) inputs; None until the first call.
        self._size_inputs: tuple[int, ...] | None = None
        # Positions where the call that starts a generation may be passed an output of the
        # generation before (Note [Outputs passed back in]): the tensor inputs that are
        # neither static nor mutated. None until the first call.
        self._passed_back: tuple[int, ...] | None = None
        # The mutated positions of this call (on the slow path) that hold the tensors of the
        # call before: state the caller keeps.
        self._mutated_inputs_seen = PassedAgain(self.mutated_inputs)
        self._passed_again: frozenset[int] = frozenset()
        # The mutated positions that held new tensors at this call and the one before: a
        # recording copies them in and back (``Recording``'s written-back inputs).
        self._new_twice: frozenset[int] = frozenset()

    def __call__(self, args: list[Any]) -> Any:
        try:
            tree = thread_trees().get(self.device) or tree_for(self.device)
            # generation.current_generation(), inlined: this is the replay fast path.
            if tree.generation.number != (
                MarkStepBox.mark_step_counter or GenerationTracker.generation
            ):
                passed_back = self._passed_back or self._positions_passed_back(args)
                tree.maybe_start_generation(
                    args,
                    passed_back,
                    self._may_be_state,
                    not self._may_restart_generation,
                    written_later.told(self),
                )
            size_inputs = self._size_inputs
            key = tuple([args[i] for i in size_inputs]) if size_inputs else ()
            node = tree.current.children.get((self.id, key))
            if (
                node is None
                and self._may_restart_generation
                and tree.restart_if_repeated(
                    self.id,
                    args,
                    self._positions_passed_back(args),
                    self._may_be_state,
                    written_later.told(self),
                )
            ):
                node = tree.current.children.get((self.id, key))
            if (
                node is not None
                and node.recording.static_inputs_match(args)
                and not tree.backend.is_capturing()
                and (not node.reused_outputs or node.try_release_reused_memory(args))
            ):
                recording = node.recording
                tree.backend.wait_for_other_captures()
                recording.launch(args)
                if tree.unretired is not None:
                    # A generation's first call: retire the one before while the device runs.
                    tree.retire_ended_generation()
                outputs = recording.hand_out()  # host work too
                tree.replayed(node)
                self._after_run(tree)
                return outputs
            tree.retire_ended_generation()
            with tree.lock:
                outputs = self._slow_path(tree, key, args)
            self._after_run(tree)
            return outputs
        except RuntimeError as error:
            if self.mutated_inputs and args:  # before the call consumed its arguments
                self._raise_for_stale_state(args, error)
            raise

    def _positions_passed_back(self, args: list[Any]) -> tuple[int, ...]:
        if self._passed_back is None:
            self._passed_back = tuple(
                i
                for i, arg in enumerate(args)
                if isinstance(arg, torch.Tensor)
                and i not in self.static_inputs
                and i not in self.mutated_inputs
            )
        return self._passed_back

    # -- slow paths ---------------------------------------------------------------------------

    def _raise_for_stale_state(self, args: list[Any], cause: Exception | None = None) -> None:
        """State that went stale although this call writes it (Note [Outputs kept as
        state]): raise once, naming who holds it; it is kept from now on."""
        tree = thread_trees().get(self.device) or tree_for(self.device)
        error = stale_state_error(
            args, self.mutated_inputs, tree.keep_state, self.name, self.input_names.describe
        )
        if error is not None:
            raise error from cause

    def _slow_path(self, tree: GraphTree, key: tuple[int, ...], args: list[Any]) -> Any:
        """Every call that does not replay at once: note what the call shows, decide what it
        does (``decide``), and do it."""
        self._observe(tree, args)
        decision = self._ungraphed_for_now(tree)
        if decision is None:  # on the tree: settle the tree's position, then decide there
            tree.drop_forgotten()
            if self._size_inputs is None:  # first call: find the size (int) inputs once
                self._size_inputs = tuple(i for i, arg in enumerate(args) if isinstance(arg, int))
                key = tuple([args[i] for i in self._size_inputs])
            if self._read_only_static:
                tree.moving_storages.note(args, self._read_only_static)
            if tree.current is tree.warming_up:
                tree.resume_after_warmups()
            decision = self.decide(tree, key, args)
        return self._carry_out(decision, tree, key, args)

    def _observe(self, tree: GraphTree, args: list[Any]) -> None:
        """What a call off the fast path shows, whatever it does next: state written in
        place (Note [Outputs kept as state]), and static inputs Inductor takes as aligned."""
        if self.mutated_inputs:
            self._raise_for_stale_state(args)
            self._passed_again = self._mutated_inputs_seen.note(args)
            self._new_twice = self._mutated_inputs_seen.new_twice
            tree.generation.note_written(args, self._may_be_state)
            for producer, position, state in tree.generation.take_carried(args, self._may_be_state):
                tree.keep_state(state)
                tree.state_outputs.setdefault(producer.id, set()).add(position)
        if self.aligned_inputs:
            misaligned = [i for i in self.aligned_inputs if args[i].data_ptr() % ALIGNMENT]
            if misaligned:  # before anything runs
                words = self.input_names.describe(misaligned)
                raise ValueError(messages.misaligned_static_inputs(self.name, words, ALIGNMENT))

    def _ungraphed_for_now(self, tree: GraphTree) -> Decision | None:
        """A call that the tree's position does not decide: this callable runs un-graphed
        for good, someone is capturing (a capture never nests: run inside theirs), the device
        stopped recording, or this generation left the tree. None otherwise."""
        if self.policy.stopped or tree.backend.is_capturing():
            return PLAIN
        if tree.backend.cannot_record:  # un-graphed on the whole device, said once per graph
            reason = messages.device_stopped_recording(tree.device, tree.backend.cannot_record)
            return Decision(Action.RUN_PLAIN, reason=reason, level=logging.INFO)
        if tree.current is tree.off_tree:
            return EAGERLY
        return None

    def decide(self, tree: GraphTree, key: tuple[int, ...], args: list[Any]) -> Decision:
        """What this call does at the tree's current node (settled: ``_slow_path``), from the
        recordings there, this callable's policy and the call's inputs. Changes nothing."""
        if tree.current is tree.warming_up:
            # A warmup's outputs are still held: no graph may run (GraphTree.warm_up).
            refusal = self.policy.size_refusal(key)
            if refusal is None and self.policy.is_warmup(key):
                return Decision(Action.WARM_UP, counted=True)
            reason, level = refusal or (None, None)
            return Decision(Action.WARM_UP, reason=reason, level=level)
        if tree.current in self.policy.ungraphed_at:  # its inputs kept moving here ("skip")
            return PLAIN
        variants = tree.current.variants((self.id, key))
        matching = [v for v in variants if v.recording.static_inputs_match(args)]
        if matching:
            # Recorded here for these addresses. When every recording reuses memory that is
            # still referenced now, record one that does not, within the bound on variants;
            # beyond it, evicting would let alternating liveness patterns record at every
            # call, so the rest of the step runs un-graphed instead.
            if len(variants) >= config.static_input_variants:
                otherwise = Decision(
                    Action.RUN_EAGERLY, leave=Leave.LIVE_MEMORY, candidates=(matching[0],)
                )
            else:
                record = Decision(
                    Action.RECORD, kind=RecordKind.LIVENESS, reason=messages.LIVENESS_VARIANT
                )
                otherwise = self._record_or_not(tree, key, args, record)
            return Decision(Action.REPLAY, candidates=tuple(matching), otherwise=otherwise)
        if variants:  # recorded here, but a static input has an address no recording has
            return self._decide_variant(tree, variants, key, args)
        refusal = self.policy.size_refusal(key)
        if refusal is not None:
            return Decision(Action.RUN_PLAIN, reason=refusal[0], level=refusal[1])
        if self.policy.is_warmup(key):
            return Decision(Action.WARM_UP, counted=True)
        return self._record_or_not(tree, key, args, Decision(Action.RECORD, kind=RecordKind.FIRST))

    def _decide_variant(
        self, tree: GraphTree, variants: list[GraphNode], key: tuple[int, ...], args: list[Any]
    ) -> Decision:
        """Record for new addresses of the static inputs, keeping the other recordings.

        A recording whose state died (a cache made for one ``generate`` call and dropped with
        it) takes the call's new state into its memory and replays, when the new state is
        laid out as the dead one was (Note [State moved into a recording's memory] in
        ``recorded_state``). Otherwise the new recording *replaces* them. When each replayed,
        recording paid off and a replacement is not counted by the thrash guard; one that
        never replayed is churn, counted as any re-record. Memory that moves under its tensor
        (FSDP2) is copied by one recording that replaces the ones it covers, recorded again
        once per place, so not on the guard's clock. A call that could not be recorded (it
        writes tensors it was not passed before) is not counted."""
        dead = tuple(node for node in variants if node.recording.state_died())
        if not dead and any(node.recording.state.laid_out_as(args) for node in variants):
            # New state shaped as a recording's: the old may be garbage that only reference
            # cycles keep (Dynamo's objects from compiling the call that made it). Collected
            # now, it can move into the recording's memory instead of a new capture.
            gc.collect()
            dead = tuple(node for node in variants if node.recording.state_died())
        adopting = next((node for node in dead if node.recording.can_adopt_state(args)), None)
        if adopting is not None:  # new state moves into its memory, and it replays
            return Decision(Action.REPLAY, candidates=(adopting,), adopts_state=True)
        unsafe = self._unsafe_mutations(tree, args)
        if unsafe:
            words = self.input_names.describe(unsafe, shown=2)
            return Decision(Action.RUN_PLAIN, reason=messages.unsafe_mutation(words))
        if dead and all(node.replays for node in dead):
            record = Decision(Action.RECORD, kind=RecordKind.STATE_DIED, replaces=dead)
            return self._record_or_not(tree, key, args, record)
        variants = [node for node in variants if node not in dead] or list(dead)
        moved, replaced = variants[0].recording.changed_inputs(args)
        moving = self._moving_inputs(tree, args)
        if moving and not replaced and set(moved) <= set(moving):
            covered = self._covered(tree, variants, args)
            variants = [node for node in variants if node not in covered]
            words = self.input_names.describe(moved, shown=2)
            record = Decision(
                Action.RECORD,
                kind=RecordKind.MOVING_MEMORY,
                reason=messages.moving_inputs_copied(words),
                counted=True,
                replaces=dead + tuple(node for node in covered if node not in dead),
                evicts=variants[-1] if len(variants) >= config.static_input_variants else None,
            )
            return self._record_or_not(tree, key, args, record)
        produced = tuple(i for i in moved if i not in self.static_inputs)  # by earlier graphs
        policy = self.policy
        reached = policy.managed_moves_reaching(
            tree.current, list(produced), not self.mutated_inputs
        )
        if reached and policy.settings.managed_action == "skip":
            words = self.input_names.describe(reached)
            reason = messages.managed_inputs_skip(words, policy.settings.managed_limit)
            return Decision(Action.RUN_PLAIN, reason=reason, replaces=dead, managed_moves=produced)
        generation = tree.generations_started
        if policy.rerecord_stops(generation):
            # An address set seen before was recorded here and dropped since, by the bound
            # (not state that died: new state at a freed state's addresses is new all the same).
            state = [i for i in moved if i in self._may_be_state]
            dropped = not dead and policy.seen_before(variants[0].recording.input_identity(args))
            span = policy.rerecord_span(generation)
            if dropped and not state:
                reason = messages.fallback_for_evicted_rerecords(span, *policy.limits)
            else:
                holders = describe_holders(args[state[0]]) if state else None
                reason = messages.fallback_for_moving_inputs(
                    self.input_names.describe(moved + replaced, shown=2),
                    holders,
                    span,
                    *policy.limits,
                )
            return Decision(
                Action.FALL_BACK,
                reason=reason,
                replaces=dead,
                managed_moves=produced,
                counts_rerecord=True,
            )
        full = len(variants) >= config.static_input_variants and variants[-1] not in dead
        record = Decision(
            Action.RECORD,
            kind=RecordKind.VARIANT,
            reason=messages.rerecord(self.input_names.changed(moved, replaced)),
            counted=True,
            replaces=dead,
            evicts=variants[-1] if full else None,
            managed_moves=produced,
            counts_rerecord=True,
        )
        copied_from_now = reached if policy.settings.managed_action == "copy" else []
        return self._record_or_not(tree, key, args, record, copied_from_now)

    def _record_or_not(
        self,
        tree: GraphTree,
        key: tuple[int, ...],
        args: list[Any],
        record: Decision,
        copied_from_now: Sequence[int] = (),
    ) -> Decision:
        """``record``, or what stops it, keeping what comes before it (``record``'s drops,
        eviction and counts): a written input it would copy without writing back, the
        backend's refusal, memory lent to another branch, the thrash guard (a recording that
        went with an evicted variant, not counted yet), or a step that cannot end and has
        grown too deep below this callable. ``copied_from_now``: inputs that another graph
        produced, which ``record``'s managed moves make copied here."""
        static = self._static_positions(tree, args, tree.current.path_blocks(), copied_from_now)
        unsafe = [
            i
            for i in self.mutated_inputs
            if isinstance(args[i], torch.Tensor) and i not in static and i not in self._new_twice
        ]
        if unsafe:
            words = self.input_names.describe(unsafe, shown=2)
            return replace(record, action=Action.RUN_PLAIN, reason=messages.unsafe_mutation(words))
        refused = tree.backend.reason_not_to_capture(args)
        if refused is not None:
            return replace(record, action=Action.RUN_PLAIN, reason=refused)
        if not tree.can_capture_here():
            return replace(record, action=Action.RUN_EAGERLY, leave=Leave.LENT_MEMORY)
        generation = tree.generations_started
        if (
            not record.counted
            and tree.went_with_an_evicted_variant(self.id, key)
            and self.policy.rerecord_stops(generation)
        ):
            span = self.policy.rerecord_span(generation)
            reason = messages.fallback_for_evicted_rerecords(span, *self.policy.limits)
            return replace(record, action=Action.FALL_BACK, reason=reason, admitted=True)
        if tree.generation.pending_backward and self._records_below_itself(tree) >= (
            config.pending_backward_records_limit
        ):
            return replace(
                record, action=Action.RUN_EAGERLY, leave=Leave.PENDING_BACKWARD, admitted=True
            )
        return replace(record, admitted=True)

    # -- carrying a decision out --------------------------------------------------------------

    def _carry_out(
        self, decision: Decision, tree: GraphTree, key: tuple[int, ...], args: list[Any]
    ) -> Any:
        if decision.action is Action.REPLAY:
            for node in decision.candidates:  # the first whose reused memory is free now
                if not node.reused_outputs or node.try_release_reused_memory(args):
                    variants = tree.current.variants((self.id, key))
                    if node is not variants[0]:  # addresses (or liveness) seen before came back
                        tree.current.use_variant((self.id, key), node)
                    if decision.adopts_state:
                        node.recording.adopt_state(args)
                        stats.counters["adoptions"] += 1
                    outputs = node.recording.replay(args)
                    tree.replayed(node)
                    return outputs
            decision = decision.otherwise
        self._before(decision, tree, key)
        action = decision.action
        if action is Action.RECORD:
            return self._record(tree, key, args, decision)
        if action is Action.WARM_UP:
            if decision.counted:
                stats.counters["warmups"] += 1
                with self.policy.warming_up(key):
                    return self._run_eagerly(tree, args, warmup=True)
            if tree.calls_warming_up == RECORDS_BELOW_ITSELF:
                reason = messages.WARMUP_OUTPUTS_HELD
                stats.record_event(stats.EventKind.PENDING_BACKWARD, reason, self.name, self.source)
            return self._run_eagerly(tree, args, warmup=True)
        if action is Action.RUN_EAGERLY:
            return self._run_eagerly(tree, args)
        if action is Action.FALL_BACK:
            return self._fall_back(decision.reason, args)
        if decision.reason is not None:  # RUN_PLAIN: a skip, said once
            self.policy.skip(decision.reason, level=decision.level)
        return self.fn(args)

    def _before(self, decision: Decision, tree: GraphTree, key: tuple[int, ...]) -> None:
        """What comes before the decision's action, in the order it was decided: sizes and
        warmups counted, recordings replaced or evicted, the thrash guard's counts, the
        generation leaving the tree."""
        policy = self.policy
        if decision.action is Action.WARM_UP or decision.kind is RecordKind.FIRST:
            # The size admitted (or its refusal said, or one size too many warned of) and the
            # warmup counted, as ``decide`` found them.
            if policy.admit_size(key):
                policy.warm_up(key)
        for node in decision.replaces:
            tree.drop_node(node)
        if decision.kind is RecordKind.STATE_DIED:
            stats.counters["replacements"] += 1
        if decision.kind is RecordKind.MOVING_MEMORY:
            policy.note_replacing_record()
        if decision.managed_moves:
            copyable = not self.mutated_inputs
            reached = policy.note_managed_moves(
                tree.current, list(decision.managed_moves), copyable
            )
            if reached and policy.settings.managed_action == "copy":
                words = self.input_names.describe(reached)
                log.info(messages.managed_inputs_copied(words, policy.settings.managed_limit))
        if decision.counts_rerecord:
            policy.note_rerecord(tree.generations_started)
        if decision.evicts is not None:
            tree.evict_variant(decision.evicts)
        if decision.leave is Leave.LIVE_MEMORY:
            tree.leave_after_liveness_failure(decision.candidates[0])
        elif decision.leave is Leave.LENT_MEMORY:
            tree.refuse_capture_here()
        if decision.admitted:
            if tree.take_evicted(self.id, key) and not decision.counted:
                policy.note_rerecord(tree.generations_started)
            if tree.generation.pending_backward and decision.action is not Action.FALL_BACK:
                self._say_records_below_itself(tree)
        if decision.leave is Leave.PENDING_BACKWARD:
            tree.leave_for_this_generation()

    def _run_eagerly(self, tree: GraphTree, args: list[Any], warmup: bool = False) -> Any:
        """Run un-graphed inside the tree's generation (a ``warmup``, in the pool where the
        tree can: ``GraphTree.warm_up``; or a step off the tree).

        The outputs follow the same generation rules as replayed ones, so code that would
        read a stale output fails from the first call, not the third. An output may be an
        input object itself (a parameter saved for backward): those are not ours to
        invalidate.
        """
        input_ids = {id(arg) for arg in args}
        if warmup:
            tree.initial_pool_bytes = self.policy.settings.initial_pool_bytes
        try:
            outputs = tree.warm_up(self.fn, args) if warmup else tree.backend.warmup(self.fn, args)
        except Exception as error:
            if not tree.backend.failed_captures:
                raise
            # A capture failed on the device before: the capture stream's libraries may
            # still hold events of the failed graph (oneDNN keeps a stream's last event).
            # The call runs as it would without graphs, on the caller's stream.
            reason = messages.warmup_failed_after_capture(tree.device, error)
            self.policy.stop(reason)
            stats.record_event(stats.EventKind.FALLBACK, reason, self.name, self.source)
            outputs = self.fn(args)
        tree.generation.note_eager(self.identity, outputs, input_ids)
        return outputs

    def _records_below_itself(self, tree: GraphTree) -> int:
        """How many times this callable is on the path already: a step that cannot end (a
        backward may still read what its forwards left) records every call below the last
        (Note [A backward that can no longer run]); from
        ``config.pending_backward_records_limit`` on, the tree stops growing (the rest of the
        step runs un-graphed)."""
        return sum(node.callable_id == self.id for node in tree.current.path_from_root())

    def _say_records_below_itself(self, tree: GraphTree) -> None:
        """Said once this callable is on the path ``RECORDS_BELOW_ITSELF`` times, as upstream
        warns, and when the limit stops the tree growing."""
        on_path, limit = self._records_below_itself(tree), config.pending_backward_records_limit
        if on_path < min(RECORDS_BELOW_ITSELF, limit):
            return
        stopped = on_path >= limit
        message = messages.recorded_below_itself(
            limit if stopped else RECORDS_BELOW_ITSELF, stopped
        )
        stats.record_event(stats.EventKind.PENDING_BACKWARD, message, self.name, self.source)

    def _fall_back(self, reason: str, args: list[Any]) -> Any:
        """Run un-graphed from now on (the thrash guard); the tree drops this callable's
        recordings."""
        self.policy.stop(reason)
        forget_callable(self.id)
        stats.counters["fallbacks"] += 1
        stats.record_event(stats.EventKind.FALLBACK, reason, self.name, self.source)
        self.policy.raise_if_asked(reason)
        return self.fn(args)

    def _static_positions(
        self,
        tree: GraphTree,
        args: list[Any],
        path_blocks: Mapping[int, Any],
        copied_from_now: Sequence[int] = (),
    ) -> list[int]:
        """The tensor inputs a recording here takes where they lie: parameters and buffers
        (unless their memory moves under them), outputs of earlier graphs on the path (unless
        they moved too often here, or do with this call: ``copied_from_now``), state kept or
        passed again."""
        copied_here = {*self.policy.copied_at.get(tree.current, ()), *copied_from_now}
        moving = self._moving_inputs(tree, args)
        return [
            i
            for i, arg in enumerate(args)
            if isinstance(arg, torch.Tensor)
            and (
                (i in self.static_inputs and i not in moving)
                or (arg.untyped_storage().data_ptr() in path_blocks and i not in copied_here)
                or arg in tree.kept_state
                or i in self._passed_again
            )
        ]

    def _moving_inputs(self, tree: GraphTree, args: list[Any]) -> list[int]:
        """The static inputs this callable only reads whose memory was seen to move under
        them: recordings copy them (``inputs.MovingStorages``)."""
        moving = tree.moving_storages
        return [i for i in self._read_only_static if moving.moved(args[i])]

    def _covered(
        self, tree: GraphTree, variants: list[GraphNode], args: list[Any]
    ) -> list[GraphNode]:
        """The variants that a recording of ``args`` made now would replace: each call they
        can replay, it can (its static inputs are theirs, at the same addresses)."""
        static = self._static_positions(tree, args, tree.current.path_blocks())
        return [node for node in variants if node.recording.matches_at(args, static)]

    def _unsafe_mutations(self, tree: GraphTree, args: list[Any]) -> list[int]:
        """The written inputs a recording here would copy without writing them back (a
        replay would write the copy): neither taken where they lie nor new at every call."""
        if not self.mutated_inputs:
            return []
        static = set(self._static_positions(tree, args, tree.current.path_blocks()))
        return [
            i
            for i in self.mutated_inputs
            if isinstance(args[i], torch.Tensor) and i not in static and i not in self._new_twice
        ]

    def _record(
        self, tree: GraphTree, key: tuple[int, ...], args: list[Any], decision: Decision
    ) -> Any:
        """Capture a new node below the current one (``decision``: admitted here). A
        re-record's reason is counted and said once the capture is made."""
        path_blocks = tree.current.path_blocks()
        tensor_inputs = [i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor)]
        objects = [i for i, arg in enumerate(args) if not isinstance(arg, (torch.Tensor, int))]
        static = self._static_positions(tree, args, path_blocks)
        copied = sorted(set(tensor_inputs) - set(static))
        # Written inputs that are new at every call are copied in and back at each replay
        # (``Recording``'s written-back inputs); no other written input is copied (``decide``).
        written_back = [i for i in self.mutated_inputs if i in copied and i in self._new_twice]
        copied = [i for i in copied if i not in written_back]
        rerecord_reason = decision.reason
        static_inputs = [StaticInput.of(args, i) for i in static]
        # State the graph writes (a cache's tensors, marked static or kept): not parameters,
        # not outputs of earlier graphs on the path (``recorded_state``).
        state_inputs = [
            (i, args[i])
            for i in static
            if i in self.mutated_inputs
            and not isinstance(args[i], torch.nn.Parameter)
            and args[i].untyped_storage().data_ptr() not in path_blocks
        ]
        self.policy.note_recorded(input_identity(args, static, objects))
        # The first replay needs only the copied inputs; the capture gets the only references
        # to the others (it may consume outputs of earlier graphs: see GraphTree.capture).
        first_replay_args = [
            arg if i in copied or i in written_back else None for i, arg in enumerate(args)
        ]
        object_inputs = [(i, args[i]) for i in objects]  # the graph bakes them in
        capture_args = list(args)
        # Each written-back input is captured over a tensor of the recording's own, outside
        # the pool, holding the caller's values (a capture that executes reads them).
        callers_written = {i: args[i] for i in written_back}
        written_buffers = {i: _same_layout_copy(args[i]) for i in written_back}
        for i, buffer in written_buffers.items():
            capture_args[i] = buffer
            if tree.backend.capture_executes:  # the capture was this call's run: no copy in
                first_replay_args[i] = buffer
        args.clear()
        input_buffers = InputBuffers(copied, copy_values=tree.backend.capture_executes)
        tree.initial_pool_bytes = self.policy.settings.initial_pool_bytes
        try:
            graph, captured_outputs, consumed = tree.capture(self.fn, capture_args, input_buffers)
        except Exception as error:
            for i, caller in callers_written.items():  # the un-graphed run writes the caller's
                capture_args[i] = caller
            return self._capture_failed(tree, error, capture_args)
        moving = [i for i in copied if i in self.static_inputs]  # copied: memory moves
        stats.counters["records"] += 1
        if rerecord_reason is not None:
            stats.counters["rerecords"] += 1
            stats.record_event(stats.EventKind.RERECORD, rerecord_reason, self.name, self.source)
        recording = Recording(
            graph,
            static_inputs=static_inputs,
            copied_inputs=copied,
            input_buffers=input_buffers.views,
            captured_outputs=captured_outputs,
            path_blocks=path_blocks,
            consumed_inputs=consumed,
            # Gradients: autograd makes one a parameter's .grad without a copy only when
            # nothing else (such as a kept output object) references it.
            reuse_output_objects=self.phase is not Phase.BACKWARD,
            object_inputs=object_inputs,
            state_inputs=state_inputs,
            keep_state_memory=self.policy.settings.keep_state_memory,
            written_back=list(written_buffers.items()),
            moving_inputs=moving,
            moving_buffers=input_buffers.still_referenced(moving),
        )
        del captured_outputs, capture_args, state_inputs
        node = tree.add_node(self.identity, key, recording)
        log.debug("inductor_xpugraph: recorded %s for sizes %s", self.name, key)
        trace_recording(node, tree.device, self.compile_id)
        # The capture computed nothing on a real device: this replay produces the result.
        outputs = recording.replay(first_replay_args)
        if tree.backend.capture_executes:
            for i, caller in callers_written.items():
                caller.copy_(written_buffers[i])
        del callers_written, written_buffers
        tree.recorded(node)
        return outputs

    def _capture_failed(self, tree: GraphTree, error: Exception, args: list[Any]) -> Any:
        """The device refused to record this callable (SYCL Graph records less than a CUDA
        capture does): the call runs un-graphed with its own arguments, which the tree gave
        back, and so does every later call; said once, counted every time. The tree records
        its other graphs again from a fresh pool from its next generation
        (``GraphTree.start_over``). With ``config.capture_failure_raises`` (or upstream's
        ``triton.cudagraph_or_error``) the caller gets the device's error instead, as before
        a graph existed."""
        raises = config.capture_failure_raises or self.policy.settings.raise_on_skip
        stats.counters["capture_failures"] += 1
        operator = operator_that_raised(error, self.fn)
        if operator is not None:
            unrecordable_ops.note_capture_failed_in(
                tree.backend.device_type, operator.name, messages.first_line(error)
            )
        reason = messages.capture_failed(tree.device, error, raises, operator)
        self.policy.stop(reason)
        stats.record_event(stats.EventKind.FALLBACK, reason, self.name, self.source)
        if raises:
            raise error
        return self._run_eagerly(tree, args)


def _same_layout_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` in memory of its own, with its sizes and strides."""
    copy = torch.empty_strided(
        tensor.size(), tensor.stride(), dtype=tensor.dtype, device=tensor.device
    )
    return copy.copy_(tensor)


def _set_pending_backward(tree: GraphTree) -> None:
    tree.generation.pending_backward = True


def _clear_pending_backward(tree: GraphTree) -> None:
    tree.generation.pending_backward = False


def _nothing(tree: GraphTree) -> None:
    pass
