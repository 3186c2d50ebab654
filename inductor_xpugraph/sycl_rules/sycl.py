"""SYCL queues, events and command graphs, as ``sycl_ext_oneapi_graph`` records them.

A model of the few SYCL objects torch's XPU runtime builds its graphs from, with the rules by
which Intel's SYCL runtime refuses or reroutes work while a queue records. It runs on the
host: a kernel is a Python callable that runs when a queue *executes* it. Each rule says where
it comes from: the ``sycl_ext_oneapi_graph`` specification ("spec"), or what Intel's SYCL
runtime did on the CPU (intel-sycl-rt and intel-opencl-rt 2026.2.0 on the OpenCL CPU device,
``tests/sycl_rules/test_sycl_rules_differential.py`` runs each scenario there and here, and
compares).

- A queue is *executing* or *recording* into one graph (``queue::ext_oneapi_get_state``).
  ``begin_recording`` puts it into recording; ``end_recording`` or the destruction of the
  graph's last handle returns it to executing (work it recorded then never runs).
- Work submitted to a recording queue becomes a node of the graph and does not run; its event
  is the node's and reports complete at once. An executable graph (``finalize``) runs its
  nodes, in order, each time it is submitted.
- A node may depend only on nodes of its own graph. A recording queue that submits with a
  dependency on a node of another graph that still exists throws "Cannot submit to a recording
  queue with a dependency from a different graph."; on any other event (eager, or of a graph
  gone) "Graph nodes cannot depend on events from outside the graph.", whether or not that
  event has completed (both seen on the CPU runtime).
- A graph exists while a handle of it does: a modifiable ``command_graph`` or an executable
  one made from it by ``finalize`` (the executable graph holds the graph; seen on the CPU
  runtime). torch keeps only the executable graph after a capture.
- A queue that executes and submits work depending on a node's event *joins* that node's
  graph: no error, it records into the graph from then on (its work runs only when the graph
  does). This holds for as long as the graph exists, after its recording ended and after
  ``finalize`` too; only once the graph is gone is such a dependency harmless.
- Host waits: ``queue.wait()`` on a recording queue throws; so does ``event.wait()`` on a
  node's event while the node's graph exists (it returns once the graph is gone).

Native recording (``CommandGraph(native=True)``, ``property::graph::enable_native_recording``)
hands the capture to Level Zero, whose rules differ (intel/llvm: the spec's "Limitations of
Native Recording", ``sycl/source/detail/graph/graph_impl.cpp`` and the e2e tests of
``sycl/test-e2e/Graph/RecordReplay/NativeRecording/``; Intel's runtime on the CPU cannot record
natively, so these are read, not measured):

- one queue begins recording a graph (``exception_multi_queue_recording.cpp``); a queue that
  already records cannot begin again;
- an executing queue that submits with a dependency on a node of a graph being recorded joins
  the recording (a fork, ``multi_queue.cpp``), and every fork must be joined back, by a later
  submission of a recording queue that depends on the fork's last node, before the recording
  ends: ``end_recording`` throws otherwise, the recording left as it was
  (``exception_unjoined_fork.cpp``);
- events of the graph are not for use outside its recording: a submission that depends on one
  after the recording ended throws, and so does a recorded node that depends on an event from
  outside the graph (``exception_external_event.cpp``): no queue joins a graph after its
  recording, unlike command buffers;
- host waits on a recording queue or a node's event throw, as with command buffers.

Level Zero's refusals reach SYCL as ``errc::runtime`` with generic texts: the ``NATIVE_*``
texts are this model's words, not the runtime's.

In-order queues only (torch's XPU streams are in-order queues): a submission runs after the
queue's earlier ones, which here means at once.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

Kernel = Callable[[], None]

# SYCL's own texts, as ``sycl::exception::what()`` gives them.
WAIT_ON_RECORDING_QUEUE = "wait cannot be called for a queue which is recording to a command graph."
NODE_DEPENDS_ON_OUTSIDE_EVENT = "Graph nodes cannot depend on events from outside the graph."
BEGIN_ON_RECORDING_QUEUE = (
    "begin_recording cannot be called for a queue which is already in the recording state."
)
BARRIER_ON_OUTSIDE_EVENT = (
    "Event dependency from handler::depends_on does not correspond to a node within the graph"
)
END_FOR_OTHER_GRAPH = "end_recording called for a queue which is recording to a different graph."
DEPENDS_ON_OTHER_GRAPH = (
    "Cannot submit to a recording queue with a dependency from a different graph."
)
WAIT_ON_NODE_EVENT = "wait method cannot be used for an event associated with a command graph."
NO_DEVICE_WAIT = "Device does not support aspect::ext_oneapi_device_wait."
# graph_impl.cpp's texts (intel/llvm), for native recording:
NATIVE_SECOND_QUEUE = "Recording the same graph to multiple queues is not supported in native mode"
NATIVE_QUEUE_CAPTURING = "Queue is already in native graph capture mode"
# Level Zero's refusals under native recording (errc::runtime; the words are this model's):
NATIVE_OUTSIDE_EVENT = (
    "native recording (errc::runtime): a node depends on an event from outside the graph"
)
NATIVE_EVENT_USED_OUTSIDE = (
    "native recording (errc::runtime): an event of the graph is used outside its recording"
)
NATIVE_UNJOINED_FORK = (
    "native recording (errc::runtime): end_recording with a forked queue not joined back"
)
NATIVE_WAIT = "native recording (errc::runtime): a host wait on recorded work"


class SyclError(RuntimeError):
    """A ``sycl::exception``; ``str()`` is its ``what()``."""


class Event:
    """What a submission returns. ``node_of``: the graph whose node it is (None: eager)."""

    __slots__ = ("node_of", "__weakref__")

    def __init__(self, node_of: _GraphState | None = None) -> None:
        self.node_of = node_of

    @property
    def complete(self) -> bool:
        # Eager work runs at submission; a node's event reports complete although nothing
        # ran (seen on the CPU runtime).
        return True

    def wait(self) -> None:
        graph = self.node_of
        if graph is not None and not graph.destroyed:
            raise SyclError(NATIVE_WAIT if graph.native else WAIT_ON_NODE_EVENT)


class _GraphState:
    """A graph itself, which its handles share: modifiable ones (``CommandGraph``) and the
    executable graphs ``finalize`` made of it (``ExecutableGraph``). It is destroyed with
    the last of them."""

    def __init__(self, native: bool = False) -> None:
        self.native = native
        self.nodes: list[Kernel] = []
        self.recording_queues: weakref.WeakSet[Queue] = weakref.WeakSet()
        self.destroyed = False
        self._handles = 0
        # Native recording: each forked queue's last node, until a recording queue depends on it.
        self.unjoined_forks: weakref.WeakKeyDictionary[Queue, Event] = weakref.WeakKeyDictionary()

    def held_by(self, handle: object) -> Callable[[], None]:
        """Count ``handle`` as one of the graph's; returns what lets it go (at most once; also
        run when ``handle`` is collected)."""
        self._handles += 1
        return weakref.finalize(handle, self._let_go)

    def _let_go(self) -> None:
        self._handles -= 1
        if self._handles == 0:
            _destroy(self)

    def stop_recording(self, queue: Queue) -> None:
        queue._recording_into = None
        self.recording_queues.discard(queue)
        self.unjoined_forks.pop(queue, None)

    def note_native_submission(
        self, queue: Queue, depends_on: Sequence[Event], event: Event, forked: bool
    ) -> None:
        """Keep track of forks: a forked queue's last node is unjoined until some recording
        queue submits work that depends on it."""
        for dependency in depends_on:
            for fork, last in list(self.unjoined_forks.items()):
                if last is dependency and fork is not queue:
                    del self.unjoined_forks[fork]
        if forked or queue in self.unjoined_forks:
            self.unjoined_forks[queue] = event


class Queue:
    """An in-order SYCL queue."""

    def __init__(self, name: str = "queue") -> None:
        self.name = name
        self._recording_into: _GraphState | None = None

    def __repr__(self) -> str:
        return f"<sycl queue {self.name} {self.state}>"

    @property
    def state(self) -> str:
        """``queue::ext_oneapi_get_state``: "executing" or "recording"."""
        graph = self._recording_into
        return "recording" if graph is not None else "executing"

    @property
    def recording_into(self) -> _GraphState | None:
        return self._recording_into

    def submit(self, kernel: Kernel, depends_on: Sequence[Event] = ()) -> Event:
        return self._submit(kernel, depends_on, NODE_DEPENDS_ON_OUTSIDE_EVENT)

    def memcpy(self, target: Counter, source: Counter, depends_on: Sequence[Event] = ()) -> Event:
        """``queue::memcpy``: a submission like a kernel's, that copies ``source`` into
        ``target`` when it runs. A blocking copy is this, then a host wait on its event."""

        def copy() -> None:
            target.values[:] = source.values

        return self.submit(copy, depends_on)

    def submit_barrier(self, events: Sequence[Event] = ()) -> Event:
        """``ext_oneapi_submit_barrier``: a node, or nothing run, that waits for ``events``."""
        return self._submit(_nothing, events, BARRIER_ON_OUTSIDE_EVENT)

    def _submit(self, kernel: Kernel, depends_on: Sequence[Event], outside: str) -> Event:
        graph = self._recording_into
        forked = False
        if graph is None:
            joined = _live_graph_of(depends_on)
            if joined is not None:  # depends on a node of a graph that exists: join it
                if joined.native and not joined.recording_queues:
                    raise SyclError(NATIVE_EVENT_USED_OUTSIDE)
                joined.recording_queues.add(self)
                self._recording_into = graph = joined
                forked = joined.native
        if graph is not None:
            for event in depends_on:
                if event.node_of is graph:
                    continue
                if graph.native:
                    raise SyclError(NATIVE_OUTSIDE_EVENT)
                if event.node_of is not None and not event.node_of.destroyed:
                    raise SyclError(DEPENDS_ON_OTHER_GRAPH)  # seen on the CPU
                raise SyclError(outside)  # spec; seen on the CPU
            graph.nodes.append(kernel)
            event = Event(node_of=graph)
            if graph.native:
                graph.note_native_submission(self, depends_on, event, forked)
            return event
        kernel()
        return Event()

    def submit_graph(self, graph: ExecutableGraph) -> Event:
        return self.submit(graph._run)

    def wait(self) -> None:
        graph = self._recording_into
        if graph is not None:
            raise SyclError(NATIVE_WAIT if graph.native else WAIT_ON_RECORDING_QUEUE)


def _nothing() -> None:
    pass


def _live_graph_of(events: Sequence[Event]) -> _GraphState | None:
    for event in events:
        graph = event.node_of
        if graph is not None and not graph.destroyed:
            return graph
    return None


class ExecutableGraph:
    """``command_graph<graph_state::executable>``: the nodes at ``finalize``, run in order at
    each submission. It holds its graph (``_GraphState``) until ``release`` or collection."""

    def __init__(self, state: _GraphState) -> None:
        self._nodes = list(state.nodes)
        self.release = state.held_by(self)

    def _run(self) -> None:
        for node in self._nodes:
            node()


class CommandGraph:
    """A handle of a modifiable ``command_graph``. The graph lives while a handle of it does
    (this one, or an executable graph made from it); when the last goes (``release`` or
    garbage collection), every queue recording into it returns to executing, and what they
    recorded is dropped (seen on the CPU runtime)."""

    def __init__(self, native: bool = False) -> None:
        self._state = _GraphState(native)
        self._let_go = self._state.held_by(self)

    @property
    def native(self) -> bool:
        return self._state.native

    def begin_recording(self, queue: Queue) -> None:
        state = self._state
        if queue._recording_into is not None:
            native = state.native or queue._recording_into.native
            raise SyclError(NATIVE_QUEUE_CAPTURING if native else BEGIN_ON_RECORDING_QUEUE)
        if state.native and state.recording_queues:
            raise SyclError(NATIVE_SECOND_QUEUE)
        queue._recording_into = state
        state.recording_queues.add(queue)

    def end_recording(self, queue: Queue | None = None) -> None:
        """End the recording of ``queue``, or of every queue recording into this graph."""
        state = self._state
        if state.native and state.unjoined_forks:
            raise SyclError(NATIVE_UNJOINED_FORK)
        if state.native:
            queue = None  # one recording, with its forks: it ends whole
        if queue is None:
            for recording in list(state.recording_queues):
                state.stop_recording(recording)
            return
        if queue._recording_into is None:
            return
        if queue._recording_into is not state:
            raise SyclError(END_FOR_OTHER_GRAPH)
        state.stop_recording(queue)

    def finalize(self) -> ExecutableGraph:
        return ExecutableGraph(self._state)

    def release(self) -> None:
        """Destroy this handle now (what ``del`` of the last reference does)."""
        self._let_go()

    @property
    def recording_state(self) -> _GraphState:
        """What queues recording into this graph hold (``Queue.recording_into``)."""
        return self._state


def _destroy(state: _GraphState) -> None:
    for queue in list(state.recording_queues):
        state.stop_recording(queue)
    state.nodes.clear()
    state.destroyed = True


class Device:
    """The device queues run on: the OpenCL CPU device has no device-wide wait."""

    def wait(self) -> None:
        raise SyclError(NO_DEVICE_WAIT)


class Runtime:
    """The calls ``tests/sycl_rules/test_sycl_rules_differential.py`` makes of both runtimes."""

    def __init__(self) -> None:
        self.device = Device()

    def new_queue(self) -> Queue:
        return Queue()

    def new_graph(self, queue: Queue, native: bool = False) -> CommandGraph:
        return CommandGraph(native)

    def new_counter(self) -> Counter:
        return Counter()

    def device_wait(self) -> None:
        self.device.wait()


class Counter:
    """Sixteen integers, and a kernel that adds one to each."""

    def __init__(self) -> None:
        self.values = [0] * 16

    @property
    def value(self) -> int:
        return self.values[0]

    def increment(self) -> None:
        for i in range(len(self.values)):
            self.values[i] += 1


__all__ = [
    "CommandGraph",
    "Device",
    "Event",
    "ExecutableGraph",
    "Queue",
    "Runtime",
    "SyclError",
]
