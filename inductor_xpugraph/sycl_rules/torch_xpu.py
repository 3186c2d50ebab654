"""``torch.xpu`` as a graph runtime sees it, over the SYCL model of ``sycl``, on the CPU.

``StandInXpu`` has the names ``DeviceGraphBackend`` uses of a device module (``Stream``,
``current_stream``, ``stream``, ``synchronize``, ``empty_cache``, ``graph_pool_handle``,
``XPUGraph``, the allocator's pool calls, ``default_generators``) and does what torch's XPU
runtime does with them, in the same order, read from PyTorch's sources (c10/xpu/XPUStream.cpp,
aten/src/ATen/xpu/XPUGraph.cpp, the XPU caching allocator; torch 2.11-2.15):

- Streams are SYCL queues from fixed pools: three priorities, 32 in-order queues each, handed
  out round-robin (``kStreamsPerPool``); a thread's current stream starts as the last queue of
  the normal pool. A "new" stream is a queue someone had before, whatever state it is in.
- ``synchronize`` waits on every queue of the pools, and ``empty_cache`` does so before it
  frees pools no graph holds: either throws while any queue records.
- ``Stream.wait_stream``/``Event.record``/``Event.wait`` are barriers: recording an event on a
  recording queue makes a graph node, and a queue that waits for it joins the recording.
- ``XPUGraph.replay`` first prepares each registered generator state (``replay_prologue``):
  it refuses while the replaying thread's current stream records ("Cannot prepare for replay
  during capturing stage"), and a graph that drew random numbers moves the state's offset,
  which asserts while another capture holds the state in capture mode ("Offset increment
  outside graph capture"): a replay in one thread during a capture in another fails so.
- ``XPUGraph.capture_begin``: the default generator enters capture mode; the device allocator,
  and from torch 2.13 the host allocator, route into the pool with filters that refer to the
  graph; then recording begins (which throws on a queue that records already).
  ``capture_end`` ends the recording first, and only then the routing and the generator's
  capture mode: when ending the recording fails, all of it stays. A successful ``capture_end``
  keeps only the executable graph, which holds the SYCL graph until ``reset``. Destroying the
  graph destroys its SYCL graph, and a queue that still recorded into it executes again.
- The SYCL graph records through command buffers or natively (``StandInXpu.recording``, as
  the release chooses on the device: ``trees.backends.xpu_recording``).
- torch 2.13's allocator latches a pool id whose holds all went: a capture into it asserts
  (``Release.latches_pool_ids``).

What runs: the work is Inductor's CPU code. Operators reach a queue through
``submission.SubmitToCurrentQueue`` (the stand-in's dispatch mode); a capture records the
callable the backend gives it (``XPUGraph.record_callable``) and replays it as the CPU emulator
does (``trees.backends.cpu_emulation.EmulatedGraph``), because CPU kernels cannot be recorded.
Failures the runtime only shows on hardware (a Level Zero error ending a recording) are
injected: ``fail_next``.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ..trees.backends.xpu_recording import NATIVE
from . import sycl
from .releases import Release, check_recording, host_waiting_ops, refused_ops

STREAMS_PER_POOL = 32  # c10/xpu/XPUStream.cpp, kStreamsPerPool
PRIORITIES = ("low", "normal", "high")  # priority 1, 0, -1 (Note [XPU Stream priorities])
NOT_ROUTING = "endAllocateToPool: not currently recording to mempool_id"
OFFSET_OUTSIDE_CAPTURE = "Offset increment outside graph capture encountered unexpectedly."
CAPTURE_ON_OTHER_STREAM = "Capture must end on the same stream it began on."
REPLAY_WITHOUT_CAPTURE = "Called XPUGraph::replay without a preceding successful capture."
# XPUGeneratorState::replay_prologue's assertNotCapturing (aten/src/ATen/xpu/XPUGeneratorImpl.cpp,
# XPUGraphsUtils.h), when the replaying thread's current stream records; the status is printed
# as torch prints it, which was not read ("Recording" here).
REPLAY_DURING_CAPTURE = (
    "Cannot prepare for replay during capturing stage. during XPU graph capture. If you need "
    "this call to be captured, please file an issue. Current xpuStreamCaptureStatus: Recording"
)
POOL_ID_LATCHED = (
    "it->second->use_count > 0 INTERNAL ASSERT FAILED at "
    '"aten/src/ATen/xpu/XPUCachingAllocator.cpp" (create_or_incref_pool), please report a bug '
    "to PyTorch."
)
DANGLING_HOST_FILTER = (
    "the host caching allocator still routes into the pool of a destroyed XPUGraph: its filter "
    "reads the graph's freed memory at every pinned allocation while a queue records (torch "
    "would read freed memory here; the stand-in raises)"
)


class Stream:
    """A ``torch.xpu.Stream``: a handle of one queue of the pools."""

    def __init__(self, device: StandInXpu, queue: sycl.Queue, priority: int) -> None:
        self.device = device
        self.queue = queue
        self.priority = priority
        self.device_index = 0

    def __repr__(self) -> str:
        return f"<stand-in xpu stream {self.queue.name} {self.queue.state}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.queue is self.queue

    def __hash__(self) -> int:
        return id(self.queue)

    def record_event(self) -> Event:
        event = Event()
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        event.wait(self)

    def wait_stream(self, other: Stream) -> None:
        self.wait_event(other.record_event())

    def synchronize(self) -> None:
        self.queue.wait()

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return self.queue.state == "recording"


class Event:
    """A ``torch.xpu.Event``: the barrier last recorded on a stream (XPUEvent.h)."""

    def __init__(self) -> None:
        self.sycl_event: sycl.Event | None = None

    def record(self, stream: Stream) -> None:
        self.sycl_event = stream.queue.submit_barrier()

    def wait(self, stream: Stream) -> None:
        if self.sycl_event is not None:
            stream.queue.submit_barrier([self.sycl_event])

    def synchronize(self) -> None:
        if self.sycl_event is not None:
            self.sycl_event.wait()

    def query(self) -> bool:
        return self.sycl_event is None or self.sycl_event.complete


class GeneratorState:
    """A generator state, the thing that enters capture mode (XPUGeneratorImpl)."""

    def __init__(self) -> None:
        self.capturing = False
        #: The offset the random ops of the capture under way drew (``offset_intragraph_``).
        self.offset_intragraph = 0


class Generator:
    """The device's default generator: its state enters capture mode at ``capture_begin``."""

    def __init__(self) -> None:
        self.state = GeneratorState()

    def clone_state(self) -> GeneratorState:
        return GeneratorState()

    def graphsafe_set_state(self, state: GeneratorState) -> None:
        self.state = state


class StandInXpu:
    """One xpu device of torch's XPU runtime under SYCL Graph's rules (module docstring)."""

    def __init__(
        self, release: Release, recording: str | None = None, *, data_center_max: bool = False
    ) -> None:
        check_recording(recording, release)
        self.release = release
        #: "command-buffer" or "native": how XPUGraph records here (by default as torch
        #: chooses for the release on such a device, in this process's environment).
        self.recording = recording or release.recording_mode(data_center_max=data_center_max)
        #: The CPU operators standing for the xpu ones SYCL Graph refuses here, with why.
        self.refused_ops = refused_ops(release, self.recording)
        #: The operators whose kernels wait on the host (a copy to the host, then a wait).
        self.host_waits = host_waiting_ops(release, self.recording)
        self.__name__ = (
            f"sycl_rules.StandInXpu[{release.version},{self.recording}]#{next(_device_ids)}"
        )
        self.pools: dict[str, list[sycl.Queue]] = {
            priority: [sycl.Queue(f"{priority}{i}") for i in range(STREAMS_PER_POOL)]
            for priority in PRIORITIES
        }
        self._next_in_pool = dict.fromkeys(PRIORITIES, 0)
        self._current = threading.local()
        self.default_generators = [Generator()]
        # The caching allocators' routing into pools, and each pool's holds.
        self.routing: list[tuple[Any, Callable[[], bool]]] = []
        self.host_routing: list[tuple[Any, weakref.ref]] = []
        self.holds: dict[Any, int] = {}
        # Pools whose holds all went, kept by the allocator for good (``latches_pool_ids``).
        self.parked_pools: set[Any] = set()
        self._pool_ids = itertools.count(1)
        self._failures: dict[str, str] = {}
        # Recordings a capture is running its callable into, between ``capture_begin`` and
        # ``capture_end``: work submitted there runs now, as the emulator's capture does.
        self.live_recordings: set[Any] = set()
        # Operators recorded where no capture ran: work that never runs.
        self.dropped_work = 0

    # -- streams --------------------------------------------------------------------------

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def Stream(self, device: int = 0, priority: int = 0) -> Stream:  # noqa: N802
        """A stream of the pool of ``priority``, round-robin (getStreamFromPool)."""
        name = PRIORITIES[max(min(-priority + 1, 2), 0)]
        index = self._next_in_pool[name]
        self._next_in_pool[name] = (index + 1) % STREAMS_PER_POOL
        return Stream(self, self.pools[name][index], priority)

    def current_stream(self, device: int | None = None) -> Stream:
        stream = getattr(self._current, "stream", None)
        if stream is None:  # initXPUStreamsOnce: the last queue of the normal pool
            stream = self._current.stream = Stream(self, self.pools["normal"][-1], 0)
        return stream

    def set_stream(self, stream: Stream) -> None:
        self._current.stream = stream

    @contextlib.contextmanager
    def stream(self, stream: Stream) -> Iterator[None]:
        before = self.current_stream()
        self.set_stream(stream)
        try:
            yield
        finally:
            self.set_stream(before)

    @contextlib.contextmanager
    def device(self, device_index: int) -> Iterator[None]:
        yield

    def is_current_stream_capturing(self) -> bool:
        return self.current_stream().queue.state == "recording"

    def queues(self) -> Iterator[sycl.Queue]:
        for pool in self.pools.values():
            yield from pool

    def synchronize(self, device: int | None = None) -> None:
        """syncStreamsOnDevice: every queue of the pools waits, in order."""
        for queue in self.queues():
            queue.wait()

    # -- the caching allocators -----------------------------------------------------------

    def graph_pool_handle(self) -> tuple[int, int]:
        return (0, next(self._pool_ids))

    def begin_allocate_to_pool(self, device: int, pool: Any, accepts=None) -> None:
        """``beginAllocateToPool`` (and ``_xpu_beginAllocateCurrentThreadToPool``): route the
        allocations ``accepts`` into ``pool``, with a hold on it (``create_or_incref_pool``,
        which asserts on a pool whose holds all went, where the release never forgets one:
        ``Release.latches_pool_ids``)."""
        if pool in self.parked_pools:
            raise RuntimeError(POOL_ID_LATCHED)
        self.routing.append((pool, accepts or (lambda: True)))
        self.holds[pool] = self.holds.get(pool, 0) + 1

    def begin_allocate_current_thread_to_pool(self, device: int, pool: Any) -> None:
        thread = threading.get_ident()
        self.begin_allocate_to_pool(device, pool, lambda: threading.get_ident() == thread)

    def end_allocate_to_pool(self, device: int, pool: Any) -> None:
        for i, (routed, _) in enumerate(self.routing):
            if routed == pool:
                del self.routing[i]
                return
        raise RuntimeError(NOT_ROUTING)

    def release_pool(self, device: int, pool: Any) -> None:
        self.holds[pool] = self.holds.get(pool, 0) - 1
        if self.holds[pool] <= 0 and self.release.latches_pool_ids:
            self.parked_pools.add(pool)  # releasePool parks it, and nothing erases it

    def empty_cache(self) -> None:
        """XPU's ``emptyCache``: a device-wide synchronization, then every pool no graph or
        routing holds is freed."""
        self.synchronize()
        for pool in [p for p, holds in self.holds.items() if holds <= 0]:
            del self.holds[pool]

    def check_host_filters(self) -> None:
        """What the host allocator's routing does at a pinned allocation while a queue
        records: evaluate each filter, which reads its graph."""
        if any(graph() is None for _, graph in self.host_routing):
            raise RuntimeError(DANGLING_HOST_FILTER)

    # -- failures only hardware shows -----------------------------------------------------

    def fail_next(self, step: str, message: str) -> None:
        """The next ``step`` fails with ``message``, as a Level Zero error would:
        "end_recording" (the recording goes on, and everything after it in ``capture_end``
        is left undone) or "finalize" (after the recording, the routing and the generator's
        capture mode ended)."""
        self._failures[step] = message

    def _take_failure(self, step: str) -> str | None:
        return self._failures.pop(step, None)

    # -- graphs -----------------------------------------------------------------------------

    def XPUGraph(self, keep_graph: bool = False) -> XPUGraph:  # noqa: N802
        return XPUGraph(self)

    def AcceleratorGraph(self) -> AcceleratorGraph:  # noqa: N802
        return AcceleratorGraph(XPUGraph(self))


class XPUGraph:
    """``torch.xpu.XPUGraph`` (XPUGraph.cpp's order of operations; module docstring)."""

    def __init__(self, device: StandInXpu) -> None:
        self.device = device
        self.capture_stream = device.current_stream()
        self.generator_states: list[GeneratorState] = []
        self.pool_id: Any = None
        self.capture_ended = False
        #: (generator state, the offset the capture drew from it): ``capture_epilogue``'s.
        self.increments: list[tuple[GeneratorState, int]] = []
        self.sycl_graph: sycl.CommandGraph | None = None
        self.executable: sycl.ExecutableGraph | None = None

    def register_generator_state(self, generator: Any) -> None:
        state = getattr(generator, "state", None)
        if isinstance(state, GeneratorState) and state not in self.generator_states:
            self.generator_states.append(state)

    def capture_begin(self, pool: Any = None) -> None:
        device = self.device
        self.register_generator_state(device.default_generators[0])  # gen->register_graph
        for state in self.generator_states:
            state.capturing = True  # capture_prologue
            state.offset_intragraph = 0
        self.capture_stream = stream = device.current_stream()
        self.pool_id = pool if pool is not None else (next(device._pool_ids), 0)
        queue = stream.queue
        device.begin_allocate_to_pool(
            0,
            self.pool_id,
            lambda: queue.state == "recording" and device.current_stream().queue is queue,
        )
        if device.release.routes_host_allocator:
            device.host_routing.append((self.pool_id, weakref.ref(self)))
        device.check_host_filters()  # a queue is about to record
        self.sycl_graph = sycl.CommandGraph(native=device.recording == NATIVE)
        self.sycl_graph.begin_recording(queue)
        device.live_recordings.add(queue.recording_into)

    def record_callable(self, emulated: Any) -> Any:
        """Run the captured callable (``emulated``, an ``EmulatedGraph`` of it) once, as the
        capture's run, and record its replay as a node of the graph: each replay runs it."""
        self.capture_stream.queue.submit(emulated.replay)
        return emulated.capture()

    def capture_end(self) -> None:
        device = self.device
        if self.sycl_graph is not None:  # the captured code has run: none of it runs now
            device.live_recordings.discard(self.sycl_graph.recording_state)
        if device.current_stream() != self.capture_stream:
            raise RuntimeError(CAPTURE_ON_OTHER_STREAM)
        failure = device._take_failure("end_recording")
        if failure is not None:
            raise sycl.SyclError(failure)
        assert self.sycl_graph is not None
        self.sycl_graph.end_recording()
        device.end_allocate_to_pool(0, self.pool_id)
        device.host_routing = [(p, g) for p, g in device.host_routing if g() is not self]
        for state in self.generator_states:
            state.capturing = False  # capture_epilogue
        self.increments = [(state, state.offset_intragraph) for state in self.generator_states]
        self.capture_ended = True
        failure = device._take_failure("finalize")
        if failure is not None:  # instantiate(): after the routing and the generator ended
            raise sycl.SyclError(failure)
        self.executable = self.sycl_graph.finalize()
        self.sycl_graph = None  # instantiate(), then graph_.reset(): the executable graph holds it

    def replay(self) -> None:
        if not self.capture_ended:
            raise RuntimeError(REPLAY_WITHOUT_CAPTURE)
        # replay_prologue, for each registered state
        if self.increments and self.device.is_current_stream_capturing():
            raise RuntimeError(REPLAY_DURING_CAPTURE)
        for state, increment in self.increments:
            if increment and state.capturing:  # increase(), outside a capture
                raise RuntimeError(OFFSET_OUTSIDE_CAPTURE)
        assert self.executable is not None
        self.device.current_stream().queue.submit_graph(self.executable)

    def pool(self) -> Any:
        return self.pool_id

    def reset(self) -> None:
        if self.capture_ended:
            self.device.release_pool(0, self.pool_id)
            self.capture_ended = False
        if self.executable is not None:
            self.executable.release()  # the SYCL graph goes with it
        self.sycl_graph = None
        self.executable = None

    def __del__(self) -> None:
        try:
            self.reset()
        except Exception:  # interpreter shutdown
            pass


class AcceleratorGraph:
    """``torch.accelerator.Graph`` of torch 2.13-2.15 over XPU's implementation: the pool is
    its ``graph_pool``, ``capture_begin`` takes no arguments, and it has no
    ``register_generator_state``."""

    def __init__(self, graph: XPUGraph) -> None:
        self.graph_pool: Any = None
        self._graph = graph
        self.capture_end = graph.capture_end
        self.replay = graph.replay
        self.reset = graph.reset
        self.pool = graph.pool
        self.record_callable = graph.record_callable

    def capture_begin(self) -> None:
        self._graph.capture_begin(pool=self.graph_pool)


_device_ids = itertools.count()
