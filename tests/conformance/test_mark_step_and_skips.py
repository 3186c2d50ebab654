"""mark_step_begin, and the reasons graphs are skipped."""

import pytest
import torch


def test_mark_step_begin_lets_one_invocation_run_a_function_twice(impl):
    fn = impl.compile(lambda x: x * 2)
    for _ in range(4):
        impl.mark_step()
        x = torch.randn(8, device=impl.device)
        a = fn(x)
        b = fn(a)
        torch.testing.assert_close(b, x * 4)


def test_without_mark_step_each_invocation_is_a_step(impl):
    fn = impl.compile(lambda x: x * 2)
    x = torch.randn(8, device=impl.device)
    outs = [fn(x) for _ in range(4)]
    torch.testing.assert_close(outs[-1], x * 2)
    with pytest.raises(RuntimeError, match=impl.stale_output):
        outs[-2] + 0


def test_a_cpu_op_in_a_device_graph_keeps_the_values_right(impl):
    if impl.device == "cpu":
        pytest.skip("on the emulator every op is a CPU op")

    def fn(x, y_cpu):
        return x + 1, y_cpu * 2

    compiled = impl.compile(fn)
    for _ in range(3):
        x, y = torch.randn(8, device=impl.device), torch.randn(8)
        a, b = compiled(x, y)
        torch.testing.assert_close(a, x + 1)
        torch.testing.assert_close(b, y * 2)


def test_an_op_with_a_data_dependent_size_keeps_the_values_right(impl):
    def fn(x):
        return x.nonzero().float().sum() + x

    compiled = impl.compile(fn)
    for _ in range(3):
        x = torch.randn(8, device=impl.device)
        torch.testing.assert_close(compiled(x), x.nonzero().float().sum() + x)
