"""A capture the device refuses never fails the user's call.

SYCL Graph, under ``torch.xpu.XPUGraph``, refuses work a CUDA capture accepts (a fused
attention kernel, host waits, collectives on another queue). Whatever step of a capture
fails, the call returns what it returns without graphs, later calls run that callable
un-graphed, other graphs keep recording, and random ops keep working. On cuda the failures
are injected at the three points a device can refuse (``capture_begin``, inside the captured
code, ``capture_end``), in XPU's order of operations where it differs from CUDA's: XPU's
``capture_begin`` puts the generator into capture mode and routes the pool before recording
starts, so a refusal there leaves both behind (torch's XPUGraph.cpp, read from the sources).
The same behaviours on a scripted device: ``test_device_graph_backend.py``.
"""

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph.trees.backends import device_graphs
from inductor_xpugraph.trees.per_thread import all_trees


@torch.library.custom_op("inductor_xpugraph_tests::waits_for_the_host", mutates_args=())
def waits_for_the_host(x: torch.Tensor) -> torch.Tensor:
    """A host wait on the stream being captured: refused by a CUDA capture (and by SYCL
    Graph), fine eagerly. On cuda it breaks the capture, so ``capture_end`` fails as well;
    on the emulator, where a host wait is legal, it raises as the device would."""
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        torch.cuda.current_stream().synchronize()
    elif not x.is_cuda and any(tree.backend.is_capturing() for tree in all_trees()):
        raise RuntimeError("waits_for_the_host: a host wait cannot be recorded")
    return x * 2


@waits_for_the_host.register_fake
def _(x):
    return torch.empty_like(x)


class RefusingGraph:
    """A ``torch.cuda.CUDAGraph`` that refuses to record at ``point``, leaving torch's state
    as the device would: "begin" as XPU's ``capture_begin`` does when SYCL recording cannot
    start (generator in capture mode, allocator routing into the pool, nothing recording);
    "end" as a failed ``cudaStreamEndCapture`` / XPU ``end_recording``."""

    def __init__(self, point: str) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.point = point

    def register_generator_state(self, generator) -> None:
        self.graph.register_generator_state(generator)

    def capture_begin(self, **kwargs) -> None:
        self.graph.capture_begin(**kwargs)
        if self.point == "begin":
            _break_the_capture()
            with pytest.raises(RuntimeError):
                self.graph.capture_end()  # ends the stream capture; the generator stays
            raise RuntimeError("recording could not begin (injected)")

    def capture_end(self) -> None:
        if self.point == "end":
            _break_the_capture()
        self.graph.capture_end()

    def replay(self) -> None:
        self.graph.replay()


def _break_the_capture() -> None:
    with pytest.raises(RuntimeError):
        torch.cuda.current_stream().synchronize()


@pytest.fixture
def refuse(monkeypatch):
    """``refuse(point)``: the next capture of compiled code on cuda is refused at ``point``;
    ``refuse(point, every=True)``: every capture from now on, empty ones included."""
    from inductor_xpugraph.trees.backends.cuda import CudaGraphBackend

    monkeypatch.setattr(device_graphs, "_DEVICES_THAT_CANNOT_RECORD", {})
    plan = {"point": None, "every": False, "in_capture": False}
    real_new_graph, real_capture = CudaGraphBackend.new_graph, CudaGraphBackend.capture

    def new_graph(self):
        if plan["point"] is None or not (plan["every"] or plan["in_capture"]):
            return real_new_graph(self)
        point = plan["point"]
        if not plan["every"]:
            plan["point"] = None
        return RefusingGraph(point)

    def capture(self, *args):
        plan["in_capture"] = True
        try:
            return real_capture(self, *args)
        finally:
            plan["in_capture"] = False

    monkeypatch.setattr(CudaGraphBackend, "new_graph", new_graph)
    monkeypatch.setattr(CudaGraphBackend, "capture", capture)

    def arm(point: str, every: bool = False) -> None:
        plan["point"], plan["every"] = point, every

    return arm


def mlp(device):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)]
    return torch.nn.Sequential(*layers).to(device)


def assert_random_ops_work(device):
    torch.rand(4, device=device)
    noisy = torch.compile(lambda x: x * torch.rand_like(x), mode="reduce-overhead")
    x = torch.randn(64, device=device)
    draws = [noisy(x).clone() for _ in range(4)]
    assert not torch.equal(draws[-1], draws[-2])  # fresh numbers at each replay


@pytest.mark.parametrize("point", ["begin", "inside", "end"])
@torch.no_grad()
def test_a_refused_capture_returns_eagers_results_and_random_ops_work(
    cuda_each_strategy, refuse, point
):
    model = mlp("cuda")
    if point == "inside":
        compiled = torch.compile(lambda x: waits_for_the_host(model(x)), mode="reduce-overhead")
        expected = lambda x: model(x) * 2  # noqa: E731
    else:
        compiled = torch.compile(model, mode="reduce-overhead")
        expected = model
    for call in range(4):  # warmup, the refused capture, two un-graphed calls
        if call == 1 and point != "inside":
            refuse(point)
        x = torch.randn(16, 32, device="cuda")
        torch.testing.assert_close(compiled(x), expected(x))
    stats = inductor_xpugraph.stats()
    assert stats["capture_failures"] == 1 and stats["replays"] == 0, stats
    assert_random_ops_work("cuda")
    assert inductor_xpugraph.stats()["replays"] >= 2


@torch.no_grad()
def test_a_device_that_cannot_record_runs_every_graph_ungraphed(cuda_each_strategy, refuse):
    """Every capture is refused, the empty repair capture too: the device is given up for
    the process (one warning), its generator is taken out of capture mode, and every
    compiled model returns eager's results."""
    model = mlp("cuda")
    compiled = torch.compile(model, mode="reduce-overhead")
    noisy = torch.compile(lambda x: x * torch.rand_like(x), mode="reduce-overhead")
    for call in range(4):
        if call == 1:  # once the backend exists (a cuda backend captures at its start)
            refuse("begin", every=True)
        x = torch.randn(16, 32, device="cuda")
        torch.testing.assert_close(compiled(x), model(x))
        out = noisy(x)
        assert ((out.abs() <= x.abs() + 1e-6) & (out.sign() * x.sign() >= 0)).all()
    torch.rand(4, device="cuda")
    (tree,) = [tree for tree in all_trees() if tree.device == "cuda:0"]
    assert tree.backend.cannot_record is not None
    assert inductor_xpugraph.stats()["replays"] == 0


@torch.library.custom_op("inductor_xpugraph_tests::doubles_then_waits_in_backward", mutates_args=())
def doubles_then_waits_in_backward(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@doubles_then_waits_in_backward.register_fake
def _(x):
    return torch.empty_like(x)


doubles_then_waits_in_backward.register_autograd(
    lambda ctx, grad: waits_for_the_host(grad)  # the backward's capture is refused
)


def test_a_refused_backward_capture_runs_on_the_activations_lent_to_it(device):
    """The backward's inputs are activations its forward saved, which nothing else
    references: they are lent to its capture, which may free them after their last use.
    The capture is refused; the un-graphed backward gets tensors over that memory, with its
    values, and the gradients are eager's."""
    model = mlp(device)
    reference = mlp(device)

    def step(net, x):
        hidden = torch.nn.functional.gelu(net[0](x))
        return net[2](doubles_then_waits_in_backward(hidden)).square().mean()

    compiled = torch.compile(step, mode="reduce-overhead")
    for _ in range(4):  # warmup; forward recorded, backward refused; then un-graphed
        x = torch.randn(16, 32, device=device)
        compiled(model, x).backward()
        step(reference, x).backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None
    assert inductor_xpugraph.stats()["capture_failures"] == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a cuda device")
def test_a_generator_input_draws_fresh_numbers_at_each_replay():
    """A ``torch.Generator`` passed to captured code is registered with its graph, so each
    replay advances it as eager calls would (upstream's trees do the same)."""
    from inductor_xpugraph.trees.backends.cuda import CudaGraphBackend

    backend = CudaGraphBackend(0)
    generator = torch.Generator(device="cuda")
    generator.manual_seed(0)
    out = torch.empty(8, device="cuda")

    def draw(args):
        out.copy_(torch.rand(8, device="cuda", generator=args[0]))
        return [out]

    backend.warmup(draw, [generator])
    graph, _ = backend.capture(draw, [generator], backend.new_pool(), lambda args: None)
    draws = []
    for _ in range(3):
        graph.replay()
        draws.append(out.clone())
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
