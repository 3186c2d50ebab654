"""The stream protocol of the backend shared by xpu and cuda (``DeviceGraphBackend``), on a
scripted device module: which stream each piece of work runs on, what waits for what, and
what a failed capture leaves behind. On the CPU this code runs nowhere else (the emulator
has its own backend); on cuda the same behaviours are checked end to end by ``-m gpu``."""

from __future__ import annotations

import contextlib
import itertools
import weakref

import pytest

from inductor_xpugraph.trees.backends.device_graphs import DeviceGraphBackend

_module_ids = itertools.count()


class ScriptedStream:
    def __init__(self, device: ScriptedDevice, name: str) -> None:
        self.device = device
        self.name = name

    def wait_stream(self, other: ScriptedStream) -> None:
        self.device.log.append(f"{self.name} waits for {other.name}")

    def synchronize(self) -> None:
        self.device.log.append(f"host waits for {self.name}")


class ScriptedGraph:
    def __init__(self, device: ScriptedDevice) -> None:
        self.device = device

    def capture_begin(self, pool) -> None:
        self.device.capturing_on = self.device.current
        self.device.log.append(f"capture begins on {self.device.current.name}")

    def capture_end(self) -> None:
        self.device.capturing_on = None
        self.device.log.append("capture ends")
        if self.device.capture_end_fails:
            raise RuntimeError("operation failed due to a previous error during capture")


class ScriptedDevice:
    """The parts of ``torch.cuda``/``torch.xpu`` the backend uses, writing a log."""

    def __init__(self) -> None:
        self.__name__ = f"scripted_device_{next(_module_ids)}"  # streams are cached per name
        self.log: list[str] = []
        self.current = ScriptedStream(self, "caller")
        self.capturing_on: ScriptedStream | None = None
        self.capture_end_fails = False
        self.streams = 0

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def Stream(self, device: int) -> ScriptedStream:  # noqa: N802 - torch's name
        self.streams += 1
        return ScriptedStream(self, "capture" if self.streams == 1 else f"stream{self.streams}")

    def current_stream(self, device_index: int) -> ScriptedStream:
        return self.current

    @contextlib.contextmanager
    def stream(self, stream: ScriptedStream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    @contextlib.contextmanager
    def device(self, device_index: int):
        yield

    def synchronize(self, device_index: int) -> None:
        raise AssertionError("the device was synchronized: another thread's capture breaks")

    def graph_pool_handle(self) -> object:
        return object()

    def is_current_stream_capturing(self) -> bool:
        return self.capturing_on is self.current


@pytest.fixture
def device():
    return ScriptedDevice()


@pytest.fixture
def backend(device):
    class ScriptedBackend(DeviceGraphBackend):
        device_type = "scripted"
        device_module = device
        graphs: list[weakref.ref] = []

        def new_graph(self):
            graph = ScriptedGraph(device)
            self.graphs.append(weakref.ref(graph))
            return graph

    return ScriptedBackend(0)


def run_on_current_stream(device, name):
    def fn(args):
        device.log.append(f"{name} runs on {device.current.name}")
        return [f"{name} output"]

    return fn


def test_a_warmup_runs_on_the_capture_stream_between_two_waits(backend, device):
    outputs = backend.warmup(run_on_current_stream(device, "warmup"), [])
    assert outputs == ["warmup output"]
    assert device.log == [
        "capture waits for caller",
        "warmup runs on capture",
        "caller waits for capture",
    ]
    assert device.current.name == "caller"


def test_a_capture_waits_for_its_own_streams_and_never_for_the_device(backend, device):
    pool = backend.new_pool()
    device.log.clear()
    graph, outputs = backend.capture(
        run_on_current_stream(device, "captured code"), [], pool, lambda args: None
    )
    assert outputs == ["captured code output"]
    assert device.log == [
        "host waits for caller",
        "host waits for capture",
        "capture waits for caller",
        "capture begins on capture",
        "captured code runs on capture",
        "capture ends",
        "caller waits for capture",
    ]


def test_a_capture_whose_end_failed_is_not_kept_alive_by_its_error(backend, device):
    pool = backend.new_pool()
    device.capture_end_fails = True
    with pytest.raises(RuntimeError, match="previous error during capture") as kept:
        backend.capture(run_on_current_stream(device, "code"), [], pool, lambda args: None)
    assert kept.value.__traceback__ is not None  # the caller still holds the error...
    assert backend.graphs[-1]() is None  # ...but not the graph: torch frees its state then
    assert device.current.name == "caller" and device.capturing_on is None


def test_a_capture_whose_code_raised_is_ended_and_not_kept_alive_by_its_error(backend, device):
    pool = backend.new_pool()

    def fails(args):
        raise ValueError("this op cannot be captured")

    with pytest.raises(ValueError, match="cannot be captured") as kept:
        backend.capture(fails, [], pool, lambda args: None)
    assert kept.value.__traceback__ is not None
    assert device.log[-1] == "capture ends" and device.capturing_on is None
    assert backend.graphs[-1]() is None
