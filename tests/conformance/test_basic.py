"""Basic replay and generations."""

import torch


def test_each_input_size_gets_its_own_graph(impl):
    fn = impl.compile(lambda x: x * x * x, dynamic=False)
    for size in (4, 5, 4, 5, 4, 5):  # warmup, record, replay for each
        x = torch.full((size, size), 2.0, device=impl.device)
        torch.testing.assert_close(fn(x), x**3)
    counts = impl.counts()
    assert (counts.records, counts.replays) == (2, 2)


def test_replays_compute_from_the_new_input_values(impl):
    fn = impl.compile(lambda x: (x + 1).relu())
    for _ in range(5):
        x = torch.randn(32, device=impl.device)
        torch.testing.assert_close(fn(x), (x + 1).relu())
    assert impl.counts().replays == 3


def test_functions_of_one_step_share_the_step(impl):
    """With mark_step_begin, a step's functions form one path; outputs flow between them."""
    first = impl.compile(lambda x: x * 2)
    second = impl.compile(lambda y: y + 3)
    for _ in range(4):
        impl.mark_step()
        x = torch.randn(8, device=impl.device)
        a = first(x)
        b = second(a)
        torch.testing.assert_close(a, x * 2)  # still valid within the step
        torch.testing.assert_close(b, x * 2 + 3)
    assert impl.counts().records == 2


def test_two_orders_of_the_same_functions_are_two_paths(impl):
    f = impl.compile(lambda x: x * 2)
    g = impl.compile(lambda x: x - 1)
    for _ in range(3):
        for order in ((f, g), (g, f)):
            impl.mark_step()
            x = torch.randn(8, device=impl.device)
            out = order[1](order[0](x))
            expected = (x * 2 - 1) if order[0] is f else (x - 1) * 2
            torch.testing.assert_close(out, expected)
    assert impl.counts().records == 4  # f and g below the root, and below each other


def test_a_module_replays_with_its_parameters(impl):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).to(impl.device)
    compiled = impl.compile(model)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(4, 16, device=impl.device)
            torch.testing.assert_close(compiled(x), model(x))
    assert impl.counts().replays == 2


def test_several_outputs_and_constants(impl):
    fn = impl.compile(lambda x: (x + 1, x.sum(), x.shape[0] * 2))
    for _ in range(3):
        x = torch.randn(6, device=impl.device)
        a, b, n = fn(x)
        torch.testing.assert_close(a, x + 1)
        torch.testing.assert_close(b, x.sum())
        assert n == 12


def test_a_function_that_returns_its_input_returns_the_caller_tensor(impl):
    fn = impl.compile(lambda x: (x, x + 1))
    for _ in range(3):
        x = torch.randn(6, device=impl.device)
        same, plus = fn(x)
        assert same is x or same.data_ptr() == x.data_ptr()
        torch.testing.assert_close(plus, x + 1)


def test_integer_inputs_are_sizes_not_tensors(impl):
    fn = impl.compile(lambda x, n: x.reshape(n, -1) * 2, dynamic=False)
    for _ in range(3):
        x = torch.randn(12, device=impl.device)
        torch.testing.assert_close(fn(x, 3), x.reshape(3, -1) * 2)


def test_replays_after_reset_record_again(impl):
    fn = impl.compile(lambda x: x.cos())
    x = torch.randn(8, device=impl.device)
    for _ in range(3):
        fn(x)
    impl.reset()
    torch._dynamo.reset()
    fn = impl.compile(lambda x: x.sin())
    for _ in range(3):
        torch.testing.assert_close(fn(x), x.sin())
