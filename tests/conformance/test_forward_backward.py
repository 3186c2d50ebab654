"""Training: forward and backward graphs of one step form one path; partial and double
backward; gradient accumulation."""

import copy

import pytest
import torch


def mlp(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(
        device
    )


def assert_same_grads(model, reference):
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_training_steps_give_eager_gradients(impl):
    model = mlp(impl.device)
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    for _ in range(4):
        x = torch.randn(8, 16, device=impl.device)
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
        assert_same_grads(model, reference)
        for p in list(model.parameters()) + list(reference.parameters()):
            p.grad = None
    assert impl.counts().replays >= 4


def test_a_backward_through_part_of_the_outputs(impl):
    def two_heads(x, w):
        h = x @ w
        return h.sin(), h.cos()

    fn = impl.compile(two_heads)
    for _ in range(4):
        x = torch.randn(4, 4, device=impl.device)
        w = torch.randn(4, 4, device=impl.device, requires_grad=True)
        sin, _ = fn(x, w)
        sin.sum().backward()
        w_ref = w.detach().clone().requires_grad_()
        (x @ w_ref).sin().sum().backward()
        torch.testing.assert_close(w.grad, w_ref.grad)


@torch._functorch.config.patch(donated_buffer=False)  # AOTAutograd's condition for retain_graph
def test_two_backwards_through_one_forward(impl):
    model = mlp(impl.device)
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    for _ in range(4):
        x = torch.randn(8, 16, device=impl.device)
        out, ref = compiled(x), reference(x)
        out.sum().backward(retain_graph=True)
        out.square().sum().backward()
        ref.sum().backward(retain_graph=True)
        ref.square().sum().backward()
        assert_same_grads(model, reference)
        for p in list(model.parameters()) + list(reference.parameters()):
            p.grad = None


def test_a_forward_without_backward_then_training(impl):
    model = mlp(impl.device)
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    for _ in range(3):
        x = torch.randn(8, 16, device=impl.device)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), reference(x))
        compiled(x).sum().backward()
        reference(x).sum().backward()
        assert_same_grads(model, reference)
        for p in list(model.parameters()) + list(reference.parameters()):
            p.grad = None


def test_a_forward_whose_backward_never_runs_does_not_block_the_next_step(impl):
    model = mlp(impl.device)
    compiled = impl.compile(model)
    for _ in range(4):
        x = torch.randn(8, 16, device=impl.device)
        compiled(x)  # output dropped, no backward
    x = torch.randn(8, 16, device=impl.device)
    torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.difference(
    "upstream's trees raise on the second micro-batch's backward (its gradients from the "
    "previous generation are overwritten); ours hands gradients over and accumulates",
    impls=("upstream",),
)
def test_gradient_accumulation_over_micro_batches(impl):
    model = mlp(impl.device)
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    for _ in range(3):
        for _ in range(3):
            x = torch.randn(8, 16, device=impl.device)
            compiled(x).square().mean().backward()
            reference(x).square().mean().backward()
        assert_same_grads(model, reference)
        for p in list(model.parameters()) + list(reference.parameters()):
            p.grad = None
