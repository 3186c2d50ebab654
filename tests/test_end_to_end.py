"""End to end: torch.compile(mode="reduce-overhead") through our wrapper and runtime.

Runs on "cpu" (the emulator) everywhere and on "cuda" on the GPU machine (``-m gpu``).
"""

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import inductor_xpugraph
from inductor_xpugraph.trees.per_thread import all_trees


def all_recordings():
    return [node.recording for tree in all_trees() for node in tree.nodes()]


def mlp_fn(x, w):
    return (x @ w).relu() + 1


def small_mlp(device):
    torch.manual_seed(0)
    return (
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
        .to(device)
        .eval()
    )


def test_compiled_function_matches_eager_and_replays(device):
    compiled = torch.compile(mlp_fn, mode="reduce-overhead")
    w = torch.randn(16, 16, device=device)
    for _ in range(6):
        x = torch.randn(4, 16, device=device)
        torch.testing.assert_close(compiled(x, w), mlp_fn(x, w))
    stats = inductor_xpugraph.stats()
    assert (stats["warmups"], stats["records"], stats["replays"]) == (1, 1, 4)


def test_compiled_module_matches_eager_and_replays(device):
    model = small_mlp(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(4, 16, device=device)
            torch.testing.assert_close(compiled(x), model(x))
    stats = inductor_xpugraph.stats()
    assert stats["warmups"] == 1 and stats["records"] == 1 and stats["replays"] >= 3


def test_parameters_are_static_inputs_and_not_copied(device):
    model = small_mlp(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.randn(4, 16, device=device))
    (recording,) = all_recordings()
    assert len(recording.static_input_ptrs) == 4  # 2 weights, 2 biases: never copied
    assert len(recording.copied_inputs) == 1  # the activation


def test_generated_source_imports_runtime_and_wraps_call(device):
    _, (source,) = run_and_get_code(
        torch.compile(mlp_fn, mode="reduce-overhead"),
        torch.randn(4, 16, device=device),
        torch.randn(16, 16, device=device),
    )
    assert "import inductor_xpugraph.trees as _graph_trees" in source
    assert "_graph_trees.graphify(" in source
    assert "# -- graph tree (inductor_xpugraph)" in source


def test_replays_write_outputs_into_the_same_graph_memory(device):
    compiled = torch.compile(mlp_fn, mode="reduce-overhead")
    w = torch.randn(16, 16, device=device)
    addresses = []
    for _ in range(4):
        out = compiled(torch.randn(4, 16, device=device), w)
        addresses.append(out.data_ptr())
        assert not out._is_view()
    assert addresses[2] == addresses[3]  # the recording's output memory, replayed into


def output_of_an_earlier_iteration(device):
    """An output kept from the third call, after a fourth call started a new iteration."""
    compiled = torch.compile(mlp_fn, mode="reduce-overhead")
    w = torch.randn(16, 16, device=device)
    for _ in range(3):
        kept = compiled(torch.randn(4, 16, device=device), w)
    compiled(torch.randn(4, 16, device=device), w)
    return kept


def test_output_of_an_earlier_iteration_raises_when_read(device):
    kept = output_of_an_earlier_iteration(device)
    with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
        kept.sum()


def test_the_stale_output_error_names_the_graph_and_the_source_line_it_comes_from(device):
    kept = output_of_an_earlier_iteration(device)
    with pytest.raises(RuntimeError, match=r"graph \(`\w+:\w+` from `[^`]*test_end_to_end.py:\d+"):
        kept.sum()


def test_cloned_output_survives_later_iterations(device):
    compiled = torch.compile(mlp_fn, mode="reduce-overhead")
    w = torch.randn(16, 16, device=device)
    for _ in range(3):
        x = torch.randn(4, 16, device=device)
        kept = compiled(x, w).clone()
    compiled(torch.randn(4, 16, device=device), w)
    torch.testing.assert_close(kept, mlp_fn(x, w))


def test_replaced_parameter_triggers_rerecord(device):
    model = small_mlp(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 16, device=device)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        model[0].weight = torch.nn.Parameter(torch.randn_like(model[0].weight))
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x), model(x))
    stats = inductor_xpugraph.stats()
    assert stats["rerecords"] == 1
    assert stats["replays"] >= 2


class _Head(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        self.body = torch.nn.Linear(16, 16, device=device)
        self.head = torch.nn.Linear(16, 4, device=device)

    def forward(self, x):
        return self.head(self.body(x).relu())


def test_a_rerecord_names_the_input_that_moved_by_module_and_source_line(device):
    model = _Head(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 16, device=device)
    # A cached graph would carry the names of the compile that filled the cache.
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        for _ in range(3):
            compiled(x)
        model.head.weight = torch.nn.Parameter(torch.randn_like(model.head.weight))
        compiled(x)
    (event,) = [e for e in inductor_xpugraph.report().events if e.kind.name == "RERECORD"]
    assert "read by L['self'].head (Linear) at " in event.reason
    assert "test_end_to_end.py:" in event.reason and "moved (new addresses)" in event.reason


def test_falls_back_after_rerecord_limit(device):
    model = small_mlp(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 16, device=device)
    with inductor_xpugraph.config.patch(rerecord_limit=2), torch.no_grad():
        for _ in range(3):
            compiled(x)
        kept = []  # old weights stay alive, so that every new one has a new address
        for _ in range(4):  # a new weight every call: re-record, re-record, fall back
            kept.append(model[0].weight)
            model[0].weight = torch.nn.Parameter(torch.randn_like(model[0].weight))
            torch.testing.assert_close(compiled(x), model(x))
    stats = inductor_xpugraph.stats()
    assert stats["rerecords"] == 2
    assert stats["fallbacks"] == 1


def test_a_mutated_input_passed_again_is_captured_where_it_lies(device):
    """A tensor the caller keeps and passes again, written in place by the graph, is state:
    recorded by address from its second call, and every replay writes it as eager does."""

    def add_into(x, y):
        x.add_(y)
        return x.sum()

    compiled = torch.compile(add_into, mode="reduce-overhead")
    x, y = torch.zeros(8, device=device), torch.ones(8, device=device)
    sums = [compiled(x, y).item() for _ in range(5)]
    assert sums == [8.0, 16.0, 24.0, 32.0, 40.0]
    torch.testing.assert_close(x, torch.full_like(x, 5.0))
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"], stats["skips"]) == (1, 3, 0), stats


def test_a_written_input_that_is_a_new_tensor_each_call_is_copied_in_and_back(device):
    """A cache that beam search reorders into new tensors at every step: the first call
    with a new tensor after the warmup runs un-graphed (said once); from the second in a row
    the recording copies it in and back, and every tensor gets eager's values."""

    def add_into(x, y):
        x.add_(y)
        return x.sum()

    compiled = torch.compile(add_into, mode="reduce-overhead")
    y = torch.ones(8, device=device)
    kept = [torch.full((8,), float(i), device=device) for i in range(6)]  # all alive
    sums = [compiled(x, y).clone() for x in kept]
    for i, (x, total) in enumerate(zip(kept, sums)):
        torch.testing.assert_close(x, torch.full((8,), i + 1.0, device=device))
        torch.testing.assert_close(total, torch.tensor(8.0 * (i + 1), device=device))
    stats = inductor_xpugraph.stats()
    assert (stats["warmups"], stats["skips"], stats["records"], stats["replays"]) == (1, 1, 1, 3)
    assert any("writes input" in reason for reason in stats["skip_reasons"])


def test_graphs_only_with_reduce_overhead(device):
    _, (source,) = run_and_get_code(
        torch.compile(mlp_fn), torch.randn(4, 16, device=device), torch.randn(16, 16, device=device)
    )
    assert "_graph_trees" not in source


def test_disable_restores_the_stock_wrapper(device):
    inductor_xpugraph.disable(device)
    torch._dynamo.reset()
    _, (source,) = run_and_get_code(
        torch.compile(mlp_fn, mode="reduce-overhead"),
        torch.randn(4, 16, device=device),
        torch.randn(16, 16, device=device),
    )
    assert "_graph_trees" not in source
    inductor_xpugraph.enable(device)


def test_new_size_gets_its_own_recording(device):
    compiled = torch.compile(mlp_fn, mode="reduce-overhead", dynamic=True)
    w = torch.randn(16, 16, device=device)
    for rows in (3, 5, 3, 5, 3, 5):
        x = torch.randn(rows, 16, device=device)
        torch.testing.assert_close(compiled(x, w), mlp_fn(x, w))
    stats = inductor_xpugraph.stats()
    assert stats["records"] == 2
    assert stats["replays"] == 2


def test_expanded_input_is_copied_without_overlap(device):
    compiled = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead")
    for i in range(4):
        x = torch.full((1, 8), float(i), device=device).expand(4, 8)
        torch.testing.assert_close(compiled(x), x * 2 + 1)
    assert inductor_xpugraph.stats()["replays"] == 2


def test_a_step_taking_another_branch_below_a_lender_records_again_without_lending(device):
    # `second`'s capture reuses the memory of `first`'s dead output; with owned outputs
    # that memory is free for good, so `third`, captured below `first` without `second`,
    # must not be placed there: that step runs un-graphed, and the tree records again.
    first = torch.compile(lambda x: ((x * 2).relu(), x + 1), mode="reduce-overhead")
    second = torch.compile(lambda b: b * 3 - 1, mode="reduce-overhead")
    third = torch.compile(lambda b: b * 5, mode="reduce-overhead")
    x = torch.randn(64, 64, device=device)
    with inductor_xpugraph.config.patch(allocator_checkpointing=False):
        inductor_xpugraph.reset()
        for step in range(8):
            inductor_xpugraph.mark_step_begin()
            a, b = first(x)
            del a  # dead when `second` is recorded
            if step < 4:
                torch.testing.assert_close(second(b), (x + 1) * 3 - 1)
            else:
                torch.testing.assert_close(third(b), (x + 1) * 5)
        (tree,) = [t for t in all_trees() if t.nodes()]
        assert tree.memory.name == "owned_outputs" and not tree.memory.lending
        assert len(tree.nodes()) == 2  # `first` and `third`, recorded again in step 6
        # steps 2-3: first and second; 4-5: first (third warms up, then is refused); 7: both
        assert inductor_xpugraph.stats()["replays"] == 8


SCALE_AND_SHIFT = """
def call(args):
    x, shift = args
    out = empty_strided_cpu((8, 8), (8, 1), torch.float32) if x.is_cpu else torch.empty_like(x)
    torch.add(x * 2, shift, out=out)
    return [out]
"""


def _empty_strided_cpu(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype)


def test_a_static_input_taken_as_aligned_at_an_odd_address_raises_and_loses_nothing(device):
    """Inductor does not check a static input's alignment at each call (its kernels take it
    as aligned): a call that does not replay checks it, before anything runs."""
    from inductor_xpugraph.trees import graphify

    # Written as Inductor writes a wrapper's ``call``: the emulator captures only such code.
    module = {"torch": torch, "empty_strided_cpu": _empty_strided_cpu}
    exec(SCALE_AND_SHIFT, module)
    graphed = graphify(
        module["call"],
        device=f"{device}:0",
        static_inputs=(1,),
        aligned_inputs=(1,),
        name="scale_and_shift",
        input_names={1: "shift"},
    )
    storage = torch.randn(65, device=device)
    aligned, misaligned = storage[:64].view(8, 8), storage[1:].view(8, 8)
    x = torch.randn(8, 8, device=device)
    for _ in range(3):  # warmup, record, replay
        graphed([x, aligned])
    with pytest.raises(
        ValueError,
        match=r"called with input 1 \(shift\) at an address that is not a multiple of 16",
    ):
        graphed([x, misaligned])
    torch.testing.assert_close(graphed([x, aligned])[0], x * 2 + aligned)
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"]) == (1, 2)
