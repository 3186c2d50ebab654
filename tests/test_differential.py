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


def run_random_steps(device, seed):
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

    for _ in range(STEPS):
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
                with pytest.raises(RuntimeError, match="overwritten by a subsequent run"):
                    out.sum()
                stale_reads += 1
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
    assert stale_reads > 50 and fresh_reads > 20
    assert stats["replays"] > STEPS // 2
    assert stats["rerecords"] > 0
