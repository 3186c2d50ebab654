"""The backend over ``torch.accelerator.Graph`` (``trees.backends.accelerator_graphs``) on a
scripted accelerator, and how ``backend_class`` picks it.

No Intel GPU or PrivateUse1 device is here: ``torch.accelerator``'s functions, ``torch.Stream``
and ``torch.accelerator.Graph`` are replaced by a script that logs what runs on which stream
and keeps the allocator's view of pools, as torch's XPUGraphImpl does things (capture_begin
routes the pool before recording starts; capture_end ends recording before the routing; a
graph gives back its hold on the pool when destroyed, if its capture ended).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging

import pytest
import torch
from support.scripted_devices import ScriptedDeviceBase, ScriptedStream

from inductor_xpugraph import config
from inductor_xpugraph._settings import from_environment
from inductor_xpugraph.trees.backends import backend_class, capture_streams, device_graphs
from inductor_xpugraph.trees.backends.accelerator_graphs import (
    GENERATOR_NOT_REGISTERED,
    AcceleratorGraphBackend,
    _PoolGivenAtCaptureBegin,
    accelerator_backend_class,
)
from inductor_xpugraph.trees.backends.cuda import CudaGraphBackend
from inductor_xpugraph.trees.backends.devices import DEVICES
from inductor_xpugraph.trees.backends.xpu import XpuGraphBackend
from inductor_xpugraph.trees.memory import CheckpointedPool, OwnedOutputs, memory_strategy

PRIVATEUSE1 = torch._C._get_privateuse1_backend_name()


class ScriptedGraph:
    """``torch.accelerator.Graph`` over XPU's implementation, in the order its C++ does
    things. ``capture_begin`` takes no arguments: the pool is ``graph_pool``."""

    def __init__(self, accelerator, keep_graph=False, *, pool=None, capture_error_mode="default"):
        self.accelerator = accelerator
        self.graph_pool = pool
        self.capture_error_mode = capture_error_mode
        self.mempool_id = None
        self.capture_ended = False
        self.fail = accelerator.fail  # this graph's capture fails; the next one's does not
        if not accelerator.keep_failing:
            accelerator.fail = None

    def capture_begin(self) -> None:
        accelerator = self.accelerator
        accelerator.generator_capturing = True  # the default generator is registered first
        if self.graph_pool is None:  # a pool of its own, named by the graph
            self.mempool_id = ("graph", next(accelerator.pool_ids))
        else:
            self.mempool_id = self.graph_pool
        accelerator.begin_allocate_to_pool(self.mempool_id)
        if self.fail == "begin":  # begin_recording raised
            raise RuntimeError("scripted: the queue could not start recording")
        accelerator.capturing_on = accelerator.current
        accelerator.log.append(f"capture begins on {accelerator.current.name}")

    def capture_end(self) -> None:
        accelerator = self.accelerator
        accelerator.capturing_on = None
        accelerator.log.append("capture ends")
        if self.fail == "end":  # end_recording raised: nothing below ran
            raise RuntimeError("scripted: end_recording failed")
        accelerator.end_allocate_to_pool(0, self.mempool_id)
        self.capture_ended = True
        accelerator.generator_capturing = False

    def replay(self) -> None:
        self.accelerator.log.append("replay")

    def reset(self) -> None:
        self.accelerator.log.append("reset")

    def pool(self):
        return self.mempool_id

    def __enter__(self):
        raise AssertionError("Graph.__enter__ synchronizes the device and empties the caches")

    def __del__(self) -> None:
        if self.capture_ended:
            self.accelerator.release_pool(0, self.mempool_id)


class ScriptedAccelerator(ScriptedDeviceBase):
    """``torch.accelerator``, ``torch.Stream`` and the device's allocator, writing a log."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.streams: list[tuple[str, torch.device]] = []
        self.current = ScriptedStream(self, "caller", torch.device(device_type, 0))
        self.pool_ids = itertools.count(1)

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(capture_streams, "_capture_streams", {})  # this script's streams only
        accelerator = torch.accelerator
        monkeypatch.setattr(accelerator, "is_available", lambda: True)
        monkeypatch.setattr(accelerator, "current_accelerator", self.current_accelerator)
        monkeypatch.setattr(accelerator, "device_count", lambda: 1)
        monkeypatch.setattr(accelerator, "current_stream", self.current_stream)
        monkeypatch.setattr(accelerator, "set_stream", self.set_stream)
        monkeypatch.setattr(accelerator, "device_index", self.device_index)
        monkeypatch.setattr(accelerator, "synchronize", self.synchronize, raising=False)
        monkeypatch.setattr(accelerator, "Graph", self.Graph, raising=False)
        monkeypatch.setattr(torch, "Stream", self.Stream)
        if self.device_type == "xpu":  # the xpu record's pool calls
            monkeypatch.setattr(torch.xpu, "graph_pool_handle", self.graph_pool_handle)
            monkeypatch.setattr(torch._C, "_xpu_endAllocateToPool", self.end_allocate_to_pool)
            monkeypatch.setattr(torch._C, "_xpu_releasePool", self.release_pool)

    # torch.accelerator and torch.Stream
    def current_accelerator(self, check_available: bool = False) -> torch.device:
        return torch.device(self.device_type)

    def current_stream(self, device=None) -> ScriptedStream:
        return self.current

    def set_stream(self, stream: ScriptedStream) -> None:
        self.current = stream

    @contextlib.contextmanager
    def device_index(self, index):
        yield

    def synchronize(self, device=None) -> None:
        raise AssertionError("the device was synchronized: another thread's capture breaks")

    def Graph(self, *args, **kwargs) -> ScriptedGraph:  # noqa: N802 - torch's name
        return ScriptedGraph(self, *args, **kwargs)

    def Stream(self, device) -> ScriptedStream:  # noqa: N802 - torch's name
        self.streams.append(device)
        name = "capture" if len(self.streams) == 1 else f"stream{len(self.streams)}"
        return ScriptedStream(self, name, device)

    # the device's allocator
    def graph_pool_handle(self):
        return ("handle", next(self.pool_ids))


@pytest.fixture
def xpu(monkeypatch):
    accelerator = ScriptedAccelerator("xpu")
    accelerator.install(monkeypatch)
    return accelerator


@pytest.fixture
def privateuse1(monkeypatch):
    accelerator = ScriptedAccelerator(PRIVATEUSE1)
    accelerator.install(monkeypatch)
    return accelerator


def run_on_current_stream(accelerator, name):
    def fn(args):
        accelerator.log.append(f"{name} runs on {accelerator.current.name}")
        return [f"{name} output"]

    return fn


def capture(backend, accelerator, pool, name="captured code"):
    return backend.capture(run_on_current_stream(accelerator, name), [], pool, lambda args: None)


# -- capture and replay ------------------------------------------------------------------------


def test_capture_runs_on_a_torch_stream_of_the_device_and_replays_torchs_graph(xpu):
    backend = accelerator_backend_class("xpu")(0)
    assert xpu.streams == [torch.device("xpu", 0)]  # the capture stream: torch.Stream(device=)
    pool = backend.new_pool()
    xpu.log.clear()

    graph, outputs = capture(backend, xpu, pool)

    assert outputs == ["captured code output"]
    assert xpu.log == [
        "host waits for caller",
        "host waits for capture",
        "capture waits for caller",
        "capture begins on capture",
        "captured code runs on capture",
        "capture ends",
        "caller waits for capture",
    ]
    assert xpu.current.name == "caller"  # the stream before the capture is current again
    assert xpu.routing == []
    graph.replay()
    assert xpu.log[-1] == "replay"
    assert graph.replay.__self__ is graph.graph  # torch's own replay, no call in between


def test_every_graph_is_captured_into_the_pool_its_keeper_made(xpu):
    backend = accelerator_backend_class("xpu")(0)
    pool = backend.new_pool()
    assert pool.keeper.pool() == pool.handle
    first, _ = capture(backend, xpu, pool, "first")
    second, _ = capture(backend, xpu, pool, "second")
    assert first.pool() == second.pool() == pool.handle
    assert xpu.holds[pool.handle] == 3  # the keeper and the two graphs
    del first, second
    gc.collect()
    assert xpu.holds[pool.handle] == 1


def test_a_device_without_a_pool_handle_call_names_its_pool_by_the_keeper(privateuse1):
    backend = accelerator_backend_class(PRIVATEUSE1)(0)
    pool = backend.new_pool()
    assert pool.handle[0] == "graph"  # made by the keeper's capture_begin, not by a handle call
    graph, _ = capture(backend, privateuse1, pool)
    assert graph.pool() == pool.handle
    assert privateuse1.holds[pool.handle] == 2


# -- failed captures -------------------------------------------------------------------------


@pytest.mark.parametrize("failure", ["begin", "end"])
def test_a_failed_capture_leaves_no_routing_held(xpu, failure, monkeypatch, caplog):
    """XPU's graph implementation also routes the host allocator into the pool, which no
    Python call undoes after a failed capture: the device routing is stopped, the hold given
    back, the generator taken out of capture mode, and captures stop on the device, said
    once (Note [Recovering from a failed capture])."""
    monkeypatch.setattr(device_graphs, "_DEVICES_THAT_CANNOT_RECORD", {})
    monkeypatch.setattr(torch.xpu, "default_generators", (xpu.generator,), raising=False)
    backend = accelerator_backend_class("xpu")(0)
    pool = backend.new_pool()
    xpu.fail = failure
    with caplog.at_level(logging.WARNING, logger="inductor_xpugraph"):
        with pytest.raises(RuntimeError, match="scripted"):
            capture(backend, xpu, pool)
    gc.collect()
    assert xpu.routing == []
    assert xpu.holds[pool.handle] == 1  # the keeper's: the failed capture's hold was given back
    assert not xpu.generator_capturing
    assert xpu.current.name == "caller"
    assert "host (pinned memory) allocator" in backend.cannot_record
    assert caplog.text.count("cannot record graphs in this process") == 1


def test_a_device_without_routing_calls_says_a_failed_capture_may_leave_it(privateuse1, caplog):
    """Note [Pool routing after a failed capture]: nothing can stop the routing there."""
    backend = accelerator_backend_class(PRIVATEUSE1)(0)
    pool = backend.new_pool()
    privateuse1.fail = "begin"
    with caplog.at_level(logging.WARNING, logger="inductor_xpugraph"):
        with pytest.raises(RuntimeError, match="scripted: the queue could not start recording"):
            capture(backend, privateuse1, pool)
    assert "no call to stop its allocator routing" in caplog.text
    assert pool.handle in privateuse1.routing  # what the warning says may happen


# -- graph adapter -----------------------------------------------------------------------------


def test_the_pool_is_set_on_the_graph_before_its_capture_begins(xpu):
    graph = _PoolGivenAtCaptureBegin(torch.accelerator.Graph())
    graph.capture_begin(pool=("handle", 42))
    assert graph.graph.graph_pool == ("handle", 42)
    assert graph.pool() == ("handle", 42)


def test_a_generator_input_is_refused_before_capture_where_the_graph_cannot_register_it(xpu):
    """Decided before any capture begins: the callable runs un-graphed, the tree keeps its
    graphs (finding: it used to fail inside the capture and drop the whole tree)."""
    backend = accelerator_backend_class("xpu")(0)
    assert backend.graphs_register_generators is False
    generator = torch.Generator(device="cpu")
    backend.device_type = "cpu"  # the generator's device here
    assert backend.reason_not_to_capture([generator, 3]) == GENERATOR_NOT_REGISTERED
    assert backend.reason_not_to_capture([3]) is None
    graph = _PoolGivenAtCaptureBegin(torch.accelerator.Graph())
    with pytest.raises(RuntimeError, match="cannot register"):
        graph.register_generator_state(torch.Generator())


def test_checkpoints_follow_the_devices_bindings(xpu, monkeypatch):
    backend = accelerator_backend_class("xpu")(0)
    for name in DEVICES["xpu"].checkpoint_bindings:
        monkeypatch.delattr(torch._C, name, raising=False)
    assert isinstance(memory_strategy(accelerator_backend_class("xpu")(0)), OwnedOutputs)
    for name in DEVICES["xpu"].checkpoint_bindings:
        monkeypatch.setattr(torch._C, name, lambda *args: None, raising=False)
    assert isinstance(memory_strategy(accelerator_backend_class("xpu")(0)), CheckpointedPool)
    assert backend.device_type == "xpu"


def test_xpu_gives_cached_memory_back_after_a_pool_is_dropped_whichever_graph_class():
    assert XpuGraphBackend.empty_cache_after_pool_drop is True
    assert accelerator_backend_class("xpu").empty_cache_after_pool_drop is True
    assert accelerator_backend_class(PRIVATEUSE1).empty_cache_after_pool_drop is False


# -- selection ---------------------------------------------------------------------------------


def test_xpu_uses_xpugraph_by_default():
    assert config.xpu_graph_api == "xpu"
    assert backend_class("xpu") is XpuGraphBackend


def test_xpu_uses_the_accelerator_graph_when_configured():
    with config.patch(xpu_graph_api="accelerator"):
        chosen = backend_class("xpu")
    assert issubclass(chosen, AcceleratorGraphBackend)
    assert chosen.device_type == "xpu"


def test_the_accelerator_graph_on_a_torch_without_one_is_a_clear_error(monkeypatch):
    monkeypatch.delattr(torch.accelerator, "Graph", raising=False)
    with config.patch(xpu_graph_api="accelerator"):
        with pytest.raises(RuntimeError, match="xpu_graph_api='accelerator' needs"):
            backend_class("xpu")


def test_cuda_keeps_cudagraph_whatever_the_setting():
    with config.patch(xpu_graph_api="accelerator"):
        assert backend_class("cuda") is CudaGraphBackend


def test_the_privateuse1_backend_gets_the_accelerator_graph(monkeypatch):
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "npu")
    chosen = backend_class("npu")
    assert issubclass(chosen, AcceleratorGraphBackend)
    assert chosen.device_type == "npu"
    assert backend_class("npu") is chosen  # one class per device type


def test_the_privateuse1_backend_on_a_torch_without_the_accelerator_graph(monkeypatch):
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "npu")
    monkeypatch.delattr(torch.accelerator, "Graph", raising=False)
    with pytest.raises(ValueError, match="no graph backend for device type 'npu'"):
        backend_class("npu")


def test_another_device_type_has_no_backend():
    with pytest.raises(ValueError, match="no graph backend for device type 'mps'"):
        backend_class("mps")


def test_a_bad_value_names_the_setting():
    with pytest.raises(ValueError, match="config.xpu_graph_api must be one of 'xpu', 'acc"):
        config.xpu_graph_api = "device"
    with pytest.raises(ValueError, match="xpu_graph_api"):
        with config.patch(xpu_graph_api="sycl"):
            pass
    assert config.xpu_graph_api == "xpu"


def test_the_setting_from_the_environment(monkeypatch):
    variable = "INDUCTOR_XPUGRAPH_XPU_GRAPH_API"
    monkeypatch.setenv(variable, " Accelerator ")
    assert from_environment("xpu_graph_api", variable, "xpu") == "accelerator"
    monkeypatch.setenv(variable, "cuda")  # warned about and ignored: the default is kept
    with pytest.warns(UserWarning, match="INDUCTOR_XPUGRAPH_XPU_GRAPH_API='cuda'"):
        assert from_environment("xpu_graph_api", variable, "xpu") == "xpu"
