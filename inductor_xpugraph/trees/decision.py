"""What one call of a graphed callable does, decided by plain functions over plain values.

A call that does not replay at once (``GraphedCallable._slow_path``) goes through three steps:

1. its tree *settles* the call and hands back a ``TreeView``: a frozen value of where the call
   stands (on the path, warming up, off the tree), the recordings there for this callable and
   sizes, whether a capture may be placed there, what is kept as state and what moves, the
   pending backward and the generation (``GraphTree.settle``);
2. the callable's recording policy answers, once, what it says of the call
   (``PolicyAnswers``: the sizes, warmups, the thrash guard, the inputs another graph
   produced that keep moving);
3. ``decide`` reads the two, with the callable's facts (``CallableFacts``) and the call
   (``Call``), and returns a ``Decision``. Deciding changes nothing: no count, no node, no
   message. The callable then carries the decision out: first its ``Preamble`` (what is
   counted, dropped, evicted, said), then its action.

The actions (``Action``):

- ``REPLAY``: launch a recording of this place (one whose reused memory is free now; where
  none is, ``otherwise`` says what to do instead), after moving the call's new state into
  its memory when ``adopts_state`` (Note [State moved into a recording's memory]);
- ``RECORD``: capture a new child of the current node; ``kind`` says why there is none to
  replay; ``static`` the inputs it takes where they lie;
- ``WARM_UP``: run un-graphed before recording (in the pool where the tree can);
- ``RUN_EAGERLY``: run un-graphed inside the tree's generation: the outputs go stale with it,
  as replayed ones do (the preamble's ``leaves`` may take the rest of the generation off the
  tree first);
- ``RUN_PLAIN``: run the callable as without graphs (a skip, said once by the preamble; a
  capture under way);
- ``FALL_BACK``: the thrash guard stops this callable's recording for good.

The rules, in the order ``decide`` applies them: someone capturing, a device that stopped
recording, a generation off the tree, warmups still held (``_while_warmups_are_held``), a
place where the callable's inputs kept moving; a recording here for these addresses
(``_replay_a_match``); recordings here for other addresses, or copying inputs whose memory
has settled (``_new_addresses``); sizes the policy refuses; a warmup; a first record. Every
record passes ``_record_or_not``, which keeps its preamble and says what stops it.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Container, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .. import config
from . import messages
from .kept_state import describe_holders

if TYPE_CHECKING:
    from .inputs import InputNames
    from .node import GraphNode

# Recordings of one callable on the current path from which a record below them is reported
# (a model may call one graph several times per step: layers sharing compiled code).
RECORDS_BELOW_ITSELF = 8


class Action(enum.Enum):
    REPLAY = "replay"
    RECORD = "record"
    WARM_UP = "warm up"
    RUN_EAGERLY = "run eagerly"
    RUN_PLAIN = "run plain"
    FALL_BACK = "fall back"


class RecordKind(enum.Enum):
    """Why a recording is made, which decides what it replaces and who counts it."""

    FIRST = "first"  # nothing recorded here for these sizes
    LIVENESS = "liveness"  # recorded here, but every recording reuses memory still referenced
    STATE_DIED = "state died"  # the recordings here read state that is gone
    MOVING_MEMORY = "moving memory"  # static inputs whose memory moves: copied from now on
    SETTLED_MEMORY = "settled memory"  # the copied moving inputs settled: read where they lie
    VARIANT = "variant"  # static inputs at addresses no recording here has

    @property
    def counts_itself(self) -> bool:
        """Whether the thrash guard counts this record by its own rule (a variant), or never
        (memory that moves or settles: once per place); either way a recording it brings back
        from an evicted variant is not counted again."""
        return self in (RecordKind.MOVING_MEMORY, RecordKind.SETTLED_MEMORY, RecordKind.VARIANT)


class Leave(enum.Enum):
    """Why the rest of the generation leaves the tree before an eager run."""

    LIVE_MEMORY = "live memory"  # every recording here reuses memory still referenced
    LENT_MEMORY = "lent memory"  # a capture here could land in memory lent to another branch
    PENDING_BACKWARD = "pending backward"  # the tree may not grow further below this callable


class Position(enum.Enum):
    """Where a generation stands in its tree."""

    ON_PATH = "on the path"  # at the root or a recording: graphs replay and record below it
    WARMING_UP = "warming up"  # a warmup's outputs lie in the pool: no graph may run
    OFF_TREE = "off the tree"  # the rest of the generation runs un-graphed


class SizeNote(enum.Enum):
    """What the policy counts of a call's sizes."""

    WARMUP = "one warmup more"  # this call is one of the warmups for its sizes
    RECORDABLE = "warmed up"  # sizes seen, their warmups done


@dataclasses.dataclass(frozen=True)
class TreeView:
    """Where a call stands in its device's tree, settled (``GraphTree.settle``): everything
    ``decide`` reads of the tree. Nodes and the kept state are read, never changed."""

    position: Position
    device: str
    capturing: bool = False  # someone captures the device's stream now
    cannot_record: str | None = None  # why the device stopped recording, if it did
    # On the path: the node a recording goes below, and the recordings there for this
    # callable and sizes (the one used last first), those whose static inputs are at the
    # call's addresses, and those whose state the caller dropped.
    place: GraphNode | None = None
    variants: tuple[GraphNode, ...] = ()
    matching: tuple[GraphNode, ...] = ()
    dead: tuple[GraphNode, ...] = ()
    can_capture: bool = False  # the memory strategy admits a capture below ``place``
    capture_refusal: str | None = None  # why the backend cannot capture these inputs
    kept_state: Container[torch.Tensor] = ()  # tensors kept as state (Note [Outputs kept as state])
    moving: frozenset[int] = frozenset()  # read-only static inputs whose memory moves
    # Recordings here for the call's static inputs whose copied moving inputs settled.
    settled: tuple[GraphNode, ...] = ()
    evicted_here: bool = False  # a recording of this callable and sizes went with an eviction
    pending_backward: bool = False  # a backward of this generation may still run
    records_below_itself: int = 0  # times this callable is on the path (pending backward)
    calls_warming_up: int = 0  # calls run since a warmup left outputs in the pool
    generation: int = 0  # generations started on this tree: the thrash guard's clock


@dataclasses.dataclass(frozen=True)
class CallableFacts:
    """What a graphed callable is, fixed when it is loaded (``GraphedCallable``)."""

    callable_id: int
    static_inputs: frozenset[int]
    mutated_inputs: tuple[int, ...]
    # Written inputs that may hold an output of the step before (not parameters or buffers).
    may_be_state: tuple[int, ...]
    input_names: InputNames


@dataclasses.dataclass(frozen=True)
class Call:
    """One call: its sizes, its arguments, and what its written inputs showed."""

    key: tuple[int, ...]
    args: Sequence[Any]
    passed_again: frozenset[int] = frozenset()  # written inputs holding the call before's
    new_twice: frozenset[int] = frozenset()  # written inputs new at this call and the one before


@dataclasses.dataclass(frozen=True)
class PolicyAnswers:
    """What the recording policy says of one call (``RecordingPolicy.answers``), asked once:
    ``decide`` asks the policy nothing else, and the preamble counts what was answered."""

    size_refusal: tuple[str, int | None] | None  # why these sizes may not be graphed, and level
    warms_up: bool  # a call for these sizes now is a warmup
    one_size_too_many: bool  # these sizes are new and pass the warning limit
    ungraphed_here: bool  # the callable's inputs kept moving at this place ("skip")
    copied_here: frozenset[int]  # inputs another graph produced, copied at this place
    rerecord_stops: bool  # one more re-record now would be too many
    rerecord_span: int  # generations the guard's re-records span, with one more now
    limits: tuple[int, str]  # the guard's limit, and its settings named
    address_sets_seen: frozenset[tuple[int, ...]]  # of every recording made
    managed_limit: int | None  # moves of a produced input before it is copied or skipped
    managed_action: str  # "copy" or "skip"
    managed_counts: Mapping[int, int]  # moves so far at this place, by input

    def managed_moves(
        self, produced: Sequence[int], copyable: bool
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Of the inputs another graph produced that moved here: those counted, and those one
        more move brings to ``managed_limit`` (copied from now on, or skipped here)."""
        if not self.managed_limit or not produced:
            return (), ()
        if self.managed_action == "copy" and not copyable:
            return (), ()
        counted = tuple(i for i in produced if i not in self.copied_here)
        limit = self.managed_limit
        return counted, tuple(i for i in counted if self.managed_counts.get(i, 0) + 1 >= limit)


@dataclasses.dataclass(frozen=True)
class Skip:
    """A call that runs un-graphed: counted every time, said once (``RecordingPolicy.skip``)."""

    reason: str
    level: int | None = None  # None: the skip's own


@dataclasses.dataclass(frozen=True)
class Preamble:
    """What is noted before a decision's action, in this order."""

    sizes: SizeNote | None = None  # counted for the call's sizes
    warns_of_sizes: bool = False  # these sizes are one too many: a warning
    drops: tuple[GraphNode, ...] = ()  # recordings the new one replaces
    counts_replacement: bool = False  # the drops read state that died ("replacements")
    counts_replacing_record: bool = False  # memory that moves: in ``rerecords``, not the guard
    managed_moves: tuple[int, ...] = ()  # inputs another graph produced, moved here once more
    managed_reached: tuple[int, ...] = ()  # those of them that reach the limit now
    counts_rerecord: bool = False  # on the thrash guard's clock
    evicts: GraphNode | None = None  # the variant the bound on variants pushes out
    # The record may make again a recording that went with an evicted variant: the tree
    # stops owing it, and the guard counts it unless the record counts itself.
    returns_evicted: bool = False
    counts_returned: bool = False
    pending_backward_note: str | None = None  # said once: the step cannot end and grows
    leaves: Leave | None = None  # the rest of the generation leaves the tree
    skip: Skip | None = None  # said last


NOTHING_BEFORE = Preamble()


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    before: Preamble = NOTHING_BEFORE
    # REPLAY: the recordings that match, of which the first whose reused memory is free
    # replays; ``otherwise`` is what to do when none can; the call's state moves into the
    # recording's memory first when ``adopts_state``.
    candidates: tuple[GraphNode, ...] = ()
    otherwise: Decision | None = None
    adopts_state: bool = False
    # REPLAY: the candidates copy inputs that settled, but cannot be replaced here now: why
    # (they match calls again and copy for good).
    keeps_copying: str | None = None
    # RECORD: why, the inputs taken where they lie, and a re-record's words (said and
    # counted once the capture is made).
    kind: RecordKind | None = None
    static: tuple[int, ...] = ()
    rerecord_reason: str | None = None
    fallback_reason: str | None = None  # FALL_BACK: said and counted


PLAIN = Decision(Action.RUN_PLAIN)
EAGERLY = Decision(Action.RUN_EAGERLY)
LEAVE_FOR_LIVE_MEMORY = Decision(Action.RUN_EAGERLY, Preamble(leaves=Leave.LIVE_MEMORY))


def decide(view: TreeView, facts: CallableFacts, call: Call, answers: PolicyAnswers) -> Decision:
    """What ``call`` does where ``view`` says it stands. Changes nothing."""
    if view.capturing:  # a capture never nests: the call runs inside theirs
        return PLAIN
    if view.cannot_record:  # un-graphed on the whole device, said once per graph
        reason = messages.device_stopped_recording(view.device, view.cannot_record)
        return _skip(reason, logging.INFO)
    if view.position is Position.OFF_TREE:
        return EAGERLY
    if view.position is Position.WARMING_UP:
        return _while_warmups_are_held(view, answers)
    if answers.ungraphed_here:  # its inputs kept moving here ("skip")
        return PLAIN
    if view.matching:
        return _replay_a_match(view, facts, call, answers)
    if view.variants:
        return _new_addresses(view, facts, call, answers)
    if answers.size_refusal is not None:
        return _skip(*answers.size_refusal)
    if answers.warms_up:
        return Decision(Action.WARM_UP, _sizes(SizeNote.WARMUP, answers))
    record = Decision(Action.RECORD, _sizes(SizeNote.RECORDABLE, answers), kind=RecordKind.FIRST)
    return _record_or_not(view, facts, call, answers, record)


def _while_warmups_are_held(view: TreeView, answers: PolicyAnswers) -> Decision:
    """A warmup's outputs are still held (``GraphTree.warm_up``): no graph may run, and the
    call runs un-graphed in the pool, counted as a warmup where it is one."""
    if answers.size_refusal is None and answers.warms_up:
        return Decision(Action.WARM_UP, _sizes(SizeNote.WARMUP, answers))
    if answers.size_refusal is not None:
        before = Preamble(skip=Skip(*answers.size_refusal))
    else:
        before = _sizes(SizeNote.RECORDABLE, answers)
    if view.calls_warming_up == RECORDS_BELOW_ITSELF:
        before = dataclasses.replace(before, pending_backward_note=messages.WARMUP_OUTPUTS_HELD)
    return Decision(Action.WARM_UP, before)


def _replay_a_match(
    view: TreeView, facts: CallableFacts, call: Call, answers: PolicyAnswers
) -> Decision:
    """Recorded here for these addresses: replay. When every recording reuses memory that
    is still referenced now, record one that does not, within the bound on variants; beyond
    it, evicting would let alternating liveness patterns record at every call, so the rest
    of the step runs un-graphed instead."""
    if len(view.variants) >= config.static_input_variants:
        otherwise = LEAVE_FOR_LIVE_MEMORY
    else:
        record = Decision(
            Action.RECORD, kind=RecordKind.LIVENESS, rerecord_reason=messages.LIVENESS_VARIANT
        )
        otherwise = _record_or_not(view, facts, call, answers, record)
    return Decision(Action.REPLAY, candidates=view.matching, otherwise=otherwise)


def _new_addresses(
    view: TreeView, facts: CallableFacts, call: Call, answers: PolicyAnswers
) -> Decision:
    """Recorded here, but a static input has an address no recording has.

    A recording whose state died (a cache made for one ``generate`` call and dropped with
    it) takes the call's new state into its memory and replays, when the new state is laid
    out as the dead one was (Note [State moved into a recording's memory] in
    ``recorded_state``). Otherwise a new recording is made for the new addresses, beside the
    others, or *replacing* the dead ones: when each replayed, recording paid off and a
    replacement is not counted by the thrash guard; one that never replayed is churn, counted
    as any re-record. Memory that moves under its tensor (FSDP2) is copied by one recording
    that replaces the ones it covers, recorded again once per place, so not on the guard's
    clock. A call that could not be recorded (it writes tensors it was not passed before) is
    not counted."""
    args, dead = call.args, view.dead
    adopting = next((node for node in dead if node.recording.can_adopt_state(args)), None)
    if adopting is not None:
        return Decision(
            Action.REPLAY, candidates=(adopting,), otherwise=LEAVE_FOR_LIVE_MEMORY,
            adopts_state=True,
        )  # fmt: skip
    if facts.mutated_inputs:
        static = static_positions(view, facts, call, answers.copied_here)
        unsafe = _unsafe_mutations(static, facts, call)
        if unsafe:
            words = facts.input_names.describe(unsafe, shown=2)
            return _skip(messages.unsafe_mutation(words))
    if view.settled:
        return _read_settled_in_place(view, facts, call, answers)
    if dead and all(node.replays for node in dead):
        before = Preamble(drops=dead, counts_replacement=True)
        record = Decision(Action.RECORD, before, kind=RecordKind.STATE_DIED)
        return _record_or_not(view, facts, call, answers, record)
    variants = [node for node in view.variants if node not in dead] or list(dead)
    moved, replaced = variants[0].recording.changed_inputs(args)
    if view.moving and not replaced and set(moved) <= view.moving:
        static = static_positions(view, facts, call, answers.copied_here)
        covered = [node for node in variants if node.recording.matches_at(args, static)]
        variants = [node for node in variants if node not in covered]
        full = len(variants) >= config.static_input_variants
        before = Preamble(
            drops=dead + tuple(node for node in covered if node not in dead),
            counts_replacing_record=True,
            evicts=variants[-1] if full else None,
        )
        words = facts.input_names.describe(moved, shown=2)
        record = Decision(
            Action.RECORD, before, kind=RecordKind.MOVING_MEMORY,
            rerecord_reason=messages.moving_inputs_copied(words),
        )  # fmt: skip
        return _record_or_not(view, facts, call, answers, record)
    produced = tuple(i for i in moved if i not in facts.static_inputs)  # by earlier graphs
    counted, reached = answers.managed_moves(produced, not facts.mutated_inputs)
    managed = Preamble(drops=dead, managed_moves=counted, managed_reached=reached)
    if reached and answers.managed_action == "skip":
        words = facts.input_names.describe(list(reached))
        skip = Skip(messages.managed_inputs_skip(words, answers.managed_limit))
        return Decision(Action.RUN_PLAIN, dataclasses.replace(managed, skip=skip))
    rerecord = dataclasses.replace(managed, counts_rerecord=True)
    if answers.rerecord_stops:
        return Decision(
            Action.FALL_BACK, rerecord,
            fallback_reason=_fallback_for_new_addresses(facts, call, answers, variants[0], moved,
                                                        replaced, dead),
        )  # fmt: skip
    full = len(variants) >= config.static_input_variants and variants[-1] not in dead
    record = Decision(
        Action.RECORD,
        dataclasses.replace(rerecord, evicts=variants[-1] if full else None),
        kind=RecordKind.VARIANT,
        rerecord_reason=messages.rerecord(facts.input_names.changed(moved, replaced)),
    )
    copied_from_now = reached if answers.managed_action == "copy" else ()
    return _record_or_not(view, facts, call, answers, record, copied_from_now)


def _read_settled_in_place(
    view: TreeView, facts: CallableFacts, call: Call, answers: PolicyAnswers
) -> Decision:
    """The inputs whose memory moved before the record, which recordings here copy, stayed
    at the record's addresses since (``inputs.SettlingWatch``): one recording that reads them
    where they lie replaces those. Not on the guard's clock: once per place, as a storage that
    moves off where it settled is copied for good (``inputs.MovingStorages``). The recordings
    copy for good, and replay, where the call has one of those inputs elsewhere than where it
    settled (it moved again), or where no capture can go (it would record the tree again,
    without lending memory)."""
    settled = view.settled
    inputs = sorted({i for node in settled for i in node.recording.moving_inputs})
    moved_again = any(i in view.moving for i in inputs)
    if moved_again or not view.can_capture:
        why = messages.SETTLED_MOVED_AGAIN if moved_again else messages.SETTLED_NO_CAPTURE
        return Decision(
            Action.REPLAY, candidates=settled, otherwise=LEAVE_FOR_LIVE_MEMORY, keeps_copying=why
        )
    before = Preamble(drops=settled, counts_replacing_record=True)
    words = facts.input_names.describe(inputs, shown=2)
    record = Decision(
        Action.RECORD, before, kind=RecordKind.SETTLED_MEMORY,
        rerecord_reason=messages.settled_inputs_read_in_place(words),
    )  # fmt: skip
    return _record_or_not(view, facts, call, answers, record)


def _fallback_for_new_addresses(
    facts: CallableFacts,
    call: Call,
    answers: PolicyAnswers,
    last_used: GraphNode,
    moved: list[int],
    replaced: list[int],
    dead: tuple[GraphNode, ...],
) -> str:
    """The thrash guard's words when new addresses are one re-record too many: an address
    set seen before, recorded here and dropped since by the bound (not state that died: new
    state at a freed state's addresses is new all the same), or inputs that keep moving."""
    args = call.args
    state = [i for i in moved if i in facts.may_be_state]
    dropped = not dead and last_used.recording.input_identity(args) in answers.address_sets_seen
    if dropped and not state:
        return messages.fallback_for_evicted_rerecords(answers.rerecord_span, *answers.limits)
    holders = describe_holders(args[state[0]]) if state else None
    words = facts.input_names.describe(moved + replaced, shown=2)
    return messages.fallback_for_moving_inputs(
        words, holders, answers.rerecord_span, *answers.limits
    )


def _record_or_not(
    view: TreeView,
    facts: CallableFacts,
    call: Call,
    answers: PolicyAnswers,
    record: Decision,
    copied_from_now: Sequence[int] = (),
) -> Decision:
    """``record``, or what stops it, keeping what comes before it (``record``'s drops,
    eviction and counts): a written input it would copy without writing back, the
    backend's refusal, memory lent to another branch, the thrash guard (a recording that
    went with an evicted variant, not counted yet), or a step that cannot end and has
    grown too deep below this callable. ``copied_from_now``: inputs that another graph
    produced, which ``record``'s managed moves make copied here."""
    before = record.before
    static = static_positions(view, facts, call, answers.copied_here | set(copied_from_now))
    unsafe = _unsafe_mutations(static, facts, call)
    if unsafe:
        words = facts.input_names.describe(unsafe, shown=2)
        return Decision(Action.RUN_PLAIN, _with_skip(before, messages.unsafe_mutation(words)))
    if view.capture_refusal is not None:
        return Decision(Action.RUN_PLAIN, _with_skip(before, view.capture_refusal))
    if not view.can_capture:
        return Decision(Action.RUN_EAGERLY, dataclasses.replace(before, leaves=Leave.LENT_MEMORY))
    counts_itself = record.kind is not None and record.kind.counts_itself
    admitted = dataclasses.replace(before, returns_evicted=True, counts_returned=not counts_itself)
    if not counts_itself and view.evicted_here and answers.rerecord_stops:
        reason = messages.fallback_for_evicted_rerecords(answers.rerecord_span, *answers.limits)
        return Decision(Action.FALL_BACK, admitted, fallback_reason=reason)
    if view.pending_backward:
        admitted = dataclasses.replace(admitted, pending_backward_note=_records_below_note(view))
        if view.records_below_itself >= config.pending_backward_records_limit:
            leave = dataclasses.replace(admitted, leaves=Leave.PENDING_BACKWARD)
            return Decision(Action.RUN_EAGERLY, leave)
    return dataclasses.replace(record, before=admitted, static=tuple(static))


def static_positions(
    view: TreeView, facts: CallableFacts, call: Call, copied_here: Container[int]
) -> list[int]:
    """The tensor inputs a recording here takes where they lie: parameters and buffers
    (unless their memory moves under them), outputs of earlier graphs on the path (unless
    they moved too often here: ``copied_here``), state kept or passed again."""
    path_blocks = view.place.path_blocks() if view.place is not None else {}
    static, moving, kept = facts.static_inputs, view.moving, view.kept_state
    return [
        i
        for i, arg in enumerate(call.args)
        if isinstance(arg, torch.Tensor)
        and (
            (i in static and i not in moving)
            or (arg.untyped_storage().data_ptr() in path_blocks and i not in copied_here)
            or arg in kept
            or i in call.passed_again
        )
    ]


def _unsafe_mutations(static: Sequence[int], facts: CallableFacts, call: Call) -> list[int]:
    """The written inputs a recording here would copy without writing them back (a replay
    would write the copy): neither taken where they lie nor new at every call."""
    taken = set(static)
    return [
        i
        for i in facts.mutated_inputs
        if isinstance(call.args[i], torch.Tensor) and i not in taken and i not in call.new_twice
    ]


def _records_below_note(view: TreeView) -> str | None:
    """Said once this callable is on the path ``RECORDS_BELOW_ITSELF`` times in a step that
    cannot end (a backward may still read what its forwards left: Note [A backward that can no
    longer run]), as upstream warns, and when ``config.pending_backward_records_limit`` stops
    the tree growing."""
    on_path, limit = view.records_below_itself, config.pending_backward_records_limit
    if on_path < min(RECORDS_BELOW_ITSELF, limit):
        return None
    stopped = on_path >= limit
    return messages.recorded_below_itself(limit if stopped else RECORDS_BELOW_ITSELF, stopped)


def _sizes(note: SizeNote, answers: PolicyAnswers) -> Preamble:
    return Preamble(sizes=note, warns_of_sizes=answers.one_size_too_many)


def _skip(reason: str, level: int | None = None) -> Decision:
    return Decision(Action.RUN_PLAIN, Preamble(skip=Skip(reason, level)))


def _with_skip(before: Preamble, reason: str) -> Preamble:
    return dataclasses.replace(before, skip=Skip(reason))
