"""Outputs kept as state (Note [Outputs kept as state] in ``trees.kept_state``): tensors that
compiled code makes, an object of the caller keeps, and later graphs write in place."""

import pytest
import torch

import inductor_xpugraph


class RunningTotal:
    def __init__(self):
        self.total = None


def test_state_first_written_after_a_graph_break_raises_once_and_works_after_a_reset(device):
    """The step's first graph does not pass the total, so it cannot be kept: the graph that
    writes it raises once, naming who holds it; after the holder's reset it is kept, and
    later steps replay and count as eager does."""
    holder = RunningTotal()

    @torch.compile(mode="reduce-overhead")
    def step(x):
        if holder.total is None:
            holder.total = torch.zeros(4, device=x.device)  # made inside the compiled code
        y = x * 2
        torch._dynamo.graph_break()
        holder.total.add_(y)
        return y.sum()

    x = torch.ones(4, device=device)
    step(x)
    with pytest.raises(RuntimeError, match="held as `total` of a RunningTotal") as raised:
        step(x)
    assert "early_initialization" in str(raised.value)
    assert "test_kept_state.py:" in str(raised.value)  # the caller's line
    holder.total.zero_()  # the holder's own reset works
    for _ in range(4):
        step(x)
    torch.testing.assert_close(holder.total, torch.full((4,), 8.0, device=device))
    stats = inductor_xpugraph.stats()
    assert stats["handovers"] == 1 and stats["replays"] >= 4, stats


def test_state_made_inside_compiled_code_and_written_by_the_next_step_keeps_its_values(device):
    """The first call of the next step passes it where it writes: handed over once, then
    taken by address; every step's value equals eager's."""
    holder = RunningTotal()

    def step(x):
        if holder.total is None:
            holder.total = torch.zeros(4, device=x.device)
        # (``add_(x)`` would hit a torch bug: Dynamo stores ``x`` itself as the new total)
        holder.total.add_(x * 3)
        return holder.total * 2

    compiled = torch.compile(step, mode="reduce-overhead")
    x = torch.ones(4, device=device)
    results = [compiled(x).clone() for _ in range(5)]
    for i, result in enumerate(results, start=1):
        torch.testing.assert_close(result, torch.full((4,), 6.0 * i, device=device))
    torch.testing.assert_close(holder.total, torch.full((4,), 15.0, device=device))
    stats = inductor_xpugraph.stats()
    assert stats["handovers"] == 1 and stats["replays"] >= 2 and stats["skips"] == 0, stats
