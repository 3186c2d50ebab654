"""``config.debug_checks``: a call that changes an output the caller still holds from earlier
in the step raises, naming both callables; legal writes and ordinary loops raise nothing."""

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph.trees import graphify
from inductor_xpugraph.trees.debug_checks import GraphMemoryOverwritten


def _producer_and_clobberer(device: str):
    """Two graphed callables: ``produce`` hands out a tensor, ``clobber`` writes into it (as a
    graph placed over memory still in use would)."""
    made = {}

    def produce(args):
        made["out"] = args[0] * 2
        return [made["out"]]

    def clobber(args):
        made["out"].zero_()
        return [args[0] + 1]

    return (
        graphify(produce, device=f"{device}:0", name="produce"),
        graphify(clobber, device=f"{device}:0", name="clobber"),
    )


def test_a_call_that_overwrites_a_held_output_of_its_step_raises(device):
    with inductor_xpugraph.config.patch(debug_checks=True):
        produce, clobber = _producer_and_clobberer(device)
    x = torch.ones(4, device=device)
    (held,) = produce([x])
    with pytest.raises(GraphMemoryOverwritten, match="output 0 of `produce`.*while `clobber`"):
        clobber([x])


def test_without_debug_checks_the_same_overwrite_goes_unnoticed(device):
    with inductor_xpugraph.config.patch(debug_checks=False):
        produce, clobber = _producer_and_clobberer(device)
    x = torch.ones(4, device=device)
    (held,) = produce([x])
    clobber([x])
    assert held.sum().item() == 0  # what the check exists to catch


def test_a_graph_that_mutates_an_earlier_output_passed_to_it_raises_nothing(device):
    def step(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y.add_(1)  # the second graph writes into the first graph's output: legal

    with inductor_xpugraph.config.patch(debug_checks=True):
        compiled = torch.compile(step, mode="reduce-overhead")
        for _ in range(4):  # warmup, record, replays
            out = compiled(torch.ones(4, device=device))
            assert torch.equal(out, torch.full((4,), 3.0, device=device))
    assert inductor_xpugraph.stats()["replays"] >= 2


def test_an_output_whose_storage_was_freed_in_place_is_not_read(device):
    """FSDP frees a gathered parameter, which a forward graph returns for its backward, by
    resizing its storage to nothing: copying it would read freed memory."""
    with inductor_xpugraph.config.patch(debug_checks=True):
        produce = graphify(lambda args: [args[0] * 2], device=f"{device}:0", name="produce")
        other = graphify(lambda args: [args[0] + 1], device=f"{device}:0", name="other")
    x = torch.ones(4, device=device)
    (out,) = produce([x])
    out.untyped_storage().resize_(0)
    other([x])
    assert inductor_xpugraph.stats()["outputs_checked"] == 0
