"""The stream protocol of the backend shared by xpu and cuda (``DeviceGraphBackend``), on a
scripted device module: which stream each piece of work runs on, what waits for what, and
what a failed capture leaves behind. On the CPU this code runs nowhere else (the emulator
has its own backend); on cuda the same behaviours are checked end to end by ``-m gpu``."""

from __future__ import annotations

import contextlib
import itertools
import weakref

import pytest
from support.scripted_devices import ScriptedDeviceBase, ScriptedStream

from inductor_xpugraph.trees.backends import capture_streams, device_graphs
from inductor_xpugraph.trees.backends.device_graphs import DeviceGraphBackend

_module_ids = itertools.count()


class ScriptedGraph:
    """torch's ``CUDAGraph`` (and ``XPUGraph``) in the order its C++ does things, failures
    included. The default generator enters capture mode first thing in ``capture_begin`` and
    leaves it only when ``capture_end`` gets past ending the capture; destroying the graph
    does not take it out."""

    def __init__(self, device: ScriptedDevice) -> None:
        self.device = device
        self.pool = None
        self.capture_ended = False
        self.fail = device.fail  # this graph's capture fails; the next one's does not
        if not device.keep_failing:
            device.fail = None

    def register_generator_state(self, generator) -> None:
        self.device.log.append(f"graph registers {generator}")

    def capture_begin(self, pool=None, capture_error_mode=None) -> None:
        self.device.generator_capturing = True  # register_graph + capture_prologue
        pool = object() if pool is None else pool  # a private pool of its own
        self.device.begin_allocate_to_pool(pool)
        self.pool = pool
        if self.fail == "begin":  # cudaStreamBeginCapture / SYCL begin_recording failed
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        self.device.capturing_on = self.device.current
        self.device.log.append(f"capture begins on {self.device.current.name}")

    def capture_end(self) -> None:
        if self.device.order == "xpu" and self.fail == "end":
            # XPUGraph: end_recording raised; the queue may still record, nothing below ran.
            self.device.log.append("recording fails to end")
            raise RuntimeError("end_recording: failed due to a previous error during recording")
        self.device.capturing_on = None
        self.device.log.append("capture ends")
        if self.fail == "end":  # cudaStreamEndCapture failed: nothing below ran
            raise RuntimeError("operation failed due to a previous error during capture")
        self.device.end_allocate_to_pool(0, self.pool)
        self.capture_ended = True
        self.device.generator_capturing = False  # capture_epilogue
        if self.fail == "instantiate":  # after the capture ended
            raise RuntimeError("CUDA error: out of memory")

    def __del__(self) -> None:  # CUDAGraph::reset / ~XPUGraph
        if self.capture_ended:
            self.device.release_pool(0, self.pool)
        elif self.device.order == "xpu" and self.device.capturing_on is not None:
            # Destroying the last handle of a SYCL graph returns the queue recording into it
            # to executing (measured with Intel's SYCL runtime on the CPU).
            self.device.log.append("the failed graph is destroyed: its queue executes again")
            self.device.capturing_on = None


class ScriptedDevice(ScriptedDeviceBase):
    """The parts of ``torch.cuda``/``torch.xpu`` the backend uses, writing a log."""

    def __init__(self, order: str = "cuda") -> None:
        super().__init__()
        self.__name__ = f"scripted_device_{next(_module_ids)}"  # streams are cached per name
        # Whose order of operations a failed capture_end follows: "cuda" or "xpu".
        self.order = order
        self.default_generators = [self.generator]
        self.current = ScriptedStream(self, "caller")
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

    def empty_cache(self) -> None:
        self.log.append("cache emptied")

    def graph_pool_handle(self) -> object:
        return object()

    def is_current_stream_capturing(self) -> bool:
        return self.capturing_on is self.current

    def random_op(self) -> None:
        """What ``CUDAGeneratorState::increase`` checks before a random op runs."""
        if self.generator_capturing and not self.is_current_stream_capturing():
            raise RuntimeError("Offset increment outside graph capture encountered unexpectedly.")


@pytest.fixture(params=["cuda", "xpu"])
def device(request, monkeypatch):
    # Which devices cannot record is process-wide: each test starts with none.
    monkeypatch.setattr(device_graphs, "_DEVICES_THAT_CANNOT_RECORD", {})
    return ScriptedDevice(order=request.param)


@pytest.fixture
def backend(device):
    class ScriptedBackend(DeviceGraphBackend):
        device_type = "scripted"
        device_module = device
        end_allocate_to_pool = device.end_allocate_to_pool
        release_pool = device.release_pool
        graphs: list[weakref.ref] = []

        @staticmethod
        def begin_allocate_to_pool(device_index, pool):
            device.log.append("allocations go to the pool")
            device.begin_allocate_to_pool(pool)

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


@pytest.mark.parametrize("raises", [False, True], ids=["returns", "raises"])
def test_a_warmup_in_the_pool_routes_only_its_own_run_there(backend, device, raises):
    pool = backend.new_pool()
    holds = dict(device.holds)
    device.log.clear()

    def fn(args):
        device.log.append(f"warmup runs on {device.current.name}, routed: {bool(device.routing)}")
        if raises:
            raise ValueError("the warmup's own error")
        return ["warmup output"]

    if raises:
        with pytest.raises(ValueError, match="own error"):
            backend.warmup_in_pool(fn, [], pool)
    else:
        assert backend.warmup_in_pool(fn, [], pool) == ["warmup output"]
    assert device.log == [
        "capture waits for caller",
        "allocations go to the pool",
        "warmup runs on capture, routed: True",
        "caller waits for capture",
    ]
    assert device.routing == [] and device.holds == holds  # routing and hold given back


def test_a_reservation_allocates_on_the_capture_stream_into_the_pool(backend, device, monkeypatch):
    """``initial_pool_allocation_gb``: routed as a warmup's allocations are, then given back."""
    pool = backend.new_pool()
    holds = dict(device.holds)
    allocated = []

    def empty(nbytes, **kwargs):
        allocated.append((nbytes, device.current.name, bool(device.routing)))

    monkeypatch.setattr(device_graphs.torch, "empty", empty)
    assert backend.reserve_in_pool(pool, 2**20)
    assert allocated == [(2**20, "capture", True)]
    assert device.routing == [] and device.holds == holds


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
        "cache emptied",  # (test_a_capture_first_gives_the_device_what_its_allocator_caches)
        "capture waits for caller",
        "capture begins on capture",
        "captured code runs on capture",
        "capture ends",
        "caller waits for capture",
    ]


def test_a_pool_keeper_is_captured_between_two_waits(backend, device):
    """Note [The capture stream waits for the caller first]: the keeper's ``capture_begin``
    may allocate on the capture stream (torch's generator seed and offset), where a block
    the caller's stream still reads may have just been freed."""
    backend.new_pool()
    assert device.log == [
        "capture waits for caller",
        "capture begins on capture",
        "capture ends",
        "caller waits for capture",
    ]
    assert device.current.name == "caller"


@pytest.mark.parametrize(
    "failure, error",
    [("begin", "not permitted"), ("end", "previous error"), ("instantiate", "out of memory")],
)
def test_random_ops_work_after_a_failed_capture(backend, device, failure, error):
    """On the H100 (torch 2.11), a capture another thread broke left the generator in capture
    mode, and every later random op in the process raised."""
    pool = backend.new_pool()
    device.fail = failure
    with pytest.raises(RuntimeError, match=error):
        backend.capture(run_on_current_stream(device, "code"), [], pool, lambda args: None)
    device.random_op()
    assert device.current.name == "caller" and device.capturing_on is None


@pytest.mark.parametrize("failure", ["begin", "end"])
def test_a_device_that_cannot_record_is_given_up_with_its_generator_usable(
    backend, device, failure, caplog
):
    """When even the empty repair capture fails (a driver without graph support), the device
    is marked as unable to record, said once, and the default generator, left in capture
    mode by the failed ``capture_begin``, gets a state outside it: random ops work."""
    pool = backend.new_pool()
    device.fail, device.keep_failing = failure, True
    with pytest.raises(RuntimeError):
        backend.capture(run_on_current_stream(device, "code"), [], pool, lambda args: None)
    assert backend.cannot_record is not None
    assert caplog.text.count("cannot record graphs in this process") == 1
    device.random_op()
    assert device.routing == [] and device.holds[pool.handle] == 1


def test_a_pool_that_cannot_be_made_gives_the_device_up(backend, device):
    """The pool's keeper is the first capture a tree makes: on a device that cannot record,
    it fails first, and leaves no routing, no poisoned generator."""
    device.fail, device.keep_failing = "begin", True
    with pytest.raises(RuntimeError, match="not permitted"):
        backend.new_pool()
    assert backend.cannot_record.startswith("RuntimeError: CUDA error: operation not permitted")
    assert device.routing == []
    device.random_op()


def test_a_capture_left_recording_ends_when_its_graph_is_destroyed(backend, device):
    """XPU's ``capture_end`` raises from ``end_recording``, which leaves the queue recording:
    the recovery destroys the failed graph, which ends the recording, before anything waits
    on the capture stream, so the caller's stream never joins the recording; later captures
    use the same, executing, stream."""
    pool = backend.new_pool()
    stream = backend.capture_stream
    device.fail = "end"
    with pytest.raises(RuntimeError):
        backend.capture(run_on_current_stream(device, "code"), [], pool, lambda args: None)
    if device.order == "xpu":
        destroyed = device.log.index("the failed graph is destroyed: its queue executes again")
        assert (
            "caller waits for capture"
            not in device.log[device.log.index("recording fails to end") : destroyed]
        )
    assert backend.capture_stream is stream and device.capturing_on is None
    graph, outputs = backend.capture(run_on_current_stream(device, "next"), [], pool, lambda a: 0)
    assert outputs == ["next output"] and backend.cannot_record is None
    device.random_op()


def test_a_generator_input_is_registered_with_its_graph(backend, device):
    """A ``torch.Generator`` the code draws from gets fresh numbers at each replay only when
    its graph knows it (upstream's trees register theirs too)."""
    import torch

    generator = torch.Generator()
    backend.device_type = "cpu"  # the generator's device
    pool = backend.new_pool()
    device.log.clear()
    backend.capture(run_on_current_stream(device, "code"), [generator, 3], pool, lambda a: 0)
    assert device.log[0] == f"graph registers {generator}"
    assert device.log.index("capture begins on capture") > 0


@pytest.mark.parametrize(
    "failure, error",
    [("begin", "not permitted"), ("end", "previous error"), ("instantiate", "out of memory")],
)
def test_a_failed_capture_leaves_the_pool_held_by_its_keeper_only(backend, device, failure, error):
    """Whatever step of torch's capture failed, the allocator routes nothing into the pool
    afterwards and the pool is held exactly once, by the graph that keeps it alive: never
    more (it could not be freed) and never less (it would be freed under live graphs)."""
    pool = backend.new_pool()
    device.fail = failure
    with pytest.raises(RuntimeError, match=error):  # torch's own error, nothing of ours
        backend.capture(run_on_current_stream(device, "code"), [], pool, lambda args: None)
    assert device.routing == [] and device.holds[pool.handle] == 1
    graph, _ = backend.capture(run_on_current_stream(device, "code"), [], pool, lambda a: None)
    assert device.routing == [] and device.holds[pool.handle] == 2


def test_a_capture_whose_code_raised_is_ended_and_not_kept_alive_by_its_error(backend, device):
    pool = backend.new_pool()

    def fails(args):
        raise ValueError("this op cannot be captured")

    with pytest.raises(ValueError, match="cannot be captured") as kept:
        backend.capture(fails, [], pool, lambda args: None)
    assert kept.value.__traceback__ is not None
    assert device.log[-2:] == ["capture ends", "caller waits for capture"]
    assert device.capturing_on is None and backend.graphs[-1]() is None
    assert device.routing == [] and device.holds[pool.handle] == 1


def test_a_capture_broken_by_its_own_code_ends_cleanly_with_the_codes_error(backend, device):
    """The captured code raised and broke the capture: ending it fails too, and the caller
    sees the code's error, with the pool's routing and holds undone and the generator out of
    capture mode."""
    pool = backend.new_pool()
    device.fail = "end"

    def synchronizes(args):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    with pytest.raises(RuntimeError, match="not permitted"):
        backend.capture(synchronizes, [], pool, lambda args: None)
    assert device.routing == [] and device.holds[pool.handle] == 1
    device.random_op()


def test_a_dropped_pool_empties_the_cache_where_the_backend_asks_and_no_capture_runs(
    backend, device
):
    """xpu's allocator (torch 2.11-2.13) frees pools no graph holds inside its out-of-memory
    retry, even during a capture: such a backend empties its cache after dropping a pool,
    but never while one of our captures is under way."""
    backend.release_dropped_pools()
    assert "cache emptied" not in device.log  # the default: cuda leaves its cache alone
    backend.empty_cache_after_pool_drop = True
    backend.release_dropped_pools()
    assert device.log[-1] == "cache emptied"
    device.log.clear()

    def drops_a_pool(args):
        backend.release_dropped_pools()
        return []

    pool = backend.new_pool()
    device.log.clear()
    backend.capture(drops_a_pool, [], pool, lambda args: None)
    begins, ends = device.log.index("capture begins on capture"), device.log.index("capture ends")
    during_the_capture = device.log[begins:ends]
    assert "cache emptied" not in during_the_capture


def test_a_capture_first_gives_the_device_what_its_allocator_caches(backend, device):
    """As ``torch.cuda.graph`` does: memory a compilation left cached (Inductor's benchmarks)
    must not stay reserved beside the pool the graph grows."""
    pool = backend.new_pool()
    device.log.clear()
    backend.capture(run_on_current_stream(device, "captured code"), [], pool, lambda args: None)
    assert device.log.index("cache emptied") < device.log.index("capture begins on capture")


def test_the_cache_is_not_emptied_while_another_thread_warms_up_in_the_pool(backend, device):
    """Routing allocations into a pool counts as a capture to the caching allocator, which
    refuses to empty its cache during one."""
    pool = backend.new_pool()
    device.log.clear()

    def warmup_while_a_capture_starts(args):
        backend.release_cached_memory()  # what a capture starting on another thread does
        return []

    backend.warmup_in_pool(warmup_while_a_capture_starts, [], pool)
    assert "cache emptied" not in device.log
    backend.release_cached_memory()
    assert device.log[-1] == "cache emptied"


def test_a_cache_that_refuses_to_empty_is_left_as_it_is(backend, device, monkeypatch):
    """A capture we do not know of (the user's own) makes the allocator refuse; the capture
    goes on with the memory still cached."""

    def refuses():
        raise RuntimeError("INTERNAL ASSERT FAILED: captures_underway.empty()")

    monkeypatch.setattr(device, "empty_cache", refuses)
    pool = backend.new_pool()
    graph, outputs = backend.capture(
        run_on_current_stream(device, "captured code"), [], pool, lambda args: None
    )
    assert outputs == ["captured code output"]


def test_is_capturing_asks_of_the_backends_device_not_the_current_one():
    """With two devices, the caller's current device may be another one than the tree's:
    whether a capture is under way is asked of the tree's device."""

    class TwoDevices:
        current = 1
        capturing = {0: True, 1: False}

        def device_count(self):
            return 2

        def current_device(self):
            return self.current

        def is_current_stream_capturing(self):
            return self.capturing[self.current]

        @contextlib.contextmanager
        def device(self, index):
            before, self.current = self.current, index
            try:
                yield
            finally:
                self.current = before

    module = TwoDevices()
    assert capture_streams.is_capturing_on(module, 0)() is True
    assert capture_streams.is_capturing_on(module, 1)() is False
    assert module.current == 1
