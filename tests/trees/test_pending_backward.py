"""Forwards in training mode whose backward may never run (Note [A backward that can no
longer run] in ``trees/generation.py``): an evaluation loop without ``torch.no_grad()`` replays
one graph, and forwards kept for a later backward record below each other, as upstream's
trees do; a backward that is not captured ends the wait as a captured one does. Runs on the
CPU emulator everywhere and on cuda (both memory strategies) with ``-m gpu``."""

import copy

import torch

import inductor_xpugraph


@torch.library.custom_op(
    "inductor_xpugraph_tests::scale_uncapturable",
    mutates_args=(),
    tags=(torch.Tag.cudagraph_unsafe,),
)
def scale_uncapturable(x: torch.Tensor) -> torch.Tensor:
    """An op graphs may not capture (``cudagraph_unsafe``): a graph that has it is skipped."""
    return x * 2


@scale_uncapturable.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("inductor_xpugraph_tests::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    """Doubles ``x``; its backward uses ``scale_uncapturable``: a model with it has a
    forward graph that is captured and a backward graph that is not."""
    return x * 2


@scale.register_fake
def _(x):
    return torch.empty_like(x)


scale.register_autograd(lambda ctx, grad: scale_uncapturable(grad))


def batch_norm_mlp(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.GELU(), torch.nn.Linear(32, 4)
    ).to(device)


def test_a_training_mode_forward_whose_results_are_dropped_replays_one_graph(device):
    model = batch_norm_mlp(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(20):
        x = torch.randn(8, 16, device=device)
        torch.testing.assert_close(compiled(x), reference(x))  # result dropped, no backward
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"]) == (1, 18), stats


def test_forwards_whose_backwards_are_still_to_come_train_like_eager(device):
    """Losses kept for one backward over all of them: each forward is recorded below the
    last one, with memory of its own, and the gradients are eager's."""
    model = batch_norm_mlp(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(3):  # warm up and record the single-forward step
        x = torch.randn(8, 16, device=device)
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
    for _ in range(3):  # record, then replay, the step of four forwards
        batches = [torch.randn(8, 16, device=device) for _ in range(4)]
        sum(compiled(x).square().mean() for x in batches).backward()
        sum(reference(x).square().mean() for x in batches).backward()
        for ours, eager in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(ours.grad, eager.grad)
    assert inductor_xpugraph.stats()["replays"] > 0


def test_a_forward_whose_backward_is_not_captured_replays_while_its_output_is_held(device):
    """The caller holds the last step's output while it calls the next step (``y = f(x)``
    in a loop). The backward runs un-graphed, and still ends its step: before
    ``ungraphed_backward``, every step recorded the forward again below the last one."""
    compiled = torch.compile(lambda x: scale(x) + 1, mode="reduce-overhead")
    for _ in range(10):
        x = torch.randn(5, 5, device=device, requires_grad=True)
        y = compiled(x)
        y.sum().backward()
        torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"], stats["skips"]) == (1, 8, 1), stats


class _TwoRegions(torch.nn.Module):
    """Two linear layers with a graph break between them: two forwards, two backwards."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x):
        h = self.a(x).relu()
        torch._dynamo.graph_break()
        return self.b(h)


def _accumulate_two_micro_batches(device, steps=8, warm_after=5):
    """Train with two micro-batches per step and ``zero_grad()`` (gradients set to None),
    checking the gradients against eager's at every step; returns the stats after
    ``warm_after`` steps and at the end."""
    torch.manual_seed(0)
    model = _TwoRegions().to(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    for step in range(steps):
        if step == warm_after:
            warm = inductor_xpugraph.stats()
        for _ in range(2):
            x = torch.randn(4, 32, device=device)
            compiled(x).square().mean().backward()
            reference(x).square().mean().backward()
        for ours, eager in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(ours.grad, eager.grad)
        model.zero_grad()
        reference.zero_grad()
    return warm, inductor_xpugraph.stats()


def test_gradient_accumulation_across_a_graph_break_replays_every_micro_batch(device):
    """The first micro-batch's gradients become ``.grad`` (referenced), the second's are
    added and dropped. A backward recorded where an earlier gradient output was dead reused
    its memory; where that output is alive, a recording that does not reuse it is made once,
    and from then on every micro-batch replays."""
    warm, final = _accumulate_two_micro_batches(device)
    assert final["records"] == warm["records"], final
    assert final["replays"] - warm["replays"] == 3 * 2 * 4, final  # 3 steps, 2 micro, 4 graphs
    assert final["liveness_fallbacks"] == 0, final


def test_a_liveness_recording_beyond_the_bound_on_variants_leaves_the_step_instead(device):
    """With no room for another recording, the step runs un-graphed from that graph on (as
    evicting one would let alternating liveness patterns record at every call)."""
    with inductor_xpugraph.config.patch(static_input_variants=1):
        warm, final = _accumulate_two_micro_batches(device)
    assert final["records"] == warm["records"], final
    # Where a recording reuses the memory of the first micro-batch's gradients (owned
    # outputs), its step leaves the tree there, once a step; where none does (checkpointing,
    # whose warmups in the pool leave the gradients elsewhere), no step has to.
    assert final["liveness_fallbacks"] - warm["liveness_fallbacks"] in (0, 3), final


def test_a_loop_that_keeps_outputs_needing_backward_runs_un_graphed_and_is_told_why(device):
    """``out = model(x)`` in a loop without ``torch.no_grad()`` and without a backward: the
    held outputs may still be backpropagated, so the step never ends. Its first call warmed
    up in the graph pool, and its outputs are still held: no graph may run over them, so
    every call runs un-graphed (as upstream's trees keep warming up), and that is said once,
    with the fixes. Every output kept stays right. Under ``torch.no_grad()`` the same loop
    replays one graph."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    xs = [torch.randn(4, 16, device=device) for _ in range(30)]
    kept = [compiled(x) for x in xs]
    for x, out in zip(xs, kept):
        torch.testing.assert_close(out, model(x))
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"]) == (0, 0), stats
    reasons = [
        e.reason for e in inductor_xpugraph.report().events if e.kind.value == "pending backward"
    ]
    assert len(reasons) == 1 and "torch.no_grad()" in reasons[0]

    inductor_xpugraph.reset()
    with torch.no_grad():
        for x in xs[:12]:
            out = compiled(x)
    stats = inductor_xpugraph.stats()
    assert stats["records"] == 1 and stats["replays"] == 10, stats
    assert not [e for e in inductor_xpugraph.report().events if e.kind.value == "pending backward"]
