"""Outputs that alias inputs, each other or parameters; expanded, unaligned and strided inputs."""

import torch


def test_an_output_view_of_an_input_aliases_the_input(impl):
    fn = impl.compile(lambda x: (x.view(-1), x + 1))
    for _ in range(3):
        x = torch.randn(4, 4, device=impl.device)
        view, plus = fn(x)
        assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        torch.testing.assert_close(plus, x + 1)


def test_two_outputs_over_one_buffer_share_it(impl):
    def fn(x):
        y = x * 2
        return y, y.view(-1)[2:]

    compiled = impl.compile(fn)
    for _ in range(3):
        x = torch.randn(4, 4, device=impl.device)
        y, tail = compiled(x)
        torch.testing.assert_close(tail, (x * 2).view(-1)[2:])
        y.view(-1)[5] = 100.0
        assert tail[3].item() == 100.0


def test_a_view_of_a_parameter_stays_valid_across_steps(impl):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4).to(impl.device)
    compiled = impl.compile(lambda x: (model(x), model.weight[0]))
    with torch.no_grad():
        rows = []
        for _ in range(4):
            out, row = compiled(torch.randn(2, 4, device=impl.device))
            rows.append(row)
        for row in rows:  # parameter memory is not graph memory: never stale
            torch.testing.assert_close(row, model.weight[0])


def test_an_expanded_input_is_read_correctly(impl):
    fn = impl.compile(lambda x: x * 2 + 1)
    for _ in range(3):
        base = torch.randn(1, 8, device=impl.device)
        x = base.expand(4, 8)
        torch.testing.assert_close(fn(x), x * 2 + 1)


def test_an_unaligned_input_is_read_correctly(impl):
    fn = impl.compile(lambda x: x.sin())
    for _ in range(3):
        x = torch.randn(17, device=impl.device)[1:]  # storage offset 1
        torch.testing.assert_close(fn(x), x.sin())


def test_a_transposed_input_is_read_correctly(impl):
    fn = impl.compile(lambda x: x @ x.T)
    for _ in range(3):
        x = torch.randn(6, 3, device=impl.device).t()
        torch.testing.assert_close(fn(x), x @ x.T)


def test_an_input_returned_after_in_place_mutation_of_a_buffer_output(impl):
    class Running(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("mean", torch.zeros(8))

        def forward(self, x):
            self.mean.mul_(0.9).add_(0.1 * x)
            return self.mean

    module, reference = Running().to(impl.device), Running().to(impl.device)
    compiled = impl.compile(module)
    for _ in range(4):
        x = torch.randn(8, device=impl.device)
        out = compiled(x)
        torch.testing.assert_close(out, reference(x))
    assert out.untyped_storage().data_ptr() == module.mean.untyped_storage().data_ptr()
