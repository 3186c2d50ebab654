"""A process's life: models replaced after ``torch._dynamo.reset()``, captures that fail.

Runs on the CPU emulator everywhere and on cuda (both memory strategies) with ``-m gpu``; on
cuda these failed before the pool was kept alive (a released pool made the next capture fail
inside ``capture_begin`` and left the RNG in capture mode for the rest of the process).
"""

import gc
import threading
import weakref

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import inductor_xpugraph
from inductor_xpugraph.trees import graphed_callable
from inductor_xpugraph.trees import stats as stats_module
from inductor_xpugraph.trees.per_thread import all_trees


@torch.library.custom_op("inductor_xpugraph_tests::fails_when_captured", mutates_args=())
def fails_when_captured(x: torch.Tensor) -> torch.Tensor:
    """An op that is fine eagerly and raises inside a graph capture (as a host sync would)."""
    if any(tree.backend.is_capturing() for tree in all_trees()):
        raise RuntimeError("fails_when_captured: this op cannot be captured")
    return x * 2


@fails_when_captured.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op(
    "inductor_xpugraph_tests::runs_out_of_memory_when_captured", mutates_args=()
)
def runs_out_of_memory_when_captured(x: torch.Tensor, nbytes: int) -> torch.Tensor:
    """An op that allocates ``nbytes`` more while a graph is being captured."""
    if any(tree.backend.is_capturing() for tree in all_trees()):
        torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    return x * 2


@runs_out_of_memory_when_captured.register_fake
def _(x, nbytes):
    return torch.empty_like(x)


@torch.library.custom_op("inductor_xpugraph_tests::invalidated_by_another_thread", mutates_args=())
def invalidated_by_another_thread(x: torch.Tensor) -> torch.Tensor:
    """An op whose capture another thread breaks: that thread synchronizes the device while
    the stream captures, so the capture fails in ``capture_end()``, not inside the op."""
    if any(tree.backend.is_capturing() for tree in all_trees()):
        errors = []
        other = threading.Thread(target=lambda: _synchronize_into(errors))
        other.start()
        other.join()
        assert errors, "a device-wide synchronize did not fail during a capture"
    return x * 2


def _synchronize_into(errors):
    try:
        torch.cuda.synchronize()
    except Exception as error:  # the other thread's own failure: expected
        errors.append(error)


@invalidated_by_another_thread.register_fake
def _(x):
    return torch.empty_like(x)


def run_three_times(fn, make_input):
    for _ in range(3):
        x = make_input()
        out = fn(x)
    return x, out


def test_a_new_model_after_dynamo_reset_records_and_replays(device):
    first = torch.compile(lambda x: x + 1, mode="reduce-overhead")
    run_three_times(first, lambda: torch.randn(16, device=device))
    del first
    torch._dynamo.reset()
    gc.collect()
    second = torch.compile(lambda x: (x @ x).relu(), mode="reduce-overhead")
    x, out = run_three_times(second, lambda: torch.randn(8, 8, device=device))
    torch.testing.assert_close(out, (x @ x).relu())
    stats = inductor_xpugraph.stats()
    assert stats["records"] == 2 and stats["replays"] == 2


def capture_failures_said():
    return [
        event.reason
        for event in stats_module.events.values()
        if "its capture on" in event.reason and "failed with" in event.reason
    ]


def test_a_capture_that_fails_returns_eagers_result_and_the_process_stays_usable(device):
    fragile = torch.compile(lambda x: fails_when_captured(x.sin()) + 1, mode="reduce-overhead")
    x = torch.randn(16, device=device)
    fragile(x)  # warmup: un-graphed, fine
    torch.testing.assert_close(fragile(x), x.sin() * 2 + 1)  # the capture fails: un-graphed
    torch.testing.assert_close(fragile(x), x.sin() * 2 + 1)  # un-graphed from now on
    assert inductor_xpugraph.stats()["capture_failures"] == 1
    (reason,) = capture_failures_said()
    assert "RuntimeError: fails_when_captured: this op cannot be captured" in reason

    # Other models, random ones included, still record and replay.
    noisy = torch.compile(lambda x: x * torch.rand_like(x), mode="reduce-overhead")
    torch.manual_seed(0)
    for _ in range(4):
        out = noisy(x)
        assert ((out.abs() <= x.abs() + 1e-6) & (out.sign() * x.sign() >= 0)).all()
    assert inductor_xpugraph.stats()["replays"] >= 2


def test_capture_failure_raises_gives_the_caller_the_devices_error(device):
    fragile = torch.compile(lambda x: fails_when_captured(x.sin()) + 1, mode="reduce-overhead")
    x = torch.randn(16, device=device)
    with inductor_xpugraph.config.patch(capture_failure_raises=True):
        fragile(x)  # warmup
        with pytest.raises(RuntimeError, match="this op cannot be captured"):
            fragile(x)  # the capture
        torch.testing.assert_close(fragile(x), x.sin() * 2 + 1)  # un-graphed from now on
    assert inductor_xpugraph.stats()["capture_failures"] == 1


def test_an_out_of_memory_inside_a_capture_leaves_the_process_usable(cuda_each_strategy):
    """A capture that runs out of the memory this process may use (a per-process fraction)
    raises torch.OutOfMemoryError to the caller; that graph runs un-graphed, others record."""
    total = torch.cuda.get_device_properties(0).total_memory
    limit = torch.cuda.memory_reserved() + 256 * 2**20
    greedy = torch.compile(
        lambda x: runs_out_of_memory_when_captured(x.sin(), 2 * 2**30) + 1, mode="reduce-overhead"
    )
    x = torch.randn(1024, device="cuda")
    torch.cuda.set_per_process_memory_fraction(limit / total)
    try:
        greedy(x)  # warmup: un-graphed, within the limit
        torch.testing.assert_close(greedy(x), x.sin() * 2 + 1)  # the capture fails: un-graphed
        torch.testing.assert_close(greedy(x), x.sin() * 2 + 1)  # un-graphed from now on
        noisy = torch.compile(lambda x: x * torch.rand_like(x), mode="reduce-overhead")
        for _ in range(4):
            out = noisy(x)
            assert ((out.abs() <= x.abs() + 1e-6) & (out.sign() * x.sign() >= 0)).all()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert inductor_xpugraph.stats()["replays"] >= 2
    assert any("failed with OutOfMemoryError" in reason for reason in capture_failures_said())


def test_a_capture_another_thread_invalidated_leaves_random_ops_usable(cuda_each_strategy):
    """The capture fails in ``capture_end()``, which leaves torch's generator in capture mode;
    the backend takes it out, so random ops and other graphs work afterwards (left in capture
    mode, every later random op in the process raises)."""
    broken = torch.compile(
        lambda x: invalidated_by_another_thread(x.sin()) + 1, mode="reduce-overhead"
    )
    x = torch.randn(256, device="cuda")
    broken(x)  # warmup
    torch.testing.assert_close(broken(x), x.sin() * 2 + 1)  # the capture fails: un-graphed
    torch.testing.assert_close(broken(x), x.sin() * 2 + 1)  # un-graphed from now on
    noisy = torch.compile(lambda x: x * torch.rand_like(x), mode="reduce-overhead")
    for _ in range(4):
        torch.randn(8, device="cuda")
        out = noisy(x)
        assert ((out.abs() <= x.abs() + 1e-6) & (out.sign() * x.sign() >= 0)).all()
    assert inductor_xpugraph.stats()["replays"] >= 2
    assert inductor_xpugraph.stats()["capture_failures"] == 1


def test_outputs_of_the_generation_a_capture_failed_in_stay_valid(device):
    first = torch.compile(lambda x: x.cos(), mode="reduce-overhead")
    fragile = torch.compile(lambda x: fails_when_captured(x) - 1, mode="reduce-overhead")
    x = torch.randn(16, device=device)
    inductor_xpugraph.mark_step_begin()
    fragile(first(x))  # both warm up
    inductor_xpugraph.mark_step_begin()
    kept = first(x)  # recorded
    # Captured below it, in the same generation: the capture fails, the call runs un-graphed.
    torch.testing.assert_close(fragile(kept), x.cos() * 2 - 1)
    torch.testing.assert_close(kept, x.cos())
    for _ in range(3):  # a fresh tree records again, then replays
        inductor_xpugraph.mark_step_begin()
        torch.testing.assert_close(fragile(first(x)), x.cos() * 2 - 1)
    assert inductor_xpugraph.stats()["replays"] >= 2


def test_graphs_the_backend_invalidates_never_replay_again_and_are_recorded_anew(device):
    """What a tree does when its backend reports its graphs unsafe (on cuda: someone cleared
    every cuBLAS workspace): the rest of the step runs un-graphed, outputs it handed out
    stay valid, and the next step records again."""
    first = torch.compile(lambda x: x.cos(), mode="reduce-overhead")
    second = torch.compile(lambda y: y * 2 - 1, mode="reduce-overhead")
    x = torch.randn(16, device=device)
    for _ in range(3):  # warmup, record, replay
        inductor_xpugraph.mark_step_begin()
        second(first(x))
    inductor_xpugraph.mark_step_begin()
    kept = first(x)
    (tree,) = [t for t in all_trees() if t.nodes()]
    before = inductor_xpugraph.stats()
    tree.backend.on_graphs_invalidated("a test said so")
    torch.testing.assert_close(second(kept), x.cos() * 2 - 1)  # un-graphed
    assert inductor_xpugraph.stats()["replays"] == before["replays"]
    torch.testing.assert_close(kept, x.cos())
    for _ in range(3):  # a fresh tree records again, then replays
        inductor_xpugraph.mark_step_begin()
        torch.testing.assert_close(second(first(x)), x.cos() * 2 - 1)
    after = inductor_xpugraph.stats()
    assert after["records"] == before["records"] + 2, after
    assert after["replays"] > before["replays"], after
    (event,) = [e for e in inductor_xpugraph.report().events if e.kind.value == "start over"]
    assert "may not replay again: a test said so" in event.reason


def test_reset_lets_a_callable_that_fell_back_record_again(device):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 16, device=device)
    with inductor_xpugraph.config.patch(rerecord_limit=1), torch.no_grad():
        kept = []  # old weights stay alive, so that every new one has a new address
        for _ in range(5):  # a new weight every call: re-record, then fall back for good
            kept.append(model.weight)
            model.weight = torch.nn.Parameter(torch.randn_like(model.weight))
            compiled(x)
        assert inductor_xpugraph.stats()["fallbacks"] == 1
        inductor_xpugraph.reset()
        for _ in range(4):  # warmup, record, replays
            out = compiled(x)
    torch.testing.assert_close(out, model(x))
    stats = inductor_xpugraph.stats()
    assert (stats["warmups"], stats["records"], stats["replays"], stats["fallbacks"]) == (
        1,
        1,
        2,
        0,
    )


def test_after_reset_no_tree_holds_nodes_or_pool_memory(device):
    compiled = torch.compile(lambda x: (x * 3).tanh(), mode="reduce-overhead")
    for _ in range(4):
        compiled(torch.randn(32, device=device))
    assert inductor_xpugraph.stats()["pool_bytes"] > 0
    inductor_xpugraph.reset()
    assert all(tree.nodes() == [] and tree._pool is None for tree in all_trees())
    assert inductor_xpugraph.stats()["pool_bytes"] == 0


def objects_of_ours() -> int:
    return sum(
        1 for obj in gc.get_objects() if str(type(obj).__module__).startswith("inductor_xpugraph")
    )


def live_tensors() -> int:
    """Tensors, not counting fake ones (Inductor keeps some from each compile, stock too)."""
    return sum(
        1
        for obj in gc.get_objects()
        if issubclass(type(obj), torch.Tensor) and not issubclass(type(obj), FakeTensor)
    )


def create_compile_call_delete(device) -> tuple[int, ...]:
    """One round of a process that swaps models; what the runtime holds after it."""
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)
    ).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(8, 32, device=device)
    replays = inductor_xpugraph.stats()["replays"]
    for _ in range(3):  # training steps: a forward and a backward graph
        compiled(x).square().mean().backward()
    with torch.no_grad():  # and an inference graph
        for _ in range(3):
            compiled(x)
    assert inductor_xpugraph.stats()["replays"] == replays + 3
    del model, compiled, x
    torch._dynamo.reset()
    gc.collect()
    live_callables = len(graphed_callable._all_callables)
    pool_bytes = inductor_xpugraph.stats()["pool_bytes"]
    held = (pool_bytes, objects_of_ours(), live_callables, live_tensors())
    if device == "cuda":
        held += (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    return held


def test_models_deleted_in_a_loop_give_back_their_graphs_and_pool_memory(device):
    """Create / compile / call / del / ``torch._dynamo.reset()`` / ``gc.collect()``, 12 times:
    what the runtime holds after round 12 is what it held after round 3 (the last model's
    graphs until the next step; Inductor's own wrapper modules are not ours to free)."""
    held = [create_compile_call_delete(device) for _ in range(12)]
    assert held[11] == held[2]


def test_a_graph_compiled_without_partitions_is_released_with_its_compiled_graph(device):
    with torch._inductor.config.patch(graph_partition=False):
        create_compile_call_delete(device)  # first-use state (compiled kernels, log-once)
        second = create_compile_call_delete(device)
        for _ in range(2):
            assert create_compile_call_delete(device) == second


def test_a_deleted_models_memory_returns_at_the_next_step_of_a_live_one(device):
    live = torch.compile(lambda x: x.cos() + 1, mode="reduce-overhead")
    x = torch.randn(64, device=device)
    for _ in range(3):
        live(x)
    live_bytes = inductor_xpugraph.stats()["pool_bytes"]
    create_compile_call_delete(device)  # its graphs stay until the tree's next step
    for _ in range(3):  # a new compile of `live` after the reset: recorded again, replayed
        torch.testing.assert_close(live(x), x.cos() + 1)
    assert inductor_xpugraph.stats()["pool_bytes"] == live_bytes


def test_the_tree_keeps_no_autograd_graph_of_a_step_alive(device):
    """A training forward's outputs carry the step's autograd graph (``grad_fn``), which
    reaches the parameters and the compiled code: the tree must not keep them after the
    step, or a deleted model would never be freed."""
    model = torch.nn.Linear(32, 32).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(4):
        compiled(torch.randn(8, 32, device=device)).sum().backward()
    weight = weakref.ref(model.weight)
    del model, compiled
    torch._dynamo.reset()
    other = torch.compile(lambda x: x + 1, mode="reduce-overhead")
    other(torch.randn(8, device=device))  # the tree's next generation
    gc.collect()
    assert weight() is None


def test_capture_streams_last_across_trees_and_are_one_per_device_and_thread():
    # Trees after a reset capture on the stream of the trees before them (libraries keep
    # per-stream state, such as cuBLAS's workspaces); two threads never share one.
    import threading
    import types

    from inductor_xpugraph.trees.backends.capture_streams import capture_stream

    module = types.SimpleNamespace(__name__="test_device_module", Stream=lambda device: object())
    first = capture_stream(module, 0)
    assert capture_stream(module, 0) is first
    assert capture_stream(module, 1) is not first
    in_other_thread = []
    thread = threading.Thread(target=lambda: in_other_thread.append(capture_stream(module, 0)))
    thread.start()
    thread.join()
    assert in_other_thread[0] is not first


def test_reset_and_a_fresh_pool_let_the_backend_release_the_dropped_one(device, monkeypatch):
    """Dropping a pool (``reset()``, a tree recording again from a fresh pool) tells the
    backend, outside any capture: xpu empties its cache there."""
    compiled = torch.compile(lambda x: x.sin() + 1, mode="reduce-overhead")
    x = torch.randn(16, device=device)
    run_three_times(compiled, lambda: x)
    (tree,) = [t for t in all_trees() if t.nodes()]
    released = []
    monkeypatch.setattr(tree.backend, "release_dropped_pools", lambda: released.append(1))
    tree.start_over()  # the next generation records from a fresh pool
    run_three_times(compiled, lambda: x)
    assert released == [1]
    inductor_xpugraph.reset()
    assert released == [1, 1]
