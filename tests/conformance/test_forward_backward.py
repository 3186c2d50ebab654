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


def clear_grads(*models):
    for model in models:
        model.zero_grad(set_to_none=True)


def assert_same_grads(model, reference):
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def assert_trains_like_eager(impl, model):
    """Four steps on batches of 8 × 16: the compiled model's gradients equal eager's at each,
    and the graphs replay."""
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    for _ in range(4):
        x = torch.randn(8, 16, device=impl.device)
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
        assert_same_grads(model, reference)
        clear_grads(model, reference)
    assert impl.counts().replays >= 4


def test_training_steps_give_eager_gradients(impl):
    assert_trains_like_eager(impl, mlp(impl.device))


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
        clear_grads(model, reference)


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
        clear_grads(model, reference)


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
        clear_grads(model, reference)


def test_two_forwards_then_their_backwards_give_eager_gradients(impl):
    model = mlp(impl.device)
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    for _ in range(3):
        xs = [torch.randn(8, 16, device=impl.device) for _ in range(2)]
        outs = [compiled(x) for x in xs]  # the second forward runs with a backward pending
        for out in outs:
            out.sum().backward()
        for x in xs:
            reference(x).sum().backward()
        assert_same_grads(model, reference)
        clear_grads(model, reference)


def test_a_held_output_backward_after_another_compiled_call(impl):
    model = mlp(impl.device)
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    other = impl.compile(lambda x: x * 2)
    for _ in range(3):
        x = torch.randn(8, 16, device=impl.device)
        out = compiled(x)
        torch.testing.assert_close(other(x), x * 2)  # while the backward is pending
        out.sum().backward()
        reference(x).sum().backward()
        assert_same_grads(model, reference)
        clear_grads(model, reference)


def test_mark_step_begin_starts_a_step_with_a_backward_pending(impl):
    model = mlp(impl.device)
    compiled = impl.compile(model)
    for _ in range(4):
        impl.mark_step()
        x = torch.randn(8, 16, device=impl.device)
        out = compiled(x)  # its backward never runs
        torch.testing.assert_close(out, model(x))


def test_dynamic_sizes_in_training(impl):
    model = mlp(impl.device)
    reference = copy.deepcopy(model)
    compiled = impl.compile(model, dynamic=True)
    for batch in (4, 6, 8, 4, 6, 8, 4):
        x = torch.randn(batch, 16, device=impl.device)
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
        assert_same_grads(model, reference)
        clear_grads(model, reference)


def test_batch_norm_in_training_updates_its_running_statistics(impl):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)).to(impl.device)
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    for _ in range(4):
        x = torch.randn(16, 8, device=impl.device)
        compiled(x).sum().backward()
        reference(x).sum().backward()
    bn, ref_bn = model[1], reference[1]
    torch.testing.assert_close(bn.running_mean, ref_bn.running_mean)
    torch.testing.assert_close(bn.running_var, ref_bn.running_var)
    assert bn.num_batches_tracked.item() == 4


def test_an_embedding_backward(impl):
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(50, 8).to(impl.device)
    reference = copy.deepcopy(embedding)
    compiled = impl.compile(embedding)
    for _ in range(3):
        ids = torch.randint(0, 50, (4, 6), device=impl.device)
        compiled(ids).square().sum().backward()
        reference(ids).square().sum().backward()
        torch.testing.assert_close(embedding.weight.grad, reference.weight.grad)
        embedding.weight.grad = reference.weight.grad = None


class _Checkpointed(torch.nn.Module):
    """A block under activation checkpointing: its forward runs again in the backward."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU())
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)
        return self.head(h)


def test_activation_checkpointing_gives_eager_gradients(impl):
    torch.manual_seed(0)
    assert_trains_like_eager(impl, _Checkpointed().to(impl.device))


def test_a_channels_last_convolution_trains_like_eager(impl):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()).to(
        impl.device, memory_format=torch.channels_last
    )
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    for _ in range(4):
        x = torch.randn(2, 3, 8, 8, device=impl.device).to(memory_format=torch.channels_last)
        out = compiled(x)
        assert out.is_contiguous(memory_format=torch.channels_last) == reference(x).is_contiguous(
            memory_format=torch.channels_last
        )
        out.sum().backward()
        reference(x).sum().backward()
        assert_same_grads(model, reference)
        clear_grads(model, reference)
    assert impl.counts().replays >= 4


def test_a_compiled_autograd_backward_gives_eager_gradients(impl):
    """Compiled autograd (``torch._dynamo.compiled_autograd``) traces the whole backward and
    compiles it in the same mode: the gradients equal eager's at every step, and once warm
    (its backward is compiled twice before it settles) a step replays the forward's and the
    backward's graphs and records nothing."""
    model = mlp(impl.device)
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    for step in range(6):
        if step == 4:
            warm = impl.counts()
        x = torch.randn(8, 16, device=impl.device)
        with torch._dynamo.compiled_autograd._enable(impl.compile):
            compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
        assert_same_grads(model, reference)
        clear_grads(model, reference)
    counts = impl.counts()
    assert counts.records == warm.records and counts.replays >= warm.replays + 4


@pytest.mark.parametrize("create_graph", [False, True], ids=["in_place", "out_of_place"])
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True:UserWarning")
def test_a_second_backward_accumulates_into_grad_as_autograd_does(impl, create_graph):
    """Two backwards through one compiled forward: autograd adds the second gradient into
    ``.grad`` in place, or, under ``create_graph=True``, into a new tensor, leaving the
    first ``.grad`` object as it was. Graphs must not change which."""
    fn = impl.compile(lambda x: x * 3 + 2)  # a backward graph with a kernel (x + 2 has none)
    for _ in range(4):
        x = torch.randn(5, 5, device=impl.device, requires_grad=True)
        grad_output = torch.ones(5, 5, device=impl.device)
        y = fn(x)
        y.backward(grad_output, retain_graph=True)
        first_grad, first_values = x.grad, x.grad.clone()
        y.backward(grad_output, create_graph=create_graph)
        if create_graph:
            torch.testing.assert_close(first_grad, first_values)
        else:
            assert x.grad is first_grad
        torch.testing.assert_close(x.grad, first_values * 2)
    assert impl.counts().replays >= 2
