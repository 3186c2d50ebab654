"""Upstream's settings for which sizes are graphed, when a size is recorded and what outputs
kept past their step hold, with upstream's meaning (``trees.recording_policy``,
``trees.handed_out``): ``triton.cudagraph_capture_sizes``, ``skip_cudagraph_warmup``,
``force_cudagraphs_warmup`` (torch 2.11+), ``cudagraph_dynamic_shape_rerecord_limit``,
``cudagraph_trees_generation_cloning`` and ``torch.compiler.cudagraph_mark_warmup_incomplete``
(2.15). A test is skipped, for every implementation, where the installed torch lacks its
setting."""

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
