"""Upstream's settings of its trees, with upstream's meaning (``trees.recording_policy``,
``trees.handed_out``, ``codegen.eligibility``): which sizes are graphed, when a size is
recorded, what outputs kept past their step hold, when re-recording stops, when a graph that
is not captured raises, and which input mutations are captured. A test is skipped, for every
implementation, where the installed torch lacks its setting."""

import pytest
import torch

import inductor_xpugraph


def upstream_setting(**values):
    """``torch._inductor.config.patch`` of ``triton.<name>``; skips where torch lacks one."""
    for name in values:
        if not hasattr(torch._inductor.config.triton, name):
            pytest.skip(f"torch {torch.__version__} has no triton.{name}")
    return torch._inductor.config.patch({f"triton.{k}": v for k, v in values.items()})


def test_only_capture_sizes_are_graphed(impl):
    """Upstream's ``test_cudagraph_capture_sizes``: size 1 specializes into a static graph,
    which has no size to match and is not graphed either."""
    with upstream_setting(cudagraph_capture_sizes=(2, 5, 7)):
        fn = impl.compile(lambda x: x + 1)
        for size in range(1, 10):
            x = torch.randn(size, 4, device=impl.device)
            torch._dynamo.mark_dynamic(x, 0)
            for _ in range(3):
                torch.testing.assert_close(fn(x), x + 1)
    assert impl.counts().records == 3


def test_capture_sizes_of_several_sizes_are_tuples(impl):
    with upstream_setting(cudagraph_capture_sizes=((2, 3), (4, 5), (6, 7))):
        fn = impl.compile(lambda x: x * 2)
        for rows in range(2, 8):
            for columns in range(2, 8):
                if rows == columns:  # would share one symbol on a first compile
                    continue
                x = torch.randn(rows, columns, device=impl.device)
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(x, 1)
                for _ in range(3):
                    torch.testing.assert_close(fn(x), x * 2)
    assert impl.counts().records == 3


def test_skipping_warmup_records_the_first_call(impl):
    with upstream_setting(skip_cudagraph_warmup=True):
        fn = impl.compile(lambda x: x.cos())
        x = torch.randn(8, device=impl.device)
        torch.testing.assert_close(fn(x), x.cos())
        assert impl.counts().records == 1
        if impl.ours:
            assert inductor_xpugraph.stats()["warmups"] == 0
        torch.testing.assert_close(fn(x), x.cos())
    assert impl.counts().replays == 1


def test_forcing_warmup_never_records(impl):
    with upstream_setting(force_cudagraphs_warmup=True):
        fn = impl.compile(lambda x: x.cos())
        for _ in range(5):
            x = torch.randn(8, device=impl.device)
            torch.testing.assert_close(fn(x), x.cos())
    assert impl.counts().records == 0


def test_past_the_dynamic_shape_rerecord_limit_new_sizes_run_ungraphed(impl):
    with upstream_setting(cudagraph_dynamic_shape_rerecord_limit=2):
        fn = impl.compile(lambda x: x.sin(), dynamic=True)
        for size in (2, 3, 4, 5):  # warmup, record, replay each; 4 and 5 run un-graphed
            for _ in range(3):
                x = torch.randn(size, device=impl.device)
                torch.testing.assert_close(fn(x), x.sin())
        counts = impl.counts()
        assert (counts.records, counts.replays) == (2, 2)
        for size in (2, 3):  # the recorded sizes keep replaying
            x = torch.randn(size, device=impl.device)
            torch.testing.assert_close(fn(x), x.sin())
    assert impl.counts().replays == 4
    if impl.ours:
        (reason,) = impl.skip_messages()
        assert "already-recorded shapes still replay, new shapes run eager" in reason


def test_generation_cloning_keeps_outputs_held_past_their_step(impl):
    from inductor_xpugraph.trees.invalidation import can_copy_out_of_pool

    if impl.ours and not can_copy_out_of_pool():
        pytest.skip("this torch cannot copy graph memory out of the pool")
    with upstream_setting(cudagraph_trees_generation_cloning="user_visible"):
        fn = impl.compile(lambda x: x * 3)
        kept = []
        for step in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            kept.append(fn(torch.full((8,), float(step), device=impl.device)))
    for step, out in enumerate(kept):
        torch.testing.assert_close(out, torch.full((8,), 3.0 * step, device=impl.device))
    assert impl.counts().replays >= 2


@torch.library.custom_op("inductor_xpugraph_conformance::settles_late", mutates_args=())
def settles_late(x: torch.Tensor) -> torch.Tensor:
    """An op whose autotuner asks for another warmup while ``_UNSETTLED`` calls are left."""
    if _UNSETTLED[0]:
        _UNSETTLED[0] -= 1
        torch.compiler.cudagraph_mark_warmup_incomplete()
    return x + 1


@settles_late.register_fake
def _(x):
    return torch.empty_like(x)


_UNSETTLED = [0]


def test_a_warmup_marked_incomplete_warms_up_again_before_recording(impl):
    if not hasattr(torch.compiler, "cudagraph_mark_warmup_incomplete"):
        pytest.skip(f"torch {torch.__version__} has no cudagraph_mark_warmup_incomplete")
    _UNSETTLED[0] = 2
    fn = impl.compile(lambda x: settles_late(x) * 2)
    x = torch.ones(8, device=impl.device)
    for calls in range(1, 6):
        torch.compiler.cudagraph_mark_step_begin()
        torch.testing.assert_close(fn(x), (x + 1) * 2)
        assert impl.counts().records == (1 if calls >= 4 else 0), calls


@pytest.mark.difference(
    "upstream's trees before torch 2.13 never apply the limit while "
    "torch._dynamo.config.inline_inbuilt_nn_modules is on, the default: torch 2.11's "
    "exceed_rerecord_limit returns False then, and the reader records at every step",
    impls=("upstream",),
)
def test_past_the_unexpected_rerecord_limit_a_reader_of_moving_inputs_runs_ungraphed(impl):
    """A second graph reads a different output of the first at each step: its input moves at
    every call, and each move records it again, until the limit."""
    with upstream_setting(cudagraph_unexpected_rerecord_limit=2), torch.no_grad():
        produce = impl.compile(lambda x: tuple(x + i for i in range(6)))
        consume = impl.compile(lambda y: y * 2)
        x = torch.randn(8, device=impl.device)
        records = []
        for step in range(6):  # a warmup; records at steps 1-3; un-graphed from step 4
            impl.mark_step()
            outputs = produce(x)
            torch.testing.assert_close(consume(outputs[step]), (x + step) * 2)
            records.append(impl.counts().records)
    assert records[3:] == [4, 4, 4]  # the producer once, the reader once and twice again


@pytest.mark.difference(
    "upstream's trees skip cudagraph_skip_dynamic_graphs graphs without a message, so without "
    "raising (docs/semantics.md)",
    impls=("upstream",),
)
def test_with_or_error_a_graph_that_cannot_be_captured_raises(impl):
    with upstream_setting(cudagraph_or_error=True), impl.skip_dynamic_graphs():
        fn = impl.compile(lambda x: x + 1, dynamic=True)
        with pytest.raises(Exception, match="symbolic"):
            for size in (4, 6):
                fn(torch.randn(size, device=impl.device))


@pytest.mark.difference(
    "on cuda Inductor raises on every graph this package captures itself, with or without "
    "a reason of ours (README, limits)",
    impls=("ours-cuda-checkpointing", "ours-cuda-owned"),
)
def test_with_or_error_a_call_that_would_run_ungraphed_raises_and_changes_nothing(impl):
    """Writing to an input that is neither static nor a graph's output (a new tensor at each
    call) cannot be captured."""

    def count_and_double(x, counter):
        counter.add_(1)
        return x * 2

    with upstream_setting(cudagraph_or_error=True):
        fn = impl.compile(count_and_double)
        x = torch.randn(8, device=impl.device)
        counters = [torch.zeros(1, device=impl.device) for _ in range(3)]
        calls_done = 0
        with pytest.raises(Exception, match="mutat|writes input"):
            for counter in counters:
                fn(x, counter)
                calls_done += 1
    assert calls_done < 3  # the raising call wrote nothing
    assert [c.item() for c in counters] == [1.0] * calls_done + [0.0] * (3 - calls_done)


def test_without_input_mutation_support_a_graph_writing_a_graphs_output_is_not_captured(impl):
    """By default a graph may write to an output of an earlier graph (the trees own that
    memory); with ``cudagraph_support_input_mutation=False`` it is not captured."""

    def bump(y):
        y.add_(1)

    with upstream_setting(cudagraph_support_input_mutation=False), torch.no_grad():
        produce = impl.compile(lambda x: x * 2)
        writer = impl.compile(bump)
        x = torch.randn(8, device=impl.device)
        for _ in range(4):
            impl.mark_step()
            y = produce(x)
            writer(y)
            torch.testing.assert_close(y, x * 2 + 1)
    assert impl.counts().records == 1  # the producer only
    assert any("mutat" in message for message in impl.skip_messages())


@pytest.mark.difference(
    "Inductor keeps the override in its own compile state, which the wrapper generator "
    "cannot read: ours captures the code (docs/upstream-settings.md)",
    impls=("ours-cpu", "ours-cuda-checkpointing", "ours-cuda-owned"),
)
def test_code_under_override_cudagraphs_fwd_false_runs_ungraphed(impl):
    """``torch._dynamo.override_cudagraphs`` (torch 2.13+), as a decorator of a function the
    compiled code calls."""
    if not hasattr(torch._dynamo, "override_cudagraphs"):
        pytest.skip(f"torch {torch.__version__} has no torch._dynamo.override_cudagraphs")

    @torch._dynamo.override_cudagraphs(fwd=False)
    def scaled(x):
        return (x * 3).cos()

    fn = impl.compile(lambda x: scaled(x) + 1)
    x = torch.randn(8, device=impl.device)
    for _ in range(4):
        torch.testing.assert_close(fn(x), (x * 3).cos() + 1)
    assert impl.counts().records == 0
