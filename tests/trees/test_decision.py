"""What a call does is decided in one place, as a plain value (``GraphedCallable.decide``),
and deciding changes nothing: the policy's counts, the tree and the counters are as before."""

from __future__ import annotations

import copy

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph.trees import graphify
from inductor_xpugraph.trees.decision import Action, Leave, RecordKind
from inductor_xpugraph.trees.per_thread import tree_for

# Written as Inductor writes a wrapper's ``call`` (the emulator captures only such code).
LINEAR = """
def call(args):
    x, w = args
    args.clear()
    out = empty_strided_cpu((4, 8), (8, 1), torch.float32)
    torch.mm(x, w.t(), out=out)
    return [out]
"""


@pytest.fixture
def linear(device):
    if device != "cpu":
        pytest.skip("written for the emulator")
    module = {"torch": torch, "empty_strided_cpu": _empty_strided_cpu}
    exec(LINEAR, module)
    graphed = graphify(module["call"], device="cpu:0", static_inputs=(1,), name="linear")
    return graphed, torch.randn(8, 16)


def _empty_strided_cpu(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype)


def _decide(graphed, args):
    """The decision for ``args`` at the tree's current node, and whether anything changed."""
    tree = tree_for("cpu:0")
    if tree.current is tree.warming_up:  # settled as a call settles it (the warmup's output
        tree.resume_after_warmups()  # is dropped)
    before = _state(graphed, tree)
    decision = graphed.decide(tree, (), args)
    return decision, _state(graphed, tree) != before


def _state(graphed, tree):
    policy = graphed.policy
    return (
        copy.deepcopy(policy.warmups_done),
        list(policy.recent_rerecords),
        policy.rerecords,
        set(policy.address_sets_seen),
        [node.seq for node in tree.nodes()],
        tree.current,
        dict(inductor_xpugraph.stats()),
    )


def test_a_first_call_warms_up_and_deciding_so_counts_nothing(linear):
    graphed, weight = linear
    decision, changed = _decide(graphed, [torch.randn(4, 16), weight])
    assert (decision.action, decision.counted, changed) == (Action.WARM_UP, True, False)


def test_after_its_warmup_a_call_records_for_the_first_time(linear):
    graphed, weight = linear
    graphed([torch.randn(4, 16), weight])
    decision, changed = _decide(graphed, [torch.randn(4, 16), weight])
    assert (decision.action, decision.kind, changed) == (Action.RECORD, RecordKind.FIRST, False)


def test_a_recorded_call_away_from_the_tree_position_decides_a_replay(linear):
    graphed, weight = linear
    for _ in range(2):  # warmup, record
        inductor_xpugraph.mark_step_begin()
        graphed([torch.randn(4, 16), weight])
    inductor_xpugraph.mark_step_begin()
    tree = tree_for("cpu:0")
    tree.current = tree.root  # where the next step starts
    decision, changed = _decide(graphed, [torch.randn(4, 16), weight])
    assert (decision.action, changed) == (Action.REPLAY, False)
    assert decision.candidates == tuple(tree.root.child_nodes())


def test_a_static_input_at_a_new_address_decides_a_counted_variant(linear):
    graphed, weight = linear
    for _ in range(2):
        inductor_xpugraph.mark_step_begin()
        graphed([torch.randn(4, 16), weight])
    tree = tree_for("cpu:0")
    tree.current = tree.root
    decision, changed = _decide(graphed, [torch.randn(4, 16), weight.clone()])
    assert (decision.action, decision.kind, changed) == (Action.RECORD, RecordKind.VARIANT, False)
    assert decision.counted and decision.counts_rerecord and decision.reason


def test_a_capture_that_could_land_in_lent_memory_decides_to_leave_the_tree(linear, monkeypatch):
    graphed, weight = linear
    graphed([torch.randn(4, 16), weight])
    tree = tree_for("cpu:0")
    monkeypatch.setattr(tree.memory, "can_capture_below", lambda parent: False)
    decision, changed = _decide(graphed, [torch.randn(4, 16), weight])
    assert (decision.action, decision.leave, changed) == (
        Action.RUN_EAGERLY,
        Leave.LENT_MEMORY,
        False,
    )


def test_carrying_out_the_decision_does_what_it_says(linear):
    graphed, weight = linear
    for expected in ("warmups", "records", "replays"):
        inductor_xpugraph.mark_step_begin()
        before = inductor_xpugraph.stats()[expected]
        graphed([torch.randn(4, 16), weight])
        assert inductor_xpugraph.stats()[expected] == before + 1
