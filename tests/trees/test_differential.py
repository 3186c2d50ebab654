"""Randomized differential test: thousands of random steps against eager, zero mismatches.

Steps mix inference calls of random sizes, training steps (forward + backward), holding
outputs and dropping them, reading held outputs, ``mark_step_begin()``, parameter swaps
(re-records) and in-place optimizer updates, on a model with a graph break (a two-node
path). The oracle knows the generation rules: an output stays readable until the next
generation starts, which is at every compiled call before the first ``mark_step_begin()``,
and after it at the first compiled call that follows each ``mark_step_begin()``. Every read
of an older output must raise the documented error; every other result must equal eager.
"""

import copy
import random

import pytest
import torch

import inductor_xpugraph

STEPS = 2000
SIZES = (2, 3, 5)


class BrokenMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(8, 16)
        self.second = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.first(x))
        torch._dynamo.graph_break()
        return self.second(h).tanh()


@pytest.mark.parametrize("seed", [0])
def test_random_call_sequences_match_eager(device, seed):
    # Parameter swaps re-record; never fall back, so every output comes from the tree.
    with inductor_xpugraph.config.patch(rerecord_limit=STEPS):
        run_random_steps(device, seed)


def run_random_steps(device, seed, steps=STEPS):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = BrokenMLP().to(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=True)

    generation, mark_step_used, mark_pending = 0, False, False  # the oracle's view
    held = []  # (output, expected value, generation it was produced in)
    stale_reads = fresh_reads = 0

    def run_compiled(x, train):
        nonlocal generation, mark_pending
        if not mark_step_used or mark_pending:
            generation += 1
            mark_pending = False
        if train:
            out = compiled(x)
            loss = out.square().sum()
            loss.backward()
            ref_loss = reference(x).square().sum()
            ref_loss.backward()
            torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
                p.grad = q.grad = None
            return out, reference(x).detach()
        with torch.no_grad():
            return compiled(x), reference(x)

    for _ in range(steps):
        action = rng.choices(
            ["infer", "train", "hold", "read", "drop", "mark_step", "swap", "sgd"],
            weights=[30, 12, 10, 15, 5, 8, 2, 3],
        )[0]
        if action in ("infer", "train", "hold"):
            if mark_step_used and rng.random() < 0.85:  # iterations mostly marked
                inductor_xpugraph.mark_step_begin()
                mark_pending = True
            x = torch.randn(rng.choice(SIZES), 8, device=device)
            out, expected = run_compiled(x, train=action == "train")
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
            if action == "hold":
                held.append((out, expected.clone(), generation))
        elif action == "read" and held:
            out, expected, produced_in = held[-1] if rng.random() < 0.5 else rng.choice(held)
            if produced_in < generation:
                # A graph's output raises; an un-graphed (warmup) run's is readable through
                # the step after its own. Anything else is a silent stale read.
                try:
                    value = out.clone()
                except RuntimeError as error:
                    assert "overwritten by a subsequent run" in str(error)
                    stale_reads += 1
                else:
                    assert produced_in == generation - 1, "an output two steps old read"
                    torch.testing.assert_close(value, expected, rtol=1e-4, atol=1e-5)
            else:
                torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
                fresh_reads += 1
        elif action == "drop":
            held.clear()
        elif action == "mark_step":
            inductor_xpugraph.mark_step_begin()
            mark_step_used = mark_pending = True
        elif action == "swap":  # a new parameter object: new address, re-record
            with torch.no_grad():
                value = torch.randn_like(model.first.weight) * 0.3
            model.first.weight = torch.nn.Parameter(value.clone())
            reference.first.weight = torch.nn.Parameter(value.clone())
        elif action == "sgd":  # in-place update: same address, no re-record
            with torch.no_grad():
                for p, q in zip(model.parameters(), reference.parameters()):
                    noise = torch.randn_like(p) * 0.01
                    p.add_(noise), q.add_(noise)

    stats = inductor_xpugraph.stats()
    print(f"stale reads {stale_reads}, fresh reads {fresh_reads}, stats {stats}")
    assert stale_reads > steps // 40 and fresh_reads > steps // 100
    assert stats["replays"] > steps // 2
    assert stats["rerecords"] > 0


def test_random_training_with_accumulation_held_views_and_grads_matches_eager(device):
    """Gradient accumulation (1-4 micro-batches in a row), ``zero_grad`` with and without
    ``set_to_none``, held views of outputs, ``.grad`` reads, ``mark_step_begin`` and parameter
    swaps, at random: every gradient and weight equals eager's, a view of graph memory from an
    older generation raises, and no read is silently stale."""
    with inductor_xpugraph.config.patch(rerecord_limit=STEPS):
        stale_reads, grad_reads = run_random_training(device, seed=1)
    stats = inductor_xpugraph.stats()
    print(f"stale view reads {stale_reads}, grad reads {grad_reads}, stats {stats}")
    assert stale_reads > 50 and grad_reads > 50
    assert stats["replays"] > STEPS // 2 and stats["handovers"] > 0 and stats["rerecords"] > 0


def run_random_training(device, seed, steps=STEPS):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = BrokenMLP().to(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    generation, mark_step_used, mark_pending = 0, False, False  # the oracle's view
    held = []  # (view of an output, its expected value, the generation that produced it)
    stale_reads = grad_reads = 0

    def call(x):
        nonlocal generation, mark_pending
        if not mark_step_used or mark_pending:
            generation += 1
            mark_pending = False
        return compiled(x)

    def assert_grads_match():
        for p, q in zip(model.parameters(), reference.parameters()):
            assert (p.grad is None) == (q.grad is None)
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)

    for _ in range(steps):
        action = rng.choices(
            ["accumulate", "sgd_step", "hold_view", "read", "read_grads", "mark_step", "swap"],
            weights=[30, 10, 15, 20, 10, 8, 2],
        )[0]
        if action == "accumulate":  # one micro-batch: forward and backward
            if mark_step_used and rng.random() < 0.3:
                inductor_xpugraph.mark_step_begin()
                mark_pending = True
            x = torch.randn(4, 8, device=device)
            out = call(x)
            if rng.random() < 0.3:  # keep a view of the training output
                view = out.detach()[1:] if rng.random() < 0.5 else out.data[:, :2]
                held.append((view, view.clone(), generation))
            out.square().sum().backward()
            reference(x).square().sum().backward()
        elif action == "sgd_step":  # optimizer step, then zero_grad either way
            with torch.no_grad():
                for p, q in zip(model.parameters(), reference.parameters()):
                    if p.grad is not None:
                        p.sub_(0.01 * p.grad)
                        q.sub_(0.01 * q.grad)
            set_to_none = rng.random() < 0.5
            for p in list(model.parameters()) + list(reference.parameters()):
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
        elif action == "hold_view":  # an inference call, a view of its output kept
            with torch.no_grad():
                x = torch.randn(4, 8, device=device)
                out = call(x)
                view = out[rng.randrange(4) :] if rng.random() < 0.5 else out.reshape(-1)
                torch.testing.assert_close(out, reference(x), rtol=1e-4, atol=1e-5)
                held.append((view, view.clone(), generation))
        elif action == "read" and held:
            view, expected, produced_in = rng.choice(held)
            if produced_in < generation:
                # Graph memory raises; a view of an un-graphed (warmup) run's output is
                # ordinary memory and may keep its value. Anything else is a silent stale read.
                try:
                    value = view.clone()
                except RuntimeError as error:
                    assert "overwritten by a subsequent run" in str(error)
                    stale_reads += 1
                else:
                    assert torch.equal(value, expected), "silent read of overwritten memory"
            else:
                torch.testing.assert_close(view, expected)
        elif action == "read_grads":
            assert_grads_match()
            grad_reads += 1
        elif action == "mark_step":
            inductor_xpugraph.mark_step_begin()
            mark_step_used = mark_pending = True
        elif action == "swap":  # a new parameter object: new address, re-record
            value = torch.randn_like(model.first.weight) * 0.3
            grad = model.first.weight.grad
            model.first.weight = torch.nn.Parameter(value.clone())
            reference.first.weight = torch.nn.Parameter(value.clone())
            if grad is not None:
                model.first.weight.grad = grad.clone()
                reference.first.weight.grad = grad.clone()
        if len(held) > 20:
            held = held[-20:]
    assert_grads_match()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    return stale_reads, grad_reads


@pytest.mark.parametrize("run", [run_random_steps, run_random_training], ids=["calls", "training"])
def test_random_steps_trip_no_debug_check(device, run):
    """``config.debug_checks`` (no held output changes during a call) raises nothing on the
    random sequences, and their results still equal eager's."""
    with inductor_xpugraph.config.patch(rerecord_limit=STEPS, debug_checks=True):
        run(device, seed=2, steps=300)
    assert inductor_xpugraph.stats()["outputs_checked"] > 100
