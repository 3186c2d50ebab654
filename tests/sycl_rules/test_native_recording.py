"""Native recording in the stand-in SYCL runtime (``inductor_xpugraph.sycl_rules.sycl``), one
rule per test, as intel/llvm says it: the libsycl 2026.2.0 binary (intel-sycl-rt: each text's
literal and the errc its throw site passes), ``sycl/source/detail/graph/graph_impl.cpp``, the
unit tests ``sycl/unittests/Extensions/CommandGraph/NativeRecording*.cpp`` ("unit") and the e2e
tests of ``sycl/test-e2e/Graph/RecordReplay/NativeRecording/`` (named by file). Intel's runtime
on the CPU cannot record natively: these are read, not measured.

The texts are written out here, not taken from ``sycl``: a test compares what a rule throws with
what the sources say, so that changing either the rule or its text fails it. Level Zero's
refusals read "<backend> backend failed with error: <number> (<UR code>)"; the numbers are
unconfirmed, and the stand-in writes "<N>". Also here: the stand-in device's native refusal at
submission (``sycl_rules.submission``) and what ``sycl_rules.on_cpu`` forgets on exit.
"""

from __future__ import annotations

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph import sycl_rules
from inductor_xpugraph.sycl_rules import StandInXpu, SubmitToCurrentQueue, release_of, sycl
from inductor_xpugraph.trees.backends import capture_streams, device_graphs
from inductor_xpugraph.trees.per_thread import thread_trees, tree_for

# SYCL's own texts (libsycl 2026.2.0).
SECOND_QUEUE = "Recording the same graph to multiple queues is not supported in native mode"
QUEUE_CAPTURING = "Queue is already in native graph capture mode"
BEGIN_ON_RECORDING_QUEUE = (
    "begin_recording cannot be called for a queue which is already in the recording state."
)
END_FOR_OTHER_GRAPH = "end_recording called for a queue which is recording to a different graph."
UNSUPPORTED_DEVICE = (
    "Device does not support graph record and replay feature "
    "(UR_DEVICE_INFO_GRAPH_RECORD_AND_REPLAY_SUPPORT_EXP)."
)
HOST_TASK = (
    "Only restricted host tasks may be captured in native recording mode. The restricted host "
    "tasks API needs to be used and support in the backend required on this device."
)
# Level Zero's refusals, through SYCL (the UR codes the unit tests mock for each).
WAIT = "level_zero backend failed with error: <N> (UR_RESULT_ERROR_GRAPH_CAPTURE_UNSUPPORTED)"
INTERNAL_EVENT = "level_zero backend failed with error: <N> (UR_RESULT_ERROR_GRAPH_INTERNAL_EVENT)"
MERGE = "level_zero backend failed with error: <N> (UR_RESULT_ERROR_GRAPH_CAPTURE_MERGE_ATTEMPT)"
UNJOINED_FORK = "Error when ending native graph capture: <N> (UR_RESULT_ERROR_GRAPH_UNJOINED_FORKS)"
RESUME = "Failed to begin native UR graph capture: <N> (UR_RESULT_ERROR_\N{HORIZONTAL ELLIPSIS})"


def refusal(call, *args, **kwargs) -> tuple[str, str]:
    """``(what(), errc)`` of the SyclError ``call(*args, **kwargs)`` throws."""
    with pytest.raises(sycl.SyclError) as error:
        call(*args, **kwargs)
    return str(error.value), error.value.errc


def native_recording() -> tuple[sycl.CommandGraph, sycl.Queue, sycl.Event]:
    """A native graph recording on a queue, and the event of its first node."""
    graph, origin = sycl.CommandGraph(native=True), sycl.Queue("origin")
    graph.begin_recording(origin)
    return graph, origin, origin.submit_barrier()


# -- begin_recording ------------------------------------------------------------------------


def test_a_graph_recording_natively_takes_no_other_queue():
    """beginRecordingBothLocksHeld; exception_multi_queue_recording.cpp: the second queue keeps
    executing, the first recording."""
    graph, origin, _ = native_recording()
    other = sycl.Queue()
    assert refusal(graph.begin_recording, other) == (SECOND_QUEUE, "feature_not_supported")
    assert (origin.state, other.state) == ("recording", "executing")


def test_a_graph_recording_natively_cannot_begin_again_on_its_own_queue():
    """The same check comes first: the multi-queue text, not "already capturing"."""
    graph, origin, _ = native_recording()
    assert refusal(graph.begin_recording, origin) == (SECOND_QUEUE, "feature_not_supported")
    assert origin.state == "recording"


def test_a_queue_capturing_for_another_native_graph_cannot_begin():
    """beginRecordingBothLocksHeld: ``queue_impl::isNativeRecording`` asks UR."""
    graph, origin, _ = native_recording()
    assert refusal(sycl.CommandGraph(native=True).begin_recording, origin) == (
        QUEUE_CAPTURING,
        "invalid",
    )


def test_a_forked_queue_cannot_begin_a_native_recording():
    """A fork captures too (isNativeRecording asks UR, not SYCL's recording queues)."""
    graph, origin, first = native_recording()
    forked = sycl.Queue("forked")
    forked.submit_barrier([first])
    assert refusal(sycl.CommandGraph(native=True).begin_recording, forked) == (
        QUEUE_CAPTURING,
        "invalid",
    )


def test_a_queue_recording_command_buffers_cannot_begin_a_native_recording():
    """modifiable_command_graph::begin_recording checks the queue's command graph first."""
    queue, command_buffers = sycl.Queue(), sycl.CommandGraph()
    command_buffers.begin_recording(queue)
    assert refusal(sycl.CommandGraph(native=True).begin_recording, queue) == (
        BEGIN_ON_RECORDING_QUEUE,
        "invalid",
    )


def test_a_native_graph_records_once():
    """exception_pause_resume_recording.cpp: begin after end_recording throws errc::runtime and
    the queue stays executing (command buffers take a second recording)."""
    graph, origin, _ = native_recording()
    graph.end_recording()
    assert refusal(graph.begin_recording, origin) == (RESUME, "runtime")
    assert origin.state == "executing"
    command_buffers = sycl.CommandGraph()
    command_buffers.begin_recording(origin)
    command_buffers.end_recording()
    command_buffers.begin_recording(origin)
    assert origin.state == "recording"


# -- forks ----------------------------------------------------------------------------------


def test_a_fork_joined_back_ends_with_the_recording():
    """multi_queue.cpp: a queue that depends on a recorded node joins the recording; once the
    recording queue depends on its last node, the recording ends, both queues with it."""
    origin, forked, counter = sycl.Queue(), sycl.Queue(), sycl.Counter()
    graph = sycl.CommandGraph(native=True)
    graph.begin_recording(origin)
    fork = origin.submit(counter.increment)
    branch = forked.submit(counter.increment, depends_on=[fork])
    assert forked.state == "recording"
    origin.submit(counter.increment, depends_on=[branch])
    graph.end_recording()
    assert (origin.state, forked.state) == ("executing", "executing")
    origin.submit_graph(graph.finalize())
    assert counter.value == 3


def test_a_fork_joined_through_another_fork_is_joined():
    """transitive_join_multi_queue.cpp: the second fork joins the first, the origin joins it."""
    graph, origin, first = native_recording()
    one, two = sycl.Queue("one"), sycl.Queue("two")
    two_joins_one = two.submit_barrier([one.submit_barrier([first])])
    origin.submit_barrier([two_joins_one])
    graph.end_recording()
    assert {q.state for q in (origin, one, two)} == {"executing"}


@pytest.mark.parametrize("on_its_own_node", [True, False], ids=["depending", "in-order"])
def test_a_forks_own_later_work_does_not_join_it(on_its_own_node):
    """Only another queue of the recording joins a fork, by depending on its last node."""
    graph, origin, first = native_recording()
    forked = sycl.Queue("forked")
    branch = forked.submit_barrier([first])
    forked.submit_barrier([branch] if on_its_own_node else [])
    assert refusal(graph.end_recording) == (UNJOINED_FORK, "runtime")


@pytest.mark.parametrize("joined_on", ["last", "earlier"])
def test_a_fork_is_joined_on_its_last_node(joined_on):
    """The origin must depend on the fork's last node; an earlier one leaves the rest of the
    fork's work unjoined."""
    graph, origin, first = native_recording()
    forked = sycl.Queue("forked")
    earlier = forked.submit_barrier([first])
    last = forked.submit_barrier()
    origin.submit_barrier([last if joined_on == "last" else earlier])
    if joined_on == "last":
        graph.end_recording()
    else:
        assert refusal(graph.end_recording) == (UNJOINED_FORK, "runtime")


def test_a_forks_work_after_its_join_must_be_joined_again():
    graph, origin, first = native_recording()
    forked = sycl.Queue("forked")
    origin.submit_barrier([forked.submit_barrier([first])])
    forked.submit_barrier()
    assert refusal(graph.end_recording) == (UNJOINED_FORK, "runtime")


@pytest.mark.parametrize("ended_by", ["graph", "origin"])
def test_an_unjoined_fork_fails_the_end_after_every_queue_stopped_recording(ended_by):
    """exception_unjoined_fork.cpp (errc::runtime); graph_impl::clearQueues swaps the recording
    queues out before it ends them and throws; unit UnjoinedForkDescriptiveError: the queue is
    executing after. No queue records into the graph any more: work runs at submission."""
    graph, origin, first = native_recording()
    forked, counter = sycl.Queue("forked"), sycl.Counter()
    forked.submit(counter.increment, depends_on=[first])
    end = graph.end_recording if ended_by == "graph" else lambda: graph.end_recording(origin)
    assert refusal(end) == (UNJOINED_FORK, "runtime")
    assert (origin.state, forked.state) == ("executing", "executing")
    origin.submit(counter.increment)
    forked.submit(counter.increment)
    assert counter.value == 2
    graph.end_recording()  # nothing left to end


# -- end_recording(queue) -------------------------------------------------------------------


def test_end_recording_of_a_fork_does_nothing():
    """modifiable_command_graph::end_recording(queue) acts only on a queue that began recording
    (isQueueRecording); a fork ends when its origin does (multi_queue.cpp)."""
    graph, origin, first = native_recording()
    forked = sycl.Queue("forked")
    origin.submit_barrier([forked.submit_barrier([first])])
    graph.end_recording(forked)
    assert (origin.state, forked.state) == ("recording", "recording")
    graph.end_recording(origin)
    assert (origin.state, forked.state) == ("executing", "executing")


def test_end_recording_of_a_queue_recording_elsewhere():
    """Natively, nothing (no command graph of SYCL's on the queue); into command buffers of
    another graph, SYCL's "different graph" (errc::invalid)."""
    graph, origin, _ = native_recording()
    other_native, other_command_buffers = sycl.Queue(), sycl.Queue()
    natively, into_command_buffers = sycl.CommandGraph(native=True), sycl.CommandGraph()
    natively.begin_recording(other_native)
    into_command_buffers.begin_recording(other_command_buffers)
    graph.end_recording(other_native)
    assert (origin.state, other_native.state) == ("recording", "recording")
    assert refusal(graph.end_recording, other_command_buffers) == (END_FOR_OTHER_GRAPH, "invalid")
    sycl.CommandGraph().end_recording(other_native)
    assert other_native.state == "recording"


# -- host waits -----------------------------------------------------------------------------


def test_a_host_wait_on_a_queue_recording_natively_fails_in_level_zero():
    """exception_recording_queue_wait.cpp: errc::runtime (SYCL's own check is of the queue's
    command graph, which native recording never sets); unit RecordingQueueWaitDescriptiveError.
    A fork records natively too."""
    graph, origin, first = native_recording()
    forked = sycl.Queue("forked")
    origin.submit_barrier([forked.submit_barrier([first])])
    assert refusal(origin.wait) == (WAIT, "runtime")
    assert refusal(forked.wait) == (WAIT, "runtime")
    graph.end_recording()
    origin.wait()
    forked.wait()


def test_a_host_wait_on_a_native_nodes_event_fails_in_level_zero():
    """exception_recording_event_wait.cpp: errc::runtime while recording (unit
    RecordedEventHostWaitDescriptiveError); exception_external_event.cpp: errc::runtime after
    the recording, while the graph exists; once it is gone the wait returns."""
    graph, origin, first = native_recording()
    assert refusal(first.wait) == (WAIT, "runtime")
    graph.end_recording()
    executable = graph.finalize()
    assert refusal(first.wait) == (INTERNAL_EVENT, "runtime")
    graph.release()
    executable.release()
    first.wait()


# -- events across the recording's boundary ---------------------------------------------------


def test_a_native_node_cannot_depend_on_an_event_from_before_the_recording():
    """exception_external_event.cpp: errc::runtime (unit InternalEventDescriptiveError)."""
    origin = sycl.Queue()
    before = origin.submit_barrier()
    graph = sycl.CommandGraph(native=True)
    graph.begin_recording(origin)
    assert refusal(origin.submit_barrier, [before]) == (INTERNAL_EVENT, "runtime")


def test_a_native_node_cannot_depend_on_a_node_of_another_recording():
    """exception_merge.cpp: errc::runtime (unit MergeAttemptDescriptiveError)."""
    other_graph, other_origin, other_node = native_recording()
    graph, origin, _ = native_recording()
    assert refusal(origin.submit_barrier, [other_node]) == (MERGE, "runtime")
    other_graph.end_recording()
    assert refusal(origin.submit_barrier, [other_node]) == (INTERNAL_EVENT, "runtime")


def test_no_queue_joins_a_native_graph_after_its_recording():
    """exception_external_event.cpp: an event of the graph used outside the recording throws
    (under command buffers the queue would join the graph)."""
    graph, _, first = native_recording()
    graph.end_recording()
    executable = graph.finalize()
    later = sycl.Queue()
    assert refusal(later.submit_barrier, [first]) == (INTERNAL_EVENT, "runtime")
    assert later.state == "executing"
    del executable


# -- devices and host tasks -----------------------------------------------------------------


def test_a_device_without_record_and_replay_refuses_a_native_graph():
    """graph_impl::graph_impl (unit NativeRecordingUnsupportedDevice): errc::invalid; a graph of
    command buffers is made."""
    device = sycl.Device(record_and_replay=False)
    assert refusal(sycl.CommandGraph, native=True, device=device) == (
        UNSUPPORTED_DEVICE,
        "invalid",
    )
    runtime = sycl.Runtime(device)
    assert refusal(runtime.new_graph, runtime.new_queue(), native=True)[0] == UNSUPPORTED_DEVICE
    runtime.new_graph(runtime.new_queue())
    sycl.CommandGraph(native=True, device=sycl.Device())


def test_a_host_task_is_refused_under_native_recording():
    """handler::finalize; exception_host_task.cpp: errc::feature_not_supported, on the queue
    that began and on a fork; nothing is recorded."""
    graph, origin, first = native_recording()
    forked, ran = sycl.Queue("forked"), []
    origin.submit_barrier([forked.submit_barrier([first])])
    for queue in (origin, forked):
        assert refusal(queue.host_task, lambda: ran.append(1)) == (
            HOST_TASK,
            "feature_not_supported",
        )
    graph.end_recording()
    origin.submit_graph(graph.finalize())
    assert ran == []


def test_a_host_task_is_a_node_under_command_buffers():
    queue, ran = sycl.Queue(), []
    queue.host_task(lambda: ran.append("eager"))
    graph = sycl.CommandGraph()
    graph.begin_recording(queue)
    queue.host_task(lambda: ran.append("replay"))
    graph.end_recording()
    assert ran == ["eager"]
    queue.submit_graph(graph.finalize())
    assert ran == ["eager", "replay"]


# -- errc -----------------------------------------------------------------------------------


def test_command_buffer_refusals_are_errc_invalid():
    """The libsycl 2026.2.0 binary: each of these texts' throw sites passes errc::invalid; the
    device-wide wait errc::feature_not_supported."""
    queue, other = sycl.Queue(), sycl.Queue()
    eager = queue.submit_barrier()
    graph = sycl.CommandGraph()
    graph.begin_recording(queue)
    node = queue.submit_barrier()
    assert refusal(queue.wait)[1] == "invalid"
    assert refusal(node.wait)[1] == "invalid"
    assert refusal(queue.submit, lambda: None, [eager])[1] == "invalid"
    assert refusal(queue.submit_barrier, [eager])[1] == "invalid"
    assert refusal(graph.begin_recording, queue)[1] == "invalid"
    other_graph = sycl.CommandGraph()
    other_graph.begin_recording(other)
    assert refusal(graph.end_recording, other)[1] == "invalid"
    assert refusal(other.submit_barrier, [node])[1] == "invalid"
    assert refusal(sycl.Device().wait)[1] == "feature_not_supported"


def test_every_text_of_the_model_has_its_errc():
    """A text left out of ``sycl.ERRC`` would be thrown as errc::runtime."""
    not_texts = {"UR_NUMBER", "UR_NAME_UNCONFIRMED", "RUNTIME", "INVALID", "FEATURE_NOT_SUPPORTED"}
    texts = {
        name: value
        for name, value in vars(sycl).items()
        if name.isupper() and isinstance(value, str) and name not in not_texts
    }
    assert SECOND_QUEUE in texts.values()
    assert [name for name, text in texts.items() if text not in sycl.ERRC] == []


# -- the stand-in device --------------------------------------------------------------------


@pytest.fixture
def isolated_backends(monkeypatch):
    monkeypatch.setattr(device_graphs, "_DEVICES_THAT_CANNOT_RECORD", {})
    monkeypatch.setattr(capture_streams, "_capture_streams", {})


def test_an_op_refused_in_a_native_capture_raises_level_zeros_error(isolated_backends):
    """``submission``: an operator the release refuses (oneMKL's, which makes the recording
    queue depend on an event of its own) raises what Level Zero reports of a dependency on an
    event from outside the recording."""
    device = StandInXpu(release_of("2.14"), "native")
    stream = device.Stream()
    graph = device.XPUGraph()
    with device.stream(stream):
        graph.capture_begin()
    with SubmitToCurrentQueue(device), device.stream(stream):
        assert refusal(torch.linalg.inv, torch.eye(3) * 2) == (INTERNAL_EVENT, "runtime")


def test_a_native_capture_streams_host_sync_fails_in_level_zero(isolated_backends):
    device = StandInXpu(release_of("2.14"), "native")
    stream = device.Stream()
    graph = device.XPUGraph()
    with device.stream(stream):
        graph.capture_begin()
        assert refusal(stream.synchronize) == (WAIT, "runtime")
        graph.capture_end()
    stream.synchronize()


@pytest.fixture
def fresh_runtime():
    inductor_xpugraph.reset()
    yield
    inductor_xpugraph.reset()


def test_on_cpu_forgets_the_capture_streams_of_its_device_on_exit(isolated_backends, fresh_runtime):
    """The stand-in device goes with its state: a capture stream kept for it would hand a later
    ``on_cpu`` a queue of a device no longer there (``forget_capture_streams``)."""
    with sycl_rules.on_cpu("2.14", recording="native") as device:
        assert tree_for("cpu").backend.capture_stream.queue in device.queues()
        assert [key[0] for key in capture_streams._capture_streams] == [device.__name__]
    assert capture_streams._capture_streams == {}


def test_on_cpu_forgets_the_trees_made_inside_on_exit(isolated_backends, fresh_runtime):
    """The CPU's trees made inside record through the stand-in device's backend: dropped on exit
    (``forget_trees("cpu")``), the next call makes a tree with the CPU's own backend."""
    with sycl_rules.on_cpu("2.14", recording="native"):
        inside = tree_for("cpu")
    assert thread_trees().get("cpu") is not inside
