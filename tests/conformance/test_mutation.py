"""Input mutation: eager inputs (not captured, with a reason), buffers and static inputs
(captured), outputs of an earlier graph of the step (captured)."""

import torch


def test_mutating_a_new_eager_input_at_every_call_gives_eager_values_and_says_so(impl):
    """Upstream never captures it. Ours runs the first new tensor after the warmup
    un-graphed, saying so, and records the next one copying it in and back at each replay."""

    def add_into(x):
        x.add_(2)
        return x * 1

    fn = impl.compile(add_into)
    for _ in range(4):
        x = torch.ones(10, device=impl.device)
        torch.testing.assert_close(fn(x), torch.full((10,), 3.0, device=impl.device))
        torch.testing.assert_close(x, torch.full((10,), 3.0, device=impl.device))
    assert impl.counts().records == (1 if impl.ours else 0)
    assert any("mutat" in m or "writes input" in m for m in impl.skip_messages())


def test_mutating_a_buffer_is_captured_and_persists(impl):
    class Accumulate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(10))

        def forward(self, x):
            self.total.add_(x)
            return self.total + x

    module, reference = Accumulate().to(impl.device), Accumulate().to(impl.device)
    compiled = impl.compile(module)
    for _ in range(4):
        x = torch.randn(10, device=impl.device)
        torch.testing.assert_close(compiled(x), reference(x))
        torch.testing.assert_close(module.total, reference.total)
    assert impl.counts().records == 1


def test_mutating_a_static_address_input_is_captured(impl):
    def step(x, cache):
        cache.mul_(0.5).add_(x)
        return cache.sum()

    fn = impl.compile(step)
    cache = torch.zeros(16, device=impl.device)
    torch._dynamo.mark_static_address(cache)
    expected = torch.zeros(16, device=impl.device)
    for _ in range(4):
        x = torch.randn(16, device=impl.device)
        expected = expected * 0.5 + x
        torch.testing.assert_close(fn(x, cache), expected.sum())
    torch.testing.assert_close(cache, expected)
    assert impl.counts().records == 1


def test_mutating_an_output_of_an_earlier_graph_of_the_step_is_captured(impl):
    produce = impl.compile(lambda x: x + 1)

    def add_two(t):
        t.add_(2)
        return t

    mutate = impl.compile(add_two)
    for _ in range(4):
        impl.mark_step()
        x = torch.rand(4, device=impl.device)
        out = mutate(produce(x))
        torch.testing.assert_close(out, x + 3)
    assert not any("mutat" in m or "writes input" in m for m in impl.skip_messages())


def test_an_in_place_op_on_an_intermediate_is_captured(impl):
    def fn(x):
        y = x * 2
        y.add_(1)
        return y

    compiled = impl.compile(fn)
    for _ in range(3):
        x = torch.randn(8, device=impl.device)
        torch.testing.assert_close(compiled(x), x * 2 + 1)
    assert impl.counts().records == 1


def test_index_put_into_a_buffer_is_captured(impl):
    class Cache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("slots", torch.zeros(8, 4))

        def forward(self, position, value):
            self.slots.index_copy_(0, position, value)
            return self.slots.sum(0)

    module, reference = Cache().to(impl.device), Cache().to(impl.device)
    compiled = impl.compile(module)
    for step in range(4):
        position = torch.tensor([step], device=impl.device)
        value = torch.randn(1, 4, device=impl.device)
        torch.testing.assert_close(compiled(position, value), reference(position, value))
    torch.testing.assert_close(module.slots, reference.slots)


def test_a_plain_tensor_attribute_mutated_in_forward_keeps_eager_values(impl):
    """Upstream's test_tensor_constant_mutation: a tensor attribute that is not a buffer."""

    class Accumulator(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.total = torch.zeros(2, 3, device=impl.device)

        def forward(self, x):
            self.total += 1
            return x + self.total

    model, reference = Accumulator(), Accumulator()
    compiled = impl.compile(model)
    for _ in range(5):
        x = torch.rand(2, 3, device=impl.device)
        torch.testing.assert_close(compiled(x), reference(x))
    torch.testing.assert_close(model.total, reference.total)
