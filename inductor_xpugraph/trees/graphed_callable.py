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
   covers (``inputs.MovingStorages``); once that memory settles, by one more that reads it
   where it lies again, replacing the copying one.

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

import itertools
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch._dynamo.mutation_guard import GenerationTracker
from torch._inductor.cudagraph_trees import MarkStepBox
from torch._inductor.utils import ALIGNMENT  # what Inductor's kernels assume of an input

from .. import config
from . import messages, stats
from .backends import unrecordable_ops
from .decision import (
    Action,
    Call,
    CallableFacts,
    Decision,
    Preamble,
    SizeNote,
    decide,
)
from .failed_operator import operator_that_raised
from .inputs import InputBuffers, InputNames, StaticInput, input_identity
from .kept_state import PassedAgain, stale_state_error
from .lifetime import ReleaseHandle, forget_callable, release
from .node import CallableIdentity, Phase
from .per_thread import thread_trees, tree_for, written_later
from .recording import Recording
from .recording_policy import RecordingPolicy, RecordingSettings
from .trace import trace_recording
from .tree import GraphTree

log = logging.getLogger("inductor_xpugraph")

_callable_ids = itertools.count()
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
        # What the rules of a call read of this callable (``decision``).
        self.facts = CallableFacts(
            self.id,
            self.static_inputs,
            self.mutated_inputs,
            self._may_be_state,
            self.input_names,
        )
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
        """Every call that does not replay at once: note what the call shows; then, unless
        this callable stopped recording for good, the tree settles the call and says where it
        stands, the policy answers once, ``decision.decide`` decides, and the decision is
        carried out."""
        self._observe(tree, args)
        if self.policy.stopped:
            return self.fn(args)
        if self._size_inputs is None:  # first call: find the size (int) inputs once
            self._size_inputs = tuple(i for i, arg in enumerate(args) if isinstance(arg, int))
            key = tuple([args[i] for i in self._size_inputs])
        view = tree.settle(self.id, key, args, self._read_only_static)
        answers = self.policy.answers(key, view.place, view.generation)
        call = Call(key, args, self._passed_again, self._new_twice)
        return self._carry_out(decide(view, self.facts, call, answers), tree, key, args)

    def _observe(self, tree: GraphTree, args: list[Any]) -> None:
        """What a call off the fast path shows, whatever it does next: state written in
        place (Note [Outputs kept as state]), and static inputs Inductor takes as aligned."""
        if self.mutated_inputs:
            self._raise_for_stale_state(args)
            self._passed_again = self._mutated_inputs_seen.note(args)
            self._new_twice = self._mutated_inputs_seen.new_twice
            tree.note_state_written(self.identity, args, self._may_be_state)
        if self.aligned_inputs:
            misaligned = [i for i in self.aligned_inputs if args[i].data_ptr() % ALIGNMENT]
            if misaligned:  # before anything runs
                words = self.input_names.describe(misaligned)
                raise ValueError(messages.misaligned_static_inputs(self.name, words, ALIGNMENT))

    # -- carrying a decision out --------------------------------------------------------------

    def _carry_out(
        self, decision: Decision, tree: GraphTree, key: tuple[int, ...], args: list[Any]
    ) -> Any:
        if decision.action is Action.REPLAY:
            if decision.keeps_copying is not None:
                for node in decision.candidates:
                    node.recording.keep_copying(decision.keeps_copying)
            for node in decision.candidates:  # the first whose reused memory is free now
                if not node.reused_outputs or node.try_release_reused_memory(args):
                    if decision.adopts_state:
                        node.recording.adopt_state(args)
                        stats.counters["adoptions"] += 1
                    outputs = node.recording.replay(args)
                    tree.replayed_variant(node)
                    return outputs
            decision = decision.otherwise
        self._note_preamble(decision.before, tree, key)
        action = decision.action
        if action is Action.RECORD:
            return self._record(tree, key, args, decision)
        if action is Action.WARM_UP:
            if decision.before.sizes is SizeNote.WARMUP:
                stats.counters["warmups"] += 1
                with self.policy.warming_up(key):
                    return self._run_eagerly(tree, args, warmup=True)
            return self._run_eagerly(tree, args, warmup=True)
        if action is Action.RUN_EAGERLY:
            return self._run_eagerly(tree, args)
        if action is Action.FALL_BACK:
            return self._fall_back(decision.fallback_reason, args)
        return self.fn(args)  # RUN_PLAIN (a skip was said by the preamble)

    def _note_preamble(self, before: Preamble, tree: GraphTree, key: tuple[int, ...]) -> None:
        """What comes before a decision's action, in the order ``Preamble`` lists it."""
        policy = self.policy
        if before.sizes is not None:
            if before.warns_of_sizes:
                policy.warn_of_sizes()
            policy.count_sizes(key, warmup=before.sizes is SizeNote.WARMUP)
        for node in before.drops:
            tree.drop_node(node)
        if before.counts_replacement:
            stats.counters["replacements"] += 1
        if before.counts_replacing_record:
            policy.note_replacing_record()
        if before.managed_moves and policy.count_managed_moves(
            tree.current, before.managed_moves, before.managed_reached
        ):
            words = self.input_names.describe(list(before.managed_reached))
            log.info(messages.managed_inputs_copied(words, policy.settings.managed_limit))
        if before.counts_rerecord:
            policy.note_rerecord(tree.generations_started)
        if before.evicts is not None:
            tree.evict_variant(before.evicts)
        if before.returns_evicted and tree.take_evicted(self.id, key) and before.counts_returned:
            policy.note_rerecord(tree.generations_started)
        if before.pending_backward_note is not None:
            note = before.pending_backward_note
            stats.record_event(stats.EventKind.PENDING_BACKWARD, note, self.name, self.source)
        if before.leaves is not None:
            tree.leave(before.leaves, self.name, self.source)
        if before.skip is not None:
            policy.skip(before.skip.reason, level=before.skip.level)

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

    def _fall_back(self, reason: str, args: list[Any]) -> Any:
        """Run un-graphed from now on (the thrash guard); the tree drops this callable's
        recordings."""
        self.policy.stop(reason)
        forget_callable(self.id)
        stats.counters["fallbacks"] += 1
        stats.record_event(stats.EventKind.FALLBACK, reason, self.name, self.source)
        self.policy.raise_if_asked(reason)
        return self.fn(args)

    def _record(
        self, tree: GraphTree, key: tuple[int, ...], args: list[Any], decision: Decision
    ) -> Any:
        """Capture a new node below the current one (``decision``: admitted here). A
        re-record's reason is counted and said once the capture is made."""
        path_blocks = tree.current.path_blocks()
        tensor_inputs = [i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor)]
        objects = [i for i, arg in enumerate(args) if not isinstance(arg, (torch.Tensor, int))]
        static = list(decision.static)
        copied = sorted(set(tensor_inputs) - set(static))
        # Written inputs that are new at every call are copied in and back at each replay
        # (``Recording``'s written-back inputs); no other written input is copied (``decision``).
        written_back = [i for i in self.mutated_inputs if i in copied and i in self._new_twice]
        copied = [i for i in copied if i not in written_back]
        rerecord_reason = decision.rerecord_reason
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
        moving = [i for i in copied if i in self.static_inputs]  # copied: memory moves
        # Replays watch those settle, unless one is restless (``inputs.MovingStorages``).
        may_settle = all(tree.moving_storages.may_settle(args[i]) for i in moving)
        args.clear()
        input_buffers = InputBuffers(copied, copy_values=tree.backend.capture_executes)
        tree.initial_pool_bytes = self.policy.settings.initial_pool_bytes
        try:
            graph, captured_outputs, consumed = tree.capture(self.fn, capture_args, input_buffers)
        except Exception as error:
            for i, caller in callers_written.items():  # the un-graphed run writes the caller's
                capture_args[i] = caller
            return self._capture_failed(tree, error, capture_args)
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
            watch_settling=tree.moving_storages if may_settle else None,
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
