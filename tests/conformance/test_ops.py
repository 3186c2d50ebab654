"""Ops users put in reduce-overhead graphs: sampling, control flow, foreach, attention,
host reads, frozen weights."""

import torch


def test_multinomial_replays_draw_valid_samples(impl):
    fn = impl.compile(lambda p: torch.multinomial(p, 4, replacement=True))
    probabilities = torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 3, device=impl.device)
    draws = [fn(probabilities).clone() for _ in range(6)]
    for draw in draws:
        assert set(draw.flatten().tolist()) <= {1, 2}


def test_torch_cond_takes_the_branch_of_each_call(impl):
    def fn(flag, x):
        return torch.cond(flag, lambda x: x * 2, lambda x: x - 1, (x,))

    compiled = impl.compile(fn)
    for value in (True, False, True, False):
        x = torch.randn(8, device=impl.device)
        flag = torch.tensor(value, device=impl.device)
        torch.testing.assert_close(compiled(flag, x), x * 2 if value else x - 1)


def test_a_foreach_op(impl):
    def fn(xs):
        return torch._foreach_add(xs, 1.0)

    compiled = impl.compile(fn)
    for _ in range(3):
        xs = [torch.randn(4, device=impl.device) for _ in range(3)]
        for got, x in zip(compiled(xs), xs):
            torch.testing.assert_close(got, x + 1)


def test_scaled_dot_product_attention(impl):
    fn = impl.compile(torch.nn.functional.scaled_dot_product_attention)
    for _ in range(3):
        q, k, v = (torch.randn(2, 4, 16, 8, device=impl.device) for _ in range(3))
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        torch.testing.assert_close(fn(q, k, v), expected, rtol=1e-4, atol=1e-4)


def test_item_in_a_compiled_function_keeps_values_right(impl):
    def fn(x):
        scale = x.max().item()
        return x / scale

    compiled = impl.compile(fn)
    for _ in range(3):
        x = torch.rand(8, device=impl.device) + 0.5
        torch.testing.assert_close(compiled(x), x / x.max())


def test_frozen_weights_in_inference(impl):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).to(impl.device).eval()
    with torch._inductor.config.patch(freezing=True), torch.no_grad():
        compiled = impl.compile(model)
        for _ in range(4):
            x = torch.randn(2, 8, device=impl.device)
            torch.testing.assert_close(compiled(x), model(x))
