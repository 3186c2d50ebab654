"""Tree semantics on the CPU emulator: paths across graph breaks, generations, mark_step,
dynamic-size limits, mutation of graph-produced inputs, training loops."""

import copy
import logging

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph.trees.per_thread import all_trees


def nodes():
    return [node for tree in all_trees() for node in tree.nodes()]


def graph_break_fn(x, w):
    y = (x @ w).relu()
    torch._dynamo.graph_break()
    return y.sin() + 1


def test_graph_break_records_a_path_of_two_nodes(device):
    compiled = torch.compile(graph_break_fn, mode="reduce-overhead")
    w = torch.randn(8, 8, device=device)
    for _ in range(5):
        x = torch.randn(4, 8, device=device)
        torch.testing.assert_close(compiled(x, w), graph_break_fn(x, w))
    first, second = sorted(nodes(), key=lambda n: n.seq)
    assert second.parent is first
    assert inductor_xpugraph.stats()["replays"] == 6  # 3 calls x 2 graphs


def test_output_of_an_earlier_graph_on_the_path_is_not_copied(device):
    compiled = torch.compile(graph_break_fn, mode="reduce-overhead")
    w = torch.randn(8, 8, device=device)
    for _ in range(3):
        compiled(torch.randn(4, 8, device=device), w)
    _, second = sorted(nodes(), key=lambda n: n.seq)
    assert second.recording.copied_inputs == ()  # y comes from the first graph's memory


def test_training_loop_matches_eager_for_ten_steps(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)
    ).to(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    for _ in range(10):
        x = torch.randn(4, 16, device=device)
        loss = compiled(x).square().mean()
        loss.backward()
        opt.step(), opt.zero_grad()
        ref_loss = reference(x).square().mean()
        ref_loss.backward()
        ref_opt.step(), ref_opt.zero_grad()
        torch.testing.assert_close(loss, ref_loss)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
    stats = inductor_xpugraph.stats()
    assert stats["records"] == 2  # forward and backward
    assert stats["replays"] == 16  # 8 steps x (forward + backward)


def test_mark_step_begin_keeps_outputs_until_the_next_mark(device):
    compiled = torch.compile(lambda x: x * 2, mode="reduce-overhead")
    for _ in range(3):
        inductor_xpugraph.mark_step_begin()
        compiled(torch.randn(4, device=device))
    inductor_xpugraph.mark_step_begin()
    x1, x2 = torch.randn(4, device=device), torch.randn(4, device=device)
    first = compiled(x1)
    second = compiled(x2)  # same generation: a second node, first stays valid
    torch.testing.assert_close(first, x1 * 2)
    torch.testing.assert_close(second, x2 * 2)
    inductor_xpugraph.mark_step_begin()
    compiled(x1)
    with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
        first.sum()


def test_upstream_mark_step_marker_also_starts_a_generation(device):
    compiled = torch.compile(lambda x: x + 1, mode="reduce-overhead")
    for _ in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        kept = compiled(torch.randn(4, device=device))
    torch.compiler.cudagraph_mark_step_begin()
    compiled(torch.randn(4, device=device))
    with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
        kept.sum()


def test_sizes_past_the_warn_limit_are_recorded_with_a_warning(device, caplog):
    compiled = torch.compile(lambda x: x.cos(), mode="reduce-overhead", dynamic=True)
    with (
        inductor_xpugraph.config.patch(dynamic_shape_warn_limit=2),
        caplog.at_level(logging.WARNING, logger="inductor_xpugraph"),
    ):
        for n in (2, 3, 4, 2, 3, 4):
            x = torch.randn(n, device=device)
            torch.testing.assert_close(compiled(x), x.cos())
            compiled(x)
    assert inductor_xpugraph.stats()["records"] == 3
    assert "distinct sizes" in caplog.text


def test_skip_dynamic_graphs_runs_new_sizes_past_the_limit_ungraphed(device):
    compiled = torch.compile(lambda x: x.cos(), mode="reduce-overhead", dynamic=True)
    with inductor_xpugraph.config.patch(dynamic_shape_warn_limit=2, skip_dynamic_graphs=True):
        for n in (2, 3, 4, 4, 4):
            x = torch.randn(n, device=device)
            torch.testing.assert_close(compiled(x), x.cos())
            compiled(x)
    stats = inductor_xpugraph.stats()
    assert stats["records"] == 2
    assert any("distinct sizes" in reason for reason in stats["skip_reasons"])


def test_graph_may_mutate_an_output_of_an_earlier_graph(device):
    def produce(x):
        return x * 3

    def bump(y):
        y.add_(1)
        return y.sum()

    first = torch.compile(produce, mode="reduce-overhead")
    second = torch.compile(bump, mode="reduce-overhead")
    for _ in range(4):
        inductor_xpugraph.mark_step_begin()
        x = torch.randn(8, device=device)
        y = first(x)
        total = second(y)
        torch.testing.assert_close(total, (x * 3 + 1).sum())
        torch.testing.assert_close(y, x * 3 + 1)
    assert inductor_xpugraph.stats()["records"] == 2


def test_threads_have_their_own_trees_and_generations(device):
    import threading

    compiled = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead")
    x_main = torch.randn(8, device=device)
    for _ in range(3):
        kept = compiled(x_main)  # warmup, record, replay in this thread
    errors = []

    def other_thread():
        try:
            for _ in range(4):
                x = torch.randn(8, device=device)
                torch.testing.assert_close(compiled(x), x * 2 + 1)
        except Exception as error:  # surfaced below
            errors.append(error)

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert not errors
    torch.testing.assert_close(kept, x_main * 2 + 1)  # not invalidated by the other thread


def test_a_thread_running_the_backwards_of_several_threads_finds_each_ones_trees():
    """Autograd runs every thread's backward on one device thread, each under its caller's
    propagated TLS (stashed here by hand, as the engine does): each backward must reach the
    trees of the thread that ran its forward, not the first caller's."""
    import threading

    from inductor_xpugraph.trees import per_thread

    tables = {}

    def make_trees(name):
        tables[name] = per_thread.thread_trees()

    for name in ("first", "second"):
        caller = threading.Thread(target=make_trees, args=(name,))
        caller.start()
        caller.join()
    found = []

    def run_backwards():
        for name in ("first", "second", "first"):
            torch._C._stash_obj_in_tls(per_thread._TLS_KEY, tables[name])
            found.append(per_thread.thread_trees() is tables[name])

    device_thread = threading.Thread(target=run_backwards)
    device_thread.start()
    device_thread.join()
    assert tables["first"] is not tables["second"]
    assert found == [True, True, True]


def test_generated_module_called_directly_in_a_loop_replays(device):
    from torch._inductor.codecache import PyCodeCache

    compiled = torch.compile(lambda x, w: (x @ w).relu(), mode="reduce-overhead")
    w = torch.randn(8, 8, device=device)
    compiled(torch.randn(4, 8, device=device), w)
    module = [m for m in PyCodeCache.modules if "_graph_trees" in open(m.__file__).read()][-1]
    inductor_xpugraph.reset()
    # No torch.compile invocation: the generation counter never moves between these calls.
    for _ in range(5):
        x = torch.randn(4, 8, device=device)
        (out,) = module.call([x, w])
        torch.testing.assert_close(out, (x @ w).relu())
    stats = inductor_xpugraph.stats()
    # reset() made the callable warm up again: warmup, record, then replays.
    assert (stats["warmups"], stats["records"], stats["replays"]) == (1, 1, 3)


def test_the_captures_of_a_step_are_summarised_in_one_info_line(device, caplog):
    def two_graphs(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    compiled = torch.compile(two_graphs, mode="reduce-overhead")
    x = torch.randn(2**18, device=device)  # 1 MiB
    with caplog.at_level(logging.INFO, logger="inductor_xpugraph"):
        for _ in range(4):  # warmup, capture of both graphs, then two steps of replays
            compiled(x)
    # Only our logger: on cuda, Inductor logs "skipping cudagraphs due to graphs are captured
    # by inductor_xpugraph" for each compiled graph too.
    ours = [r.getMessage() for r in caplog.records if r.name == "inductor_xpugraph"]
    lines = [message for message in ours if "captured" in message]
    assert len(lines) == 1
    assert ": captured 2 graph(s) in " in lines[0]
    pool_mib = inductor_xpugraph.stats()["pool_bytes"] / 2**20
    assert pool_mib >= 1 and f"graph outputs now hold {pool_mib:.1f} MiB of the pool" in lines[0]
