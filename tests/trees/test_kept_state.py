"""Outputs kept as state (Note [Outputs kept as state] in ``trees.kept_state``): tensors that
compiled code makes, an object of the caller keeps, and later graphs write in place."""

import pytest
import torch
from torch._inductor.cudagraph_trees import MarkStepBox

import inductor_xpugraph
from inductor_xpugraph.trees import graphify, keep_state_written_later


@pytest.fixture
def marked_steps():
    """The steps below are marked with ``mark_step_begin()``: the mark, which stays for the
    process, is taken back after the test."""
    before = MarkStepBox.mark_step_counter
    yield
    MarkStepBox.mark_step_counter = before


class RunningTotal:
    def __init__(self):
        self.total = None


def test_state_made_before_a_graph_break_and_written_after_it_is_kept(device):
    """The graph after the break writes the total in the step that made it: it is handed
    over when that step ends, once, and taken by address from then on; every step counts as
    eager does, nothing raises."""
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
    for i in range(1, 7):
        step(x)
        torch.testing.assert_close(holder.total, torch.full((4,), 2.0 * i, device=device))
    stats = inductor_xpugraph.stats()
    assert stats["handovers"] == 1 and stats["replays"] >= 4 and stats["skips"] == 0, stats


# Written as Inductor writes a wrapper's functions (outputs from the module's
# ``empty_strided_cpu``): the emulator captures only such code.
FUNCTIONS = """
def partition_0(args):
    (x,) = args
    y = empty_strided_cpu((4,), (1,), torch.float32) if x.is_cpu else torch.empty_like(x)
    torch.mul(x, 2, out=y)
    return (y,)

def partition_1(args):
    y, total = args
    total.add_(y)
    out = empty_strided_cpu((), (), torch.float32) if y.is_cpu else y.new_empty(())
    torch.sum(y, dim=0, out=out)
    return (out,)

def make(args):
    (x,) = args
    total = empty_strided_cpu((4,), (1,), torch.float32) if x.is_cpu else torch.empty_like(x)
    total.zero_()
    return (total,)
"""


def inductor_like_functions() -> dict:
    module = {"torch": torch, "empty_strided_cpu": torch._C._dynamo.guards._empty_strided_cpu}
    exec(FUNCTIONS, module)
    return module


def partitioned_graph(device: str, tell_the_first_partition: bool):
    """A graph as Inductor partitions it, by hand: ``partition_0`` is not passed ``total``,
    ``partition_1`` writes it; with ``tell_the_first_partition``, ``call`` is wrapped as the
    generated code wraps it (``keep_state_written_later``). Returns ``call``."""
    module = inductor_like_functions()
    first = graphify(module["partition_0"], device=f"{device}:0", name="partition_0")
    second = graphify(
        module["partition_1"], device=f"{device}:0", mutated_inputs=(1,), name="partition_1"
    )

    def call(args):
        x, total = args
        (y,) = first([x])
        return second([y, total])

    if tell_the_first_partition:
        return keep_state_written_later(call, first, (1,))
    return call


def run_partitioned_steps(device: str, tell_the_first_partition: bool, holder: RunningTotal):
    """The first steps make the total in a graph of its own (warmup, record, replay: the
    last one a graph's output); each later step runs the partitioned graph, which adds 2 to
    it."""
    make = graphify(inductor_like_functions()["make"], device=f"{device}:0", name="make")
    call = partitioned_graph(device, tell_the_first_partition)
    x = torch.ones(4, device=device)
    for _ in range(3):
        inductor_xpugraph.mark_step_begin()
        (holder.total,) = make([x])
    for _ in range(5):
        inductor_xpugraph.mark_step_begin()
        call([x, holder.total])


def test_state_a_later_partition_writes_is_kept_when_the_graph_tells_its_first_partition(
    device, marked_steps
):
    holder = RunningTotal()
    run_partitioned_steps(device, tell_the_first_partition=True, holder=holder)
    torch.testing.assert_close(holder.total, torch.full((4,), 10.0, device=device))
    stats = inductor_xpugraph.stats()
    assert stats["handovers"] == 1 and stats["replays"] >= 4, stats


def test_state_that_went_stale_raises_once_names_its_holder_and_works_after_a_reset(
    device, marked_steps
):
    """Not told, the first partition starts the step and the total goes stale: the partition
    that writes it raises once, naming who holds it and the caller's line; the total is
    given zeros of its own and kept, so the holder's reset works and later steps count."""
    holder = RunningTotal()
    with pytest.raises(RuntimeError, match="held as `total` of a RunningTotal") as raised:
        run_partitioned_steps(device, tell_the_first_partition=False, holder=holder)
    assert "early_initialization" in str(raised.value)
    assert "test_kept_state.py:" in str(raised.value)  # the caller's line
    holder.total.zero_()  # the holder's own reset works
    call = partitioned_graph(device, tell_the_first_partition=False)
    x = torch.ones(4, device=device)
    for _ in range(4):
        inductor_xpugraph.mark_step_begin()
        call([x, holder.total])
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
