"""Graph breaks and data-dependent branches: several graphs per step, guards picking code."""

import torch


def test_a_graph_break_splits_a_step_into_two_graphs(impl):
    def fn(x):
        y = x.sin() * 2
        torch._dynamo.graph_break()
        return y.cos() + 1

    compiled = impl.compile(fn)
    for _ in range(4):
        x = torch.randn(8, device=impl.device)
        torch.testing.assert_close(compiled(x), (x.sin() * 2).cos() + 1)
    counts = impl.counts()
    assert counts.records == 2 and counts.replays == 4


def test_a_data_dependent_branch_takes_both_paths_correctly(impl):
    def fn(x):
        if x.sum() > 0:
            return x * 2
        return x - 100

    compiled = impl.compile(fn)
    for sign in (1, -1, 1, -1, 1, -1):
        x = torch.rand(8, device=impl.device) * sign
        expected = x * 2 if sign > 0 else x - 100
        torch.testing.assert_close(compiled(x), expected)


def test_a_python_side_effect_between_graphs_runs_every_call(impl):
    calls = []

    def fn(x):
        y = x + 1
        calls.append(1)  # a graph break: runs in Python each call
        return y * 2

    compiled = impl.compile(fn)
    for _ in range(4):
        x = torch.randn(8, device=impl.device)
        torch.testing.assert_close(compiled(x), (x + 1) * 2)
    assert len(calls) == 4


def test_training_through_a_graph_break(impl):
    torch.manual_seed(0)
    first = torch.nn.Linear(8, 8).to(impl.device)
    second = torch.nn.Linear(8, 1).to(impl.device)

    def fn(x):
        h = first(x).relu()
        torch._dynamo.graph_break()
        return second(h)

    compiled = impl.compile(fn)
    for _ in range(4):
        x = torch.randn(4, 8, device=impl.device)
        compiled(x).sum().backward()
        grads = [p.grad.clone() for p in (*first.parameters(), *second.parameters())]
        for p in (*first.parameters(), *second.parameters()):
            p.grad = None
        fn(x).sum().backward()
        for grad, p in zip(grads, (*first.parameters(), *second.parameters())):
            torch.testing.assert_close(grad, p.grad)
            p.grad = None


def test_a_graph_fed_an_eager_copy_of_an_output_it_was_recorded_on_reads_the_copy(impl):
    """Upstream's test_tensor_no_longer_in_pool: ``goo`` was recorded on ``foo``'s output
    (graph memory, not copied); later it gets a clone of that output instead."""
    foo = impl.compile(lambda x: x + 1)
    goo = impl.compile(lambda x: x * 2)
    for feed in (lambda y: y,) * 3 + (torch.clone,) * 3 + (lambda y: y,) * 2:
        impl.mark_step()
        x = torch.rand(2, 3, device=impl.device)
        torch.testing.assert_close(goo(feed(foo(x))), (x + 1) * 2)
