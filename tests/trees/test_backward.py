"""Backward graphs through one forward, any number of times while autograd retains it.

``retain_graph=True`` double backward, two losses from one forward, and a gradient penalty
(``torch.autograd.grad(..., retain_graph=True)`` then ``backward()``): gradients equal eager's
with graphs replaying. Runs on the CPU emulator everywhere and on cuda (both memory
strategies) with ``-m gpu``.
"""

import copy

import pytest
import torch

import inductor_xpugraph


def mlp(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(
        device
    )


def two_backwards(model, x):
    loss = model(x).square().mean()
    loss.backward(retain_graph=True)
    loss.backward()


def two_losses(model, x):
    out = model(x)
    out[:, :2].sum().backward(retain_graph=True)
    out[:, 2:].square().mean().backward()


def gradient_penalty(model, x):
    """``autograd.grad`` on the inputs, then ``backward()`` through the same forward."""
    x = x.requires_grad_()
    out = model(x)
    (grad_x,) = torch.autograd.grad(out.sum(), x, retain_graph=True)
    (out.square().mean() + 0.1 * grad_x.square().sum()).backward()


@pytest.mark.parametrize("step", [two_backwards, two_losses, gradient_penalty])
def test_backwards_through_one_forward_match_eager_while_graphs_replay(device, step):
    model = mlp(device)
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(5):
        x = torch.randn(8, 16, device=device)
        step(compiled, x.clone())
        step(reference, x.clone())
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
            p.grad = q.grad = None
    stats = inductor_xpugraph.stats()
    assert stats["replays"] >= 9 and stats["liveness_fallbacks"] == 0
