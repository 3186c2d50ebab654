"""Re-records: parameters that move, new module instances, and the limit."""

import copy

import torch


def test_a_replaced_parameter_is_used_by_the_next_call(impl):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(impl.device)
    compiled = impl.compile(model)
    x = torch.randn(2, 8, device=impl.device)
    kept = []
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        for _ in range(3):
            kept.append(model.weight)
            model.weight = torch.nn.Parameter(torch.randn_like(model.weight))
            torch.testing.assert_close(compiled(x), model(x))


def test_a_new_module_instance_each_call_computes_with_its_own_weights(impl):
    compiled = None
    x = torch.randn(2, 8, device=impl.device)
    modules = []
    with torch.no_grad():
        for seed in range(5):
            torch.manual_seed(seed)
            modules.append(torch.nn.Linear(8, 8).to(impl.device))
            compiled = impl.compile(modules[-1])
            torch.testing.assert_close(compiled(x), modules[-1](x))


def test_parameters_that_keep_moving_stop_being_recorded(impl):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(impl.device)
    compiled = impl.compile(model)
    x = torch.randn(2, 8, device=impl.device)
    kept = []
    with impl.rerecord_limit(2), torch.no_grad():
        for _ in range(8):
            kept.append(model.weight)
            model.weight = torch.nn.Parameter(torch.randn_like(model.weight))
            torch.testing.assert_close(compiled(x), model(x))
        records = impl.counts().records
        for _ in range(3):
            kept.append(model.weight)
            model.weight = torch.nn.Parameter(torch.randn_like(model.weight))
            torch.testing.assert_close(compiled(x), model(x))
    assert impl.counts().records == records  # un-graphed from then on


def test_weights_loaded_in_place_are_used_without_recording_again(impl):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(impl.device)
    compiled = impl.compile(model)
    x = torch.randn(2, 8, device=impl.device)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        model.load_state_dict(torch.nn.Linear(8, 8).to(impl.device).state_dict())
        torch.testing.assert_close(compiled(x), model(x))
    assert impl.counts().records == 1


def test_two_modules_through_one_compiled_function_alternate(impl):
    torch.manual_seed(0)
    modules = [torch.nn.Linear(8, 8).to(impl.device) for _ in range(2)]
    fn = impl.compile(lambda module, x: module(x).relu())
    x = torch.randn(2, 8, device=impl.device)
    with torch.no_grad():
        for _ in range(6):
            for module in modules:
                torch.testing.assert_close(fn(module, x), module(x).relu())


def test_parameter_sets_that_alternate_never_fall_back(impl):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(impl.device)
    compiled = impl.compile(model)
    weights = [model.weight, torch.nn.Parameter(torch.randn_like(model.weight))]
    x = torch.randn(2, 8, device=impl.device)
    with impl.rerecord_limit(2), torch.no_grad():
        for step in range(20):
            model.weight = weights[step % 2]
            torch.testing.assert_close(compiled(x), model(x))
        replays = impl.counts().replays
        for step in range(4):
            model.weight = weights[step % 2]
            compiled(x)
    assert impl.counts().replays == replays + 4  # still graphed


def test_a_static_address_input_updated_in_place_is_not_recorded_again(impl):
    fn = impl.compile(lambda x, table: x + table)
    table = torch.zeros(8, device=impl.device)
    torch._dynamo.mark_static_address(table)
    for step in range(5):
        table.fill_(float(step))
        x = torch.randn(8, device=impl.device)
        torch.testing.assert_close(fn(x, table), x + step)
    assert impl.counts().records == 1


def test_a_replaced_static_address_input_is_read_at_its_new_address(impl):
    fn = impl.compile(lambda x, table: x + table)
    tables = []
    for step in range(5):
        tables.append(torch.full((8,), float(step), device=impl.device))
        torch._dynamo.mark_static_address(tables[-1])
        x = torch.randn(8, device=impl.device)
        torch.testing.assert_close(fn(x, tables[-1]), x + step)


def test_code_loaded_from_the_compile_cache_records_and_replays(impl):
    def fn(x):
        return (x @ x.T).relu()

    x = torch.randn(8, 8, device=impl.device)
    compiled = impl.compile(fn)
    for _ in range(3):
        compiled(x)
    torch._dynamo.reset()  # the next compile is an FX graph cache hit
    records = impl.counts().records
    compiled = impl.compile(fn)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), fn(x))
    assert impl.counts().records == records + 1


def swap_parameters_and_back(impl, fn, gradient):
    """Train ``fn(x, p)`` with one parameter, then another, then the first again, each
    step's output and ``p.grad`` (``gradient(x, p)``) equal to eager's; once both have been
    seen, swapping between them records nothing."""
    compiled = impl.compile(fn)
    x = torch.rand(2, 2, device=impl.device)
    p1, p2 = (torch.nn.Parameter(torch.rand(2, 2, device=impl.device)) for _ in range(2))

    def train_step(p):
        out = compiled(x, p)
        torch.testing.assert_close(out, fn(x, p))
        out.sum().backward()
        torch.testing.assert_close(p.grad, gradient(x, p))
        p.grad = None

    for p in (p1,) * 3 + (p2,) * 3 + (p1,) * 2:
        train_step(p)
    records = impl.counts().records
    for p in (p2, p1, p2, p1):
        train_step(p)
    assert impl.counts().records == records


def test_a_parameter_swapped_after_a_graph_break_and_back_replays_its_recording(impl):
    """Upstream's test_multi_dispatch_child_node: only the graph after the break reads the
    parameter. Each parameter gets its recording, and swapping back records nothing."""

    def fn(x, p):
        y = x * x
        torch._dynamo.graph_break()
        return y * p

    swap_parameters_and_back(impl, fn, gradient=lambda x, p: x * x)


def test_a_replaced_buffer_and_the_restored_one_give_eager_values(impl):
    """Upstream's test_multi_dispatch_builtin_module_buffers: a BatchNorm's running mean is
    replaced by another tensor, then the original is put back."""
    torch.manual_seed(0)
    model = torch.nn.BatchNorm1d(4).to(impl.device)
    reference = copy.deepcopy(model)
    compiled = impl.compile(model)
    originals = {id(m): m.running_mean for m in (model, reference)}
    replacement = torch.rand(4, device=impl.device)
    for phase in ("original", "replaced", "restored"):
        for m in (model, reference):
            m.running_mean = replacement.clone() if phase == "replaced" else originals[id(m)]
        for _ in range(3):
            x = torch.randn(8, 4, device=impl.device)
            torch.testing.assert_close(compiled(x), reference(x))
            torch.testing.assert_close(model.running_mean, reference.running_mean)
    assert model.running_mean is originals[id(model)]


def test_a_parameter_swapped_before_a_graph_break_and_back_replays_its_recordings(impl):
    """Upstream's test_multi_dispatch_parent_node: the graph before the break reads the
    parameter, so each parameter's recording has its own graph after the break too."""

    def fn(x, p):
        y = x * p
        torch._dynamo.graph_break()
        return y.sin()

    swap_parameters_and_back(impl, fn, gradient=lambda x, p: x * (x * p).cos())


class _Run(torch.nn.Module):
    def forward(self, module, x):
        return module(x)


def test_a_new_module_passed_in_at_every_call_stops_recording(impl):
    """One compiled ``run(module, x)`` given a new ``nn.Linear`` at every call: its
    parameters arrive at new or recycled addresses each time, and at most
    ``rerecord_limit`` re-records follow the first recording."""
    run = impl.compile(_Run())
    x = torch.randn(2, 8, device=impl.device)
    with impl.rerecord_limit(2), torch.no_grad():
        for seed in range(10):
            torch.manual_seed(seed)
            module = torch.nn.Linear(8, 8).to(impl.device)
            torch.testing.assert_close(run(module, x), module(x))
    assert impl.counts().records <= 1 + 2
