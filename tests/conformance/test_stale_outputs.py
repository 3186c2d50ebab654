"""Outputs of an earlier generation: reading them raises, with a message that says what to do."""

import pytest
import torch


def run_three_times(fn, x):
    outs = [fn(x) for _ in range(3)]
    return outs


def test_an_output_of_an_earlier_step_raises_when_read(impl):
    fn = impl.compile(lambda x: x * 3)
    x = torch.randn(8, device=impl.device)
    first, second, third = run_three_times(fn, x)
    with pytest.raises(RuntimeError, match=impl.stale_output):
        print(second)
    torch.testing.assert_close(third, x * 3)


def test_the_message_says_how_to_keep_an_output(impl):
    fn = impl.compile(lambda x: x * 3)
    x = torch.randn(8, device=impl.device)
    outs = run_three_times(fn, x)
    with pytest.raises(RuntimeError) as error:
        outs[1] + 1
    message = str(error.value)
    assert "clone" in message and "cudagraph_mark_step_begin" in message


def test_a_clone_keeps_its_value(impl):
    fn = impl.compile(lambda x: x * 3)
    kept = []
    for _ in range(4):
        x = torch.randn(8, device=impl.device)
        kept.append((fn(x).clone(), x * 3))
    for value, expected in kept:
        torch.testing.assert_close(value, expected)


def test_a_view_of_an_earlier_output_raises(impl):
    fn = impl.compile(lambda x: x * 3)
    x = torch.randn(8, 2, device=impl.device)
    views = [fn(x)[0] for _ in range(3)]
    with pytest.raises(RuntimeError, match=impl.stale_output):
        views[1] + 1


def test_mark_step_begin_ends_the_step_for_outputs_of_the_same_invocation(impl):
    fn = impl.compile(lambda x: x + 1)
    x = torch.randn(8, device=impl.device)
    for _ in range(3):
        impl.mark_step()
        fn(x)
    impl.mark_step()
    out = fn(x)
    impl.mark_step()
    fn(x)
    with pytest.raises(RuntimeError, match=impl.stale_output):
        out + 1


def test_outputs_dropped_by_the_caller_raise_nothing(impl):
    fn = impl.compile(lambda x: x.exp())
    x = torch.randn(8, device=impl.device)
    for _ in range(6):
        out = fn(x)
        del out
    torch.testing.assert_close(fn(x), x.exp())


def test_an_output_used_before_the_next_call_has_its_value(impl):
    fn = impl.compile(lambda x: x.exp())
    total = torch.zeros(8, device=impl.device)
    expected = torch.zeros(8, device=impl.device)
    for _ in range(5):
        x = torch.randn(8, device=impl.device)
        total += fn(x)
        expected += x.exp()
    torch.testing.assert_close(total, expected)


def test_an_earlier_output_passed_back_in_raises(impl):
    fn = impl.compile(lambda x: x * 3)
    x = torch.randn(8, device=impl.device)
    outs = run_three_times(fn, x)
    with pytest.raises(RuntimeError, match=impl.stale_output):
        fn(outs[1])


@pytest.mark.difference(
    "upstream invalidates a step's outputs before a call of the next step warms up or records "
    "(try_end_curr_warmup, try_end_curr_recording), so that call raises reading the output "
    "passed back in; ours gives the call a copy (README, outputs passed back in)",
    impls=("upstream",),
)
def test_the_previous_output_passed_back_in_is_read_as_an_input(impl):
    fn = impl.compile(lambda x: x * 0.5 + 1)
    state = torch.randn(8, device=impl.device)
    expected = state.clone()
    for _ in range(5):
        state = fn(state)
        expected = expected * 0.5 + 1
    torch.testing.assert_close(state, expected)
