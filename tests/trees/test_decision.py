"""The rules of a call (``trees.decision``): ``decide`` over views built by hand, with no tree.

Each test builds where a call stands (``TreeView``), what the callable is (``CallableFacts``),
the call (``Call``) and what the policy answers (``PolicyAnswers``), and checks the one
``Decision`` that follows: its action and what comes before it. The recordings in a view are
stand-ins that answer from the addresses they were recorded at, as a ``Recording`` does. The
last test carries decisions out through a graphed callable on the emulator.
"""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph import config
from inductor_xpugraph.trees import graphify
from inductor_xpugraph.trees.decision import (
    Action,
    Call,
    CallableFacts,
    Leave,
    PolicyAnswers,
    Position,
    RecordKind,
    SizeNote,
    TreeView,
    decide,
)
from inductor_xpugraph.trees.inputs import InputNames


class Recorded:
    """A recording's answers about a call's inputs, from the addresses of the static inputs it
    was recorded at (``Recording``'s ``static_inputs_match``, ``changed_inputs`` and the
    rest); state that died, and whether new state could move in, as set."""

    def __init__(self, addresses, *, state_died=False, adoptable=False):
        self.addresses = dict(addresses)
        self.dead, self.adoptable = state_died, adoptable

    def static_inputs_match(self, args):
        return not self.changed_inputs(args)[0]

    def changed_inputs(self, args):
        return [i for i, ptr in self.addresses.items() if args[i].data_ptr() != ptr], []

    def matches_at(self, args, positions):
        return all(self.addresses.get(i) == args[i].data_ptr() for i in positions)

    def input_identity(self, args):
        return tuple(args[i].data_ptr() for i in sorted(self.addresses))

    def can_adopt_state(self, args):
        return self.dead and self.adoptable


def node(args, *, replays=1, **state):
    """A recording of this callable here, at the addresses of ``args``' input 1."""
    return SimpleNamespace(recording=Recorded({1: args[1].data_ptr()}, **state), replays=replays)


PLACE = SimpleNamespace(path_blocks=dict)  # the root: no outputs of earlier graphs
FACTS = CallableFacts(
    callable_id=0,
    static_inputs=frozenset({1}),
    mutated_inputs=(),
    may_be_state=(),
    input_names=InputNames({1: "w, read by the weight"}),
)
ANSWERS = PolicyAnswers(
    size_refusal=None,
    warms_up=False,
    one_size_too_many=False,
    ungraphed_here=False,
    copied_here=frozenset(),
    rerecord_stops=False,
    rerecord_span=1,
    limits=(8, "rerecord_limit=8"),
    address_sets_seen=frozenset(),
    managed_limit=5,
    managed_action="copy",
    managed_counts={},
)


def on_path(**fields):
    return TreeView(Position.ON_PATH, "cpu:0", **{"place": PLACE, "can_capture": True, **fields})


def call(*tensors, **fields):
    return Call((), list(tensors), **fields)


def answers(**fields):
    return dataclasses.replace(ANSWERS, **fields)


@pytest.fixture
def args():
    return [torch.randn(4, 16), torch.randn(8, 16)]  # an input copied, a weight


# -- where the call stands ------------------------------------------------------------------------


def test_a_call_inside_someones_capture_runs_plain_and_says_nothing(args):
    view = TreeView(Position.ON_PATH, "cpu:0", capturing=True)
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert decision.action is Action.RUN_PLAIN and decision.before.skip is None


def test_a_device_that_stopped_recording_skips_the_call_naming_the_device(args):
    view = TreeView(Position.ON_PATH, "cpu:0", cannot_record="a capture failed")
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert decision.action is Action.RUN_PLAIN
    assert "cpu:0" in decision.before.skip.reason and decision.before.skip.level == logging.INFO


def test_off_the_tree_a_call_runs_eagerly_in_its_generation(args):
    decision = decide(TreeView(Position.OFF_TREE, "cpu:0"), FACTS, call(*args), ANSWERS)
    assert decision.action is Action.RUN_EAGERLY and decision.before.leaves is None


def test_while_warmups_are_held_a_warmup_is_counted_as_one(args):
    view = TreeView(Position.WARMING_UP, "cpu:0")
    decision = decide(view, FACTS, call(*args), answers(warms_up=True))
    assert (decision.action, decision.before.sizes) == (Action.WARM_UP, SizeNote.WARMUP)


def test_while_warmups_are_held_a_refused_size_still_runs_in_the_pool_and_says_why(args):
    view = TreeView(Position.WARMING_UP, "cpu:0")
    decision = decide(view, FACTS, call(*args), answers(size_refusal=("too many sizes", None)))
    assert decision.action is Action.WARM_UP and decision.before.sizes is None
    assert decision.before.skip.reason == "too many sizes"


def test_the_eighth_call_held_by_warmups_says_why_it_runs_ungraphed(args):
    views = [TreeView(Position.WARMING_UP, "cpu:0", calls_warming_up=n) for n in (7, 8, 9)]
    decisions = [decide(view, FACTS, call(*args), ANSWERS) for view in views]
    notes = [d.before.pending_backward_note is not None for d in decisions]
    assert notes == [False, True, False]


def test_where_the_inputs_kept_moving_the_callable_runs_plain(args):
    decision = decide(on_path(), FACTS, call(*args), answers(ungraphed_here=True))
    assert decision.action is Action.RUN_PLAIN


# -- sizes: warm up, then record ------------------------------------------------------------------


def test_a_first_call_warms_up_and_counts_the_warmup(args):
    decision = decide(on_path(), FACTS, call(*args), answers(warms_up=True))
    assert (decision.action, decision.before.sizes) == (Action.WARM_UP, SizeNote.WARMUP)


def test_after_its_warmups_a_call_records_taking_its_weight_where_it_lies(args):
    decision = decide(on_path(), FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.kind) == (Action.RECORD, RecordKind.FIRST)
    assert decision.static == (1,) and decision.before.sizes is SizeNote.RECORDABLE
    assert decision.before.returns_evicted and decision.before.counts_returned


def test_sizes_the_policy_refuses_run_plain_with_its_words_and_level(args):
    refusal = answers(size_refusal=("not a capture size", logging.DEBUG))
    decision = decide(on_path(), FACTS, call(*args), refusal)
    assert decision.action is Action.RUN_PLAIN
    assert (decision.before.skip.reason, decision.before.skip.level) == (
        "not a capture size",
        logging.DEBUG,
    )


def test_sizes_one_too_many_are_warned_of_with_their_first_warmup(args):
    decision = decide(on_path(), FACTS, call(*args), answers(warms_up=True, one_size_too_many=True))
    assert decision.before.warns_of_sizes


# -- a recording here for these addresses ---------------------------------------------------------


def test_a_recording_at_the_calls_addresses_replays(args):
    recorded = node(args)
    view = on_path(variants=(recorded,), matching=(recorded,))
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.candidates) == (Action.REPLAY, (recorded,))


def test_when_no_match_can_replay_a_liveness_variant_is_recorded(args):
    recorded = node(args)
    view = on_path(variants=(recorded,), matching=(recorded,))
    otherwise = decide(view, FACTS, call(*args), ANSWERS).otherwise
    assert (otherwise.action, otherwise.kind) == (Action.RECORD, RecordKind.LIVENESS)


def test_when_no_match_can_replay_and_variants_are_full_the_generation_leaves(args):
    variants = tuple(node(args) for _ in range(config.static_input_variants))
    view = on_path(variants=variants, matching=variants)
    otherwise = decide(view, FACTS, call(*args), ANSWERS).otherwise
    assert (otherwise.action, otherwise.before.leaves) == (Action.RUN_EAGERLY, Leave.LIVE_MEMORY)


# -- recordings here for other addresses ----------------------------------------------------------


def test_a_weight_at_a_new_address_records_a_variant_on_the_guards_clock(args):
    view = on_path(variants=(node([args[0], args[1].clone()]),))
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.kind) == (Action.RECORD, RecordKind.VARIANT)
    assert decision.before.counts_rerecord and not decision.before.counts_returned
    assert "input 1 (w, read by the weight)" in decision.rerecord_reason


def test_a_variant_past_the_bound_evicts_the_one_used_least_recently(args):
    variants = tuple(node([args[0], args[1].clone()]) for _ in range(config.static_input_variants))
    decision = decide(on_path(variants=variants), FACTS, call(*args), ANSWERS)
    assert decision.before.evicts is variants[-1]


def test_one_rerecord_too_many_falls_back_naming_the_input_that_moved(args):
    view = on_path(variants=(node([args[0], args[1].clone()]),))
    decision = decide(view, FACTS, call(*args), answers(rerecord_stops=True, rerecord_span=3))
    assert decision.action is Action.FALL_BACK and decision.before.counts_rerecord
    assert "input 1" in decision.fallback_reason


def test_an_address_set_dropped_by_the_bound_falls_back_saying_so(args):
    seen = frozenset({(args[1].data_ptr(),)})
    view = on_path(variants=(node([args[0], args[1].clone()]),))
    decision = decide(
        view, FACTS, call(*args), answers(rerecord_stops=True, address_sets_seen=seen)
    )
    assert "dropped to keep at most" in decision.fallback_reason


def test_new_state_laid_out_as_a_dead_recordings_moves_into_it_and_replays(args):
    dead = node([args[0], args[1].clone()], state_died=True, adoptable=True)
    decision = decide(on_path(variants=(dead,), dead=(dead,)), FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.candidates, decision.adopts_state) == (
        Action.REPLAY,
        (dead,),
        True,
    )
    assert decision.otherwise.before.leaves is Leave.LIVE_MEMORY


def test_a_dead_recording_that_replayed_is_replaced_off_the_guards_clock(args):
    dead = node([args[0], args[1].clone()], state_died=True, replays=3)
    decision = decide(on_path(variants=(dead,), dead=(dead,)), FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.kind) == (Action.RECORD, RecordKind.STATE_DIED)
    assert decision.before.drops == (dead,) and decision.before.counts_replacement
    assert not decision.before.counts_rerecord


def test_a_dead_recording_that_never_replayed_is_churn_on_the_guards_clock(args):
    dead = node([args[0], args[1].clone()], state_died=True, replays=0)
    decision = decide(on_path(variants=(dead,), dead=(dead,)), FACTS, call(*args), ANSWERS)
    assert decision.kind is RecordKind.VARIANT and decision.before.counts_rerecord
    assert decision.before.drops == (dead,)


def test_a_weight_whose_memory_moves_is_copied_by_one_recording_replacing_the_others(args):
    old = node([args[0], args[1].clone()])
    view = on_path(variants=(old,), moving=frozenset({1}))
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.kind) == (Action.RECORD, RecordKind.MOVING_MEMORY)
    assert decision.static == () and decision.before.counts_replacing_record
    assert not decision.before.counts_rerecord and not decision.before.counts_returned


def test_a_recording_copying_a_weight_that_settled_is_replaced_by_one_reading_it_there(args):
    copying = SimpleNamespace(recording=Recorded({}), replays=3)  # copies input 1
    copying.recording.moving_inputs = (1,)
    view = on_path(variants=(copying,), settled=(copying,))  # input 1 no longer moving
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.kind) == (Action.RECORD, RecordKind.SETTLED_MEMORY)
    assert decision.static == (1,) and decision.before.drops == (copying,)
    assert decision.before.counts_replacing_record and not decision.before.counts_rerecord
    assert "w, read by the weight" in decision.rerecord_reason


def test_a_recording_whose_weight_settled_where_no_capture_can_go_copies_for_good(args):
    copying = SimpleNamespace(recording=Recorded({}), replays=3)
    copying.recording.moving_inputs = (1,)
    view = on_path(variants=(copying,), settled=(copying,), can_capture=False)
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.candidates) == (Action.REPLAY, (copying,))
    assert "no capture could replace" in decision.keeps_copying and decision.before.drops == ()


def test_a_recording_whose_settled_weight_moved_again_copies_for_good(args):
    copying = SimpleNamespace(recording=Recorded({}), replays=3)
    copying.recording.moving_inputs = (1,)
    view = on_path(variants=(copying,), settled=(copying,), moving=frozenset({1}))
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.candidates) == (Action.REPLAY, (copying,))
    assert "seen elsewhere" in decision.keeps_copying


def test_an_output_of_another_graph_that_keeps_moving_is_skipped_here_at_the_limit(args):
    produced = dataclasses.replace(FACTS, static_inputs=frozenset())
    view = on_path(variants=(node([args[0], args[1].clone()]),))
    skip = answers(managed_action="skip", managed_limit=2, managed_counts={1: 1})
    decision = decide(view, produced, call(*args), skip)
    assert decision.action is Action.RUN_PLAIN
    assert (decision.before.managed_moves, decision.before.managed_reached) == ((1,), (1,))
    assert "managed_input_rerecord_action='skip'" in decision.before.skip.reason


def test_below_the_managed_limit_a_moved_output_of_another_graph_is_counted_and_recorded(args):
    produced = dataclasses.replace(FACTS, static_inputs=frozenset())
    view = on_path(variants=(node([args[0], args[1].clone()]),))
    decision = decide(view, produced, call(*args), answers(managed_limit=3))
    assert decision.kind is RecordKind.VARIANT
    assert (decision.before.managed_moves, decision.before.managed_reached) == ((1,), ())


# -- what stops a record --------------------------------------------------------------------------


def test_a_written_input_that_is_new_at_this_call_runs_plain(args):
    writes = dataclasses.replace(FACTS, mutated_inputs=(0,), may_be_state=(0,))
    decision = decide(on_path(), writes, call(*args), ANSWERS)
    assert decision.action is Action.RUN_PLAIN and "input 0" in decision.before.skip.reason


def test_a_written_input_new_at_every_call_is_recorded_to_be_written_back(args):
    writes = dataclasses.replace(FACTS, mutated_inputs=(0,), may_be_state=(0,))
    decision = decide(on_path(), writes, call(*args, new_twice=frozenset({0})), ANSWERS)
    assert decision.action is Action.RECORD and 0 not in decision.static


def test_a_written_input_kept_as_state_is_taken_where_it_lies(args):
    writes = dataclasses.replace(FACTS, mutated_inputs=(0,), may_be_state=(0,))
    kept = on_path(kept_state=[args[0]])
    decision = decide(kept, writes, call(*args), ANSWERS)
    assert decision.action is Action.RECORD and decision.static == (0, 1)


def test_the_backends_refusal_runs_plain_in_its_words(args):
    view = on_path(capture_refusal="a generator the graph cannot register")
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert decision.action is Action.RUN_PLAIN
    assert decision.before.skip.reason == "a generator the graph cannot register"


def test_a_capture_that_could_land_in_lent_memory_leaves_the_tree_keeping_the_preamble(args):
    view = on_path(variants=(node([args[0], args[1].clone()]),), can_capture=False)
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.before.leaves) == (Action.RUN_EAGERLY, Leave.LENT_MEMORY)
    assert decision.before.counts_rerecord  # the variant's count stands


def test_a_recording_that_went_with_an_evicted_variant_falls_back_when_one_too_many(args):
    view = on_path(evicted_here=True)
    decision = decide(view, FACTS, call(*args), answers(rerecord_stops=True))
    assert decision.action is Action.FALL_BACK and "dropped" in decision.fallback_reason
    assert decision.before.sizes is SizeNote.RECORDABLE


def test_a_step_that_cannot_end_stops_growing_at_the_limit_below_itself(args):
    limit = config.pending_backward_records_limit
    view = on_path(pending_backward=True, records_below_itself=limit)
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert (decision.action, decision.before.leaves) == (Action.RUN_EAGERLY, Leave.PENDING_BACKWARD)
    assert decision.before.pending_backward_note is not None


def test_a_step_that_cannot_end_records_below_itself_under_the_limit(args):
    view = on_path(pending_backward=True, records_below_itself=1)
    decision = decide(view, FACTS, call(*args), ANSWERS)
    assert decision.action is Action.RECORD and decision.before.pending_backward_note is None


# -- carried out ----------------------------------------------------------------------------------

# Written as Inductor writes a wrapper's ``call`` (the emulator captures only such code).
LINEAR = """
def call(args):
    x, w = args
    args.clear()
    out = empty_strided_cpu((4, 8), (8, 1), torch.float32)
    torch.mm(x, w.t(), out=out)
    return [out]
"""


def test_carrying_out_each_decision_does_what_it_says(device):
    if device != "cpu":
        pytest.skip("written for the emulator")
    module = {
        "torch": torch,
        "empty_strided_cpu": lambda s, st, dtype: torch.empty_strided(s, st, dtype=dtype),
    }
    exec(LINEAR, module)
    graphed = graphify(module["call"], device="cpu:0", static_inputs=(1,), name="linear")
    weight = torch.randn(8, 16)
    for expected in ("warmups", "records", "replays"):
        inductor_xpugraph.mark_step_begin()
        before = inductor_xpugraph.stats()[expected]
        graphed([torch.randn(4, 16), weight])
        assert inductor_xpugraph.stats()[expected] == before + 1
