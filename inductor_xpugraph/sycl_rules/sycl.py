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
hands the capture to Level Zero. Its rules are read from intel/llvm, not measured (Intel's
runtime on the CPU cannot record natively): ``sycl/source/detail/graph/graph_impl.cpp``, the
libsycl 2026.2.0 binary (intel-sycl-rt, the runtime the differential test runs), the unit
tests ``sycl/unittests/Extensions/CommandGraph/NativeRecording*.cpp`` ("unit") and the e2e
tests of ``sycl/test-e2e/Graph/RecordReplay/NativeRecording/`` (named by file). Two facts carry
most of them: native recording never sets the queue's command graph, so SYCL's own checks of
a recording queue (the command-buffer texts above) are skipped and Level Zero refuses instead;
and a queue counts as recording natively when Level Zero captures on it, a forked queue
included (``queue_impl::isNativeRecording`` asks UR).

- One queue begins recording a graph: ``begin_recording`` of a graph a queue records, on that
  queue or another, throws ``NATIVE_SECOND_QUEUE`` (``exception_multi_queue_recording.cpp``); a
  queue Level Zero captures on (for another graph, or a fork) ``NATIVE_QUEUE_CAPTURING``; a
  queue recording into command buffers ``BEGIN_ON_RECORDING_QUEUE``. A graph whose recording
  ended cannot record again (``NATIVE_RESUME``, ``exception_pause_resume_recording.cpp``),
  unlike command buffers.
- An executing queue that submits with a dependency on a node of a graph being recorded joins
  the recording (a fork, ``multi_queue.cpp``). A fork is joined back when a queue of the
  recording other than itself submits work that depends on the fork's last node
  (``transitive_join_multi_queue.cpp``); its own later work leaves it unjoined.
- ``end_recording(queue)`` acts only on the queue that began the recording; it ends the forks
  too (the backend ends a joined fork with its origin, ``multi_queue.cpp``). On a fork, or a
  queue not recording into the graph, it does nothing. ``end_recording()`` ends the recording
  whatever queue began it. With a fork not joined back, both first return every queue to
  executing (``graph_impl::clearQueues`` swaps the recording queues out before ending them),
  then throw ``NATIVE_UNJOINED_FORK`` (``exception_unjoined_fork.cpp``).
- Events of the graph are not for use outside its recording: a submission that depends on one
  after the recording ended throws ``NATIVE_EVENT_USED_OUTSIDE``, so no queue joins a graph after
  its recording, unlike command buffers; a recorded node that depends on an event from outside
  the graph throws ``NATIVE_OUTSIDE_EVENT``, on a node of another graph being recorded
  ``NATIVE_MERGE_ATTEMPT`` (``exception_external_event.cpp``, ``exception_merge.cpp``).
- Host waits throw: ``queue.wait()`` on a queue that records natively (a fork included) and
  ``event.wait()`` on a node's event while the graph records, ``NATIVE_WAIT``
  (``exception_recording_queue_wait.cpp``, ``exception_recording_event_wait.cpp``); after the
  recording, while the graph exists, ``NATIVE_EVENT_USED_OUTSIDE``
  (``exception_external_event.cpp``).
- ``host_task`` on a queue that records natively throws ``NATIVE_HOST_TASK``
  (``exception_host_task.cpp``); under command buffers a host task is a node.
- A device without record and replay support refuses the graph at its construction
  (``NATIVE_UNSUPPORTED_DEVICE``, ``Device(record_and_replay=False)``).

Each refusal carries its ``errc`` (``SyclError.errc``, ``ERRC``): Level Zero's refusals reach SYCL
as ``errc::runtime`` with UR's generic text (``adapter_impl::checkUrResult``).

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

# Native recording. SYCL's own texts, from the libsycl 2026.2.0 binary (intel-sycl-rt; the
# literals, and the errc each throw site passes to make_error_code):
# graph_impl::beginRecordingBothLocksHeld.
NATIVE_SECOND_QUEUE = "Recording the same graph to multiple queues is not supported in native mode"
NATIVE_QUEUE_CAPTURING = "Queue is already in native graph capture mode"
# graph_impl::graph_impl, when the device's UR_DEVICE_INFO_GRAPH_RECORD_AND_REPLAY_SUPPORT_EXP
# is false (unit: NativeRecordingUnsupportedDevice).
NATIVE_UNSUPPORTED_DEVICE = (
    "Device does not support graph record and replay feature "
    "(UR_DEVICE_INFO_GRAPH_RECORD_AND_REPLAY_SUPPORT_EXP)."
)
# handler::finalize, for a host task on a queue that records natively (exception_host_task.cpp;
# intel/llvm#22143 lets the restricted ``syclex::host_task`` through, not modelled here).
NATIVE_HOST_TASK = (
    "Only restricted host tasks may be captured in native recording mode. The restricted host "
    "tasks API needs to be used and support in the backend required on this device."
)

# Level Zero's refusals, as SYCL reports a failed UR call: "<backend> backend failed with error: "
# then codeToString's "<number> (<name>)" (adapter_impl::checkUrResult), or a graph operation's
# own words then ": " and the same (2026.2.0's checkUrResult<errc::runtime>(result, Msg)). The
# numbers of the graph codes are unconfirmed (codeToString is not exported, ur_api.h not read):
# UR_NUMBER stands for them. The names are those the unit tests mock for each failure.
UR_NUMBER = "<N>"
# Where no source names the code a failure returns.
UR_NAME_UNCONFIRMED = "UR_RESULT_ERROR_\N{HORIZONTAL ELLIPSIS}"


def _ur_code(name: str) -> str:
    return f"{UR_NUMBER} ({name})"


def _level_zero_failure(name: str) -> str:
    return f"level_zero backend failed with error: {_ur_code(name)}"


# A host wait on recorded work while the graph records: urQueueFinish, urEventWait (unit:
# RecordingQueueWaitDescriptiveError, RecordedEventHostWaitDescriptiveError).
NATIVE_WAIT = _level_zero_failure("UR_RESULT_ERROR_GRAPH_CAPTURE_UNSUPPORTED")
# A recorded node waiting on an event signalled outside the recording (unit:
# InternalEventDescriptiveError, "a wait event signaled on a non-recording queue").
NATIVE_OUTSIDE_EVENT = _level_zero_failure("UR_RESULT_ERROR_GRAPH_INTERNAL_EVENT")
# An event of the graph used outside its recording (unit: InternalEventDescriptiveError, "using a
# graph-internal event outside of the graph"); the same text as the one above.
NATIVE_EVENT_USED_OUTSIDE = _level_zero_failure("UR_RESULT_ERROR_GRAPH_INTERNAL_EVENT")
# A recorded node waiting on a node of another graph being recorded (unit:
# MergeAttemptDescriptiveError).
NATIVE_MERGE_ATTEMPT = _level_zero_failure("UR_RESULT_ERROR_GRAPH_CAPTURE_MERGE_ATTEMPT")
# end_recording with a fork not joined back: clearQueues and end_recording(queue&), unit:
# UnjoinedForkDescriptiveError.
NATIVE_UNJOINED_FORK = (
    f"Error when ending native graph capture: {_ur_code('UR_RESULT_ERROR_GRAPH_UNJOINED_FORKS')}"
)
# begin_recording of a graph whose recording ended: urQueueBeginCaptureIntoGraphExp fails, with
# a code no source names (exception_pause_resume_recording.cpp expects errc::runtime).
NATIVE_RESUME = f"Failed to begin native UR graph capture: {_ur_code(UR_NAME_UNCONFIRMED)}"

# ``sycl::errc`` values, by name (``SyclError.errc``).
RUNTIME, INVALID, FEATURE_NOT_SUPPORTED = "runtime", "invalid", "feature_not_supported"
#: The errc each text is thrown with: the libsycl 2026.2.0 binary's make_error_code argument at
#: the literal's throw site; Level Zero's refusals are errc::runtime (checkUrResult).
ERRC: dict[str, str] = {
    WAIT_ON_RECORDING_QUEUE: INVALID,
    NODE_DEPENDS_ON_OUTSIDE_EVENT: INVALID,
    BEGIN_ON_RECORDING_QUEUE: INVALID,
    BARRIER_ON_OUTSIDE_EVENT: INVALID,
    END_FOR_OTHER_GRAPH: INVALID,
    DEPENDS_ON_OTHER_GRAPH: INVALID,
    WAIT_ON_NODE_EVENT: INVALID,
    NO_DEVICE_WAIT: FEATURE_NOT_SUPPORTED,
    NATIVE_SECOND_QUEUE: FEATURE_NOT_SUPPORTED,
    NATIVE_QUEUE_CAPTURING: INVALID,
    NATIVE_UNSUPPORTED_DEVICE: INVALID,
    NATIVE_HOST_TASK: FEATURE_NOT_SUPPORTED,
    NATIVE_WAIT: RUNTIME,
    NATIVE_OUTSIDE_EVENT: RUNTIME,
    NATIVE_EVENT_USED_OUTSIDE: RUNTIME,
    NATIVE_MERGE_ATTEMPT: RUNTIME,
    NATIVE_UNJOINED_FORK: RUNTIME,
    NATIVE_RESUME: RUNTIME,
}


class SyclError(RuntimeError):
    """A ``sycl::exception``; ``str()`` is its ``what()``, ``errc`` its ``sycl::errc``
    ("runtime", "invalid", "feature_not_supported"): ``errc`` if given, else the one ``ERRC``
    gives the text, else "runtime" (a UR failure, as the stand-in device injects)."""

    def __init__(self, what: str, errc: str | None = None) -> None:
        super().__init__(what)
        self.errc = errc or ERRC.get(what, RUNTIME)


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
        if graph is None or graph.destroyed:
            return
        if not graph.native:
            raise SyclError(WAIT_ON_NODE_EVENT)  # event_impl::wait, keyed on the event's graph
        # Native: the event has no graph in SYCL; urEventWait fails (module docstring).
        raise SyclError(NATIVE_WAIT if graph.capturing else NATIVE_EVENT_USED_OUTSIDE)


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
        # Native recording. The queue that began the recording (graph_impl's MRecordingQueues;
        # the other recording queues are forks), and whether a recording began (a graph records
        # once).
        self.began_by: weakref.WeakSet[Queue] = weakref.WeakSet()
        self.recorded = False
        # Each fork's last node, until another queue of the recording depends on it.
        self.unjoined_forks: weakref.WeakKeyDictionary[Queue, Event] = weakref.WeakKeyDictionary()

    @property
    def capturing(self) -> bool:
        """Whether a queue records into the graph (natively: Level Zero captures)."""
        return bool(self.recording_queues)

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
        self.began_by.discard(queue)
        self.unjoined_forks.pop(queue, None)

    def end_native_recording(self) -> None:
        """End the native recording: every queue returns to executing, the forks with the queue
        that began it (multi_queue.cpp), before a fork not joined back is reported:
        graph_impl::clearQueues swaps the recording queues out, then ends each and throws on
        the first failure; UR stops capturing before it rejects the capture (unit:
        UnjoinedForkDescriptiveError, the queue is executing after)."""
        unjoined = bool(self.unjoined_forks)
        for queue in list(self.recording_queues):
            self.stop_recording(queue)
        if unjoined:
            raise SyclError(NATIVE_UNJOINED_FORK)

    def note_native_submission(
        self, queue: Queue, depends_on: Sequence[Event], event: Event
    ) -> None:
        """Keep track of forks: a fork's last node is unjoined until another queue of the
        recording submits work that depends on it (multi_queue.cpp,
        transitive_join_multi_queue.cpp). A fork's own later work is its new last node, so it
        never joins itself."""
        for fork, last in list(self.unjoined_forks.items()):
            if any(last is dependency for dependency in depends_on):
                del self.unjoined_forks[fork]
        if queue not in self.began_by:
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

    def host_task(self, task: Kernel, depends_on: Sequence[Event] = ()) -> Event:
        """``handler::host_task``: ``task`` runs on the host, in order with the queue's work;
        under command buffers it is a node like a kernel. handler::finalize refuses it on a
        queue that records natively (``queue_impl::isNativeRecording``: a fork included;
        exception_host_task.cpp)."""
        graph = self._recording_into
        if graph is not None and graph.native:
            raise SyclError(NATIVE_HOST_TASK)
        return self.submit(task, depends_on)

    def _submit(self, kernel: Kernel, depends_on: Sequence[Event], outside: str) -> Event:
        graph = self._recording_into
        if graph is None:
            joined = _live_graph_of(depends_on)
            if joined is not None:  # depends on a node of a graph that exists: join it
                if joined.native and not joined.capturing:
                    raise SyclError(NATIVE_EVENT_USED_OUTSIDE)
                joined.recording_queues.add(self)
                self._recording_into = graph = joined
        if graph is not None:
            for event in depends_on:
                if event.node_of is graph:
                    continue
                if graph.native:
                    raise SyclError(_native_refusal_of(event))
                if event.node_of is not None and not event.node_of.destroyed:
                    raise SyclError(DEPENDS_ON_OTHER_GRAPH)  # seen on the CPU
                raise SyclError(outside)  # spec; seen on the CPU
            graph.nodes.append(kernel)
            event = Event(node_of=graph)
            if graph.native:
                graph.note_native_submission(self, depends_on, event)
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


def _native_refusal_of(event: Event) -> str:
    """What Level Zero says of a recorded node that depends on ``event``, not of its graph: a
    node of another graph being recorded would merge two captures (exception_merge.cpp), any
    other event is from outside the recording (exception_external_event.cpp)."""
    other = event.node_of
    if other is not None and not other.destroyed and other.native and other.capturing:
        return NATIVE_MERGE_ATTEMPT
    return NATIVE_OUTSIDE_EVENT


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

    def __init__(self, native: bool = False, device: Device | None = None) -> None:
        if native and device is not None and not device.record_and_replay:
            raise SyclError(NATIVE_UNSUPPORTED_DEVICE)  # graph_impl::graph_impl
        self._state = _GraphState(native)
        self._let_go = self._state.held_by(self)

    @property
    def native(self) -> bool:
        return self._state.native

    def begin_recording(self, queue: Queue) -> None:
        """The checks in the order of libsycl 2026.2.0's ``begin_recording`` then
        ``graph_impl::beginRecordingBothLocksHeld`` (module docstring)."""
        state = self._state
        recording = queue._recording_into
        if recording is not None and not recording.native:  # the queue's command graph
            raise SyclError(BEGIN_ON_RECORDING_QUEUE)
        if state.native and state.began_by:
            raise SyclError(NATIVE_SECOND_QUEUE)
        if recording is not None:  # Level Zero captures on the queue
            # (For a graph of command buffers the binary checks no capture: it would give the
            # capturing queue a command graph too. The model refuses the same way.)
            raise SyclError(NATIVE_QUEUE_CAPTURING)
        if state.native:
            if state.recorded:  # urQueueBeginCaptureIntoGraphExp fails; the queue executes
                raise SyclError(NATIVE_RESUME)
            state.recorded = True
            state.began_by.add(queue)
        queue._recording_into = state
        state.recording_queues.add(queue)

    def end_recording(self, queue: Queue | None = None) -> None:
        """End the recording of ``queue``, or of every queue recording into this graph."""
        state = self._state
        if queue is None:  # graph_impl::clearQueues
            if state.native:
                state.end_native_recording()
            for recording in list(state.recording_queues):
                state.stop_recording(recording)
            return
        if state.native and queue in state.began_by:  # graph_impl::isQueueRecording
            state.end_native_recording()
            return
        recording = queue._recording_into
        if recording is None or (recording is not state and recording.native):
            return  # nothing records, or no command graph of SYCL's: nothing to end
        if recording is not state:
            raise SyclError(END_FOR_OTHER_GRAPH)
        if not state.native:
            state.stop_recording(queue)
        # A fork of this native recording: not a queue that began it, ended with that one.

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
    """The device queues run on: the OpenCL CPU device has no device-wide wait.
    ``record_and_replay``: whether the device can record natively
    (``UR_DEVICE_INFO_GRAPH_RECORD_AND_REPLAY_SUPPORT_EXP``)."""

    def __init__(self, record_and_replay: bool = True) -> None:
        self.record_and_replay = record_and_replay

    def wait(self) -> None:
        raise SyclError(NO_DEVICE_WAIT)


class Runtime:
    """The calls ``tests/sycl_rules/test_sycl_rules_differential.py`` makes of both runtimes."""

    def __init__(self, device: Device | None = None) -> None:
        self.device = device or Device()

    def new_queue(self) -> Queue:
        return Queue()

    def new_graph(self, queue: Queue, native: bool = False) -> CommandGraph:
        return CommandGraph(native, self.device)

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
