"""A replay hands out the same output objects again only while nobody else holds them.

Reusing an object saves building one per output per replay (a training forward has ~100).
Whoever holds an earlier output (a Python reference, a view's base, autograd) must never see
it handed out again, and the stale-output rules must reach it as any output. Runs on the CPU
emulator everywhere and on cuda (both memory strategies) with ``-m gpu``.
"""

import copy
import weakref

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph.trees import recording
from inductor_xpugraph.trees.per_thread import all_trees

STALE = "overwritten by a subsequent run"


def replaying(device, fn, x):
    """``fn`` compiled, called until it replays."""
    compiled = torch.compile(fn, mode="reduce-overhead")
    for _ in range(3):
        compiled(x)
    assert inductor_xpugraph.stats()["replays"] >= 1
    return compiled


def test_reference_counts_of_unheld_objects_were_measured_on_this_interpreter():
    assert recording._OWN_REFS > 0  # 0 would mean never reused: correct, but slow


def test_an_output_nobody_holds_is_handed_out_again_as_the_same_object(device):
    x = torch.randn(8, device=device)
    compiled = replaying(device, lambda x: x * 2, x)
    first = weakref.ref(compiled(x))
    out = compiled(x)
    assert out is first()
    torch.testing.assert_close(out, x * 2)


def test_an_output_the_caller_holds_is_never_handed_out_again(device):
    x = torch.randn(8, device=device)
    compiled = replaying(device, lambda x: x * 2, x)
    held = compiled(x)
    out = compiled(x + 1)
    assert out is not held
    torch.testing.assert_close(out, (x + 1) * 2)
    with pytest.raises(RuntimeError, match=STALE):
        held.sum()


def test_an_output_only_a_view_keeps_is_never_handed_out_again(device):
    x = torch.randn(8, device=device)
    compiled = replaying(device, lambda x: x * 2, x)
    out = compiled(x)
    first = weakref.ref(out)
    view = out[:4]
    del out
    out = compiled(x + 1)
    assert out is not first()
    torch.testing.assert_close(out, (x + 1) * 2)
    with pytest.raises(RuntimeError, match=STALE):
        view.sum()


def test_a_hook_on_an_output_does_not_fire_in_a_later_step(device):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 8, device=device)
    calls = []
    for step in range(5):
        out = compiled(x)
        if step == 3:
            out.register_hook(lambda grad: calls.append(step))
        out.sum().backward()
        del out
    assert calls == [3]
    assert inductor_xpugraph.stats()["replays"] >= 4


def test_saved_activations_are_reused_and_training_matches_eager(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    model = model.to(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    kept = []
    for step in range(8):
        x = torch.randn(8, 16, device=device)
        for net, optimizer in ((compiled, opt), (reference, ref_opt)):
            net(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        if step == 4:
            forward = next(n for t in all_trees() for n in t.nodes() if n.phase == "forward")
            kept = [weakref.ref(out) for out in forward.recording._output_objects]
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)
    # The saved activations' objects are the same in the last three steps; the output
    # (with autograd history) is new each step.
    objects = forward.recording._output_objects
    tensors = [i for i, out in enumerate(objects) if isinstance(out, torch.Tensor)]
    activations = [i for i in tensors if not objects[i].requires_grad]
    assert activations and all(kept[i]() is objects[i] for i in activations)
    assert all(kept[i]() is not objects[i] for i in tensors if objects[i].requires_grad)


def test_a_held_output_keeps_its_memory_alive_for_the_memory_strategies(device):
    x = torch.randn(8, device=device)
    compiled = replaying(device, lambda x: x * 2, x)
    out = compiled(x)
    (node,) = [n for t in all_trees() for n in t.nodes()]
    (block,) = node.recording.blocks
    assert not block.is_dead()  # the caller holds the object itself: no other reference
    del out
    assert block.is_dead()


def test_a_training_output_held_into_the_next_step_raises_and_no_memory_is_retired(
    device, monkeypatch
):
    """``out = model(x); out.sum().backward()`` in a loop: when a step starts the caller still
    holds the previous output, with its autograd graph. That object raises from then on, as
    an object: its graph's memory is not retired (no recording rebuilds its outputs)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(4, 8, device=device)
    rebuilt = []
    rebuild = recording.Recording.rebuild_aliases
    monkeypatch.setattr(
        recording.Recording, "rebuild_aliases", lambda self: (rebuilt.append(self), rebuild(self))
    )
    for _ in range(3):  # warmup, record, replay
        out = compiled(x)
        out.sum().backward()
    rebuilt.clear()
    for _ in range(4):
        previous, out = out, compiled(x)
        out.sum().backward()
        with pytest.raises(RuntimeError, match=STALE):
            previous.sum()
        torch.testing.assert_close(out, model(x))
    assert rebuilt == [] and inductor_xpugraph.stats()["handovers"] == 0
