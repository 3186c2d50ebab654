"""Empty outputs, outputs that are not tensors, None, and CPU scalars."""

import pytest
import torch


def test_an_empty_output(impl):
    fn = impl.compile(lambda x: (x[:0] * 2, x + 1))
    for _ in range(3):
        x = torch.randn(8, device=impl.device)
        empty, plus = fn(x)
        assert empty.shape == (0,)
        torch.testing.assert_close(plus, x + 1)


def test_a_none_output(impl):
    def fn(x):
        return None, x * 2

    compiled = impl.compile(fn)
    for _ in range(3):
        x = torch.randn(8, device=impl.device)
        none, doubled = compiled(x)
        assert none is None
        torch.testing.assert_close(doubled, x * 2)


def test_an_output_that_does_not_depend_on_inputs(impl):
    fn = impl.compile(lambda x: (torch.ones(3, device=x.device), x + 1))
    for _ in range(3):
        ones, _ = fn(torch.randn(4, device=impl.device))
        torch.testing.assert_close(ones, torch.ones(3, device=impl.device))


def test_a_cpu_scalar_tensor_input_is_read_on_each_call(impl):
    if impl.device == "cpu":
        pytest.skip("on the emulator every tensor is a CPU tensor")
    fn = impl.compile(lambda x, scale: x * scale)
    for value in (1.0, 2.0, 3.0, 4.0):
        x = torch.randn(8, device=impl.device)
        torch.testing.assert_close(fn(x, torch.tensor(value)), x * value)


def test_a_zero_dim_output(impl):
    fn = impl.compile(lambda x: x.sum())
    for _ in range(3):
        x = torch.randn(8, device=impl.device)
        out = fn(x)
        assert out.dim() == 0
        torch.testing.assert_close(out, x.sum())


def test_an_empty_input(impl):
    fn = impl.compile(lambda x, y: (x * 2, y + 1))
    for _ in range(3):
        x, y = torch.randn(0, 4, device=impl.device), torch.randn(4, device=impl.device)
        empty, plus = fn(x, y)
        assert empty.shape == (0, 4)
        torch.testing.assert_close(plus, y + 1)


def test_a_cpu_scalar_input_beside_device_inputs_keeps_its_value(impl):
    # Where the scalar's result lives is Inductor's choice (on the H100 both implementations
    # return it on the device); its value must follow the input in every call.
    if impl.device == "cpu":
        pytest.skip("on the emulator every tensor is a CPU tensor")
    fn = impl.compile(lambda x, s: (x + 1, s * 2))
    for value in (1.0, 2.0, 3.0, 4.0, 5.0):
        x = torch.randn(8, device=impl.device)
        plus, scaled = fn(x, torch.tensor(value))
        torch.testing.assert_close(plus, x + 1)
        assert scaled.item() == value * 2


def test_autocast_does_not_cache_a_cast_of_a_graph_output(impl):
    """Upstream's test_amp_cache_disabled: a cast autocast made of an output must not be
    served again once that output's memory changed."""
    compiled = impl.compile(lambda x: x + x)
    for _ in range(3):
        out = compiled(torch.rand(16, 16, device=impl.device, requires_grad=True))
    other = torch.rand(16, 16, device=impl.device)
    with torch.autocast(impl.device, dtype=torch.bfloat16):
        before = out @ other
        out.detach().zero_()
        after = out @ other
    assert not torch.equal(before, after)
    assert torch.count_nonzero(after) == 0
