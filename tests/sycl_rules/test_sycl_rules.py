"""The stand-in of torch's XPU runtime (``inductor_xpugraph.sycl_rules``) and the xpu backend
over it.

Two groups. The *rules*: what the stand-in does, one rule per test, each as its module says torch's
XPU runtime (c10/xpu/XPUStream.cpp, aten/src/ATen/xpu/XPUGraph.cpp, the caching allocators) or SYCL
Graph (the ``sycl_ext_oneapi_graph`` specification, or Intel's SYCL runtime on the CPU:
tests/sycl_rules/test_sycl_rules_differential.py) does it. The *findings*: what the xpu backend's
own code (``DeviceGraphBackend``, run as ``XpuRulesBackend``) does after a capture fails under those
rules (Note [Recovering from a failed capture] in ``trees/backends/device_graphs.py``), and what the
tree does with it. No ``torch.compile``: the callables are written as Inductor writes them (an
``empty_strided_cpu`` in their module's globals, which ``EmulatedGraph`` reroutes at capture and
replay).
"""

from __future__ import annotations

import logging

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph import sycl_rules
from inductor_xpugraph.sycl_rules import StandInXpu, SubmitToCurrentQueue, release_of, sycl
from inductor_xpugraph.sycl_rules.backend import AcceleratorRulesBackend, XpuRulesBackend
from inductor_xpugraph.sycl_rules.torch_xpu import (
    OFFSET_OUTSIDE_CAPTURE,
    STREAMS_PER_POOL,
    XPUGraph,
)
from inductor_xpugraph.trees import messages, stats
from inductor_xpugraph.trees.backends import capture_streams, device_graphs
from inductor_xpugraph.trees.graphed_callable import GraphedCallable
from inductor_xpugraph.trees.node import Phase
from inductor_xpugraph.trees.per_thread import tree_for

# What a Level Zero error ending a recording looks like (injected: only hardware shows it).
LEVEL_ZERO_ERROR = "end_recording: UR_RESULT_ERROR_DEVICE_LOST"


@pytest.fixture(autouse=True)
def isolated_backends(monkeypatch):
    """Which devices cannot record, and each thread's capture stream, are process-wide:
    each test starts with none."""
    monkeypatch.setattr(device_graphs, "_DEVICES_THAT_CANNOT_RECORD", {})
    monkeypatch.setattr(capture_streams, "_capture_streams", {})


@pytest.fixture
def fresh_runtime():
    """Trees and counters of their own, for the tests that go through ``GraphedCallable``."""
    inductor_xpugraph.reset()
    with inductor_xpugraph.config.patch(warmup_runs=1):
        yield
    inductor_xpugraph.reset()


def stand_in(release: str = "2.11", recording: str = "command-buffer") -> StandInXpu:
    """The stand-in of ``release``, recording through command buffers (the rules measured on
    Intel's runtime) unless told otherwise."""
    return StandInXpu(release_of(release), recording)


def recording_queues(device: StandInXpu) -> list[sycl.Queue]:
    return [queue for queue in device.queues() if queue.state == "recording"]


def add_one():
    """``call(args) -> (args[0] + 1,)`` as Inductor generates it: its output comes from the
    module's ``empty_strided_cpu``."""
    module_globals = {
        "torch": torch,
        "empty_strided_cpu": torch._C._dynamo.guards._empty_strided_cpu,
    }
    exec(
        "def call(args):\n"
        "    x = args[0]\n"
        "    buf0 = empty_strided_cpu(tuple(x.size()), tuple(x.stride()), x.dtype)\n"
        "    torch.add(x, 1, out=buf0)\n"
        "    return (buf0,)\n",
        module_globals,
    )
    return module_globals["call"]


class PlaceNothing:
    """``place_inputs`` of a capture that copies no input."""

    indices = ()

    def __call__(self, args) -> None:
        pass


def fail_a_capture_end(backend: XpuRulesBackend, device: StandInXpu) -> pytest.ExceptionInfo:
    """A capture whose ``capture_end`` raises with its queue still recording, as XPUGraph's
    does when SYCL's ``end_recording`` fails. Returns the error, for the caller to hold, as
    the tree holds it while it runs the call un-graphed (``GraphedCallable._capture_failed``):
    the recovery must not depend on the error being dropped."""
    pool = backend.new_pool()
    device.fail_next("end_recording", LEVEL_ZERO_ERROR)
    with pytest.raises(sycl.SyclError, match="DEVICE_LOST") as failure:
        backend.capture(add_one(), [torch.ones(4)], pool, PlaceNothing())
    return failure


# -- the rules of the stand-in ------------------------------------------------------------------


@pytest.mark.parametrize("priority, pool", [(1, "low"), (0, "normal"), (-1, "high")])
def test_streams_come_round_robin_from_32_queues_per_priority(priority, pool):
    """c10/xpu/XPUStream.cpp: ``kStreamsPerPool`` queues per priority, handed out in turn: a
    "new" stream is a queue someone had before."""
    device = stand_in()
    streams = [device.Stream(priority=priority) for _ in range(STREAMS_PER_POOL + 1)]
    assert STREAMS_PER_POOL == 32
    assert len({id(s.queue) for s in streams[:32]}) == 32
    assert all(s.queue in device.pools[pool] for s in streams)
    assert streams[32].queue is streams[0].queue


def test_the_default_current_stream_is_the_normal_pools_last_queue():
    """initXPUStreamsOnce: the 32nd stream a thread takes is its default stream's queue."""
    device = stand_in()
    assert device.current_stream().queue is device.pools["normal"][-1]
    assert [device.Stream() for _ in range(32)][-1] == device.current_stream()


def test_waiting_on_a_recording_queue_throws_sycls_error():
    """SYCL's ``queue::wait`` on a queue that records (measured on Intel's runtime)."""
    device = stand_in()
    stream = device.Stream()
    graph = sycl.CommandGraph()
    graph.begin_recording(stream.queue)
    with pytest.raises(sycl.SyclError) as error:
        stream.synchronize()
    assert str(error.value) == sycl.WAIT_ON_RECORDING_QUEUE


@pytest.mark.parametrize("call", ["synchronize", "empty_cache"])
def test_device_wide_waits_throw_while_any_queue_records(call):
    """``syncStreamsOnDevice`` waits on every queue of the pools, and XPU's ``emptyCache``
    synchronizes first: one recording queue anywhere, here of another priority, makes both
    throw; they work again once it executes."""
    device = stand_in()
    graph = sycl.CommandGraph()
    graph.begin_recording(device.Stream(priority=-1).queue)
    with pytest.raises(sycl.SyclError, match="wait cannot be called for a queue"):
        getattr(device, call)()
    graph.end_recording()
    getattr(device, call)()


def test_begin_recording_on_a_recording_queue_throws():
    device = stand_in()
    queue = device.Stream().queue
    recording = sycl.CommandGraph()
    recording.begin_recording(queue)
    with pytest.raises(sycl.SyclError) as error:
        sycl.CommandGraph().begin_recording(queue)
    assert str(error.value) == sycl.BEGIN_ON_RECORDING_QUEUE
    assert queue.recording_into is recording.recording_state


def test_a_stream_that_waits_for_a_recording_stream_joins_the_recording():
    """A barrier on an event of a graph's node makes an executing queue record into that
    graph, silently (measured on Intel's runtime): ``wait_stream`` is such a barrier."""
    device = stand_in()
    recording, waiting = device.Stream(), device.Stream()
    graph = sycl.CommandGraph()
    graph.begin_recording(recording.queue)
    waiting.wait_stream(recording)
    assert waiting.is_capturing()
    assert waiting.queue.recording_into is graph.recording_state


def test_a_stream_that_waits_for_an_ended_recording_joins_its_graph_while_it_exists():
    """The join holds while the graph exists, its recording ended or not (measured on
    Intel's runtime); once the graph's last handle is gone, the same wait is harmless."""
    device = stand_in()
    recorded, waiting, later = device.Stream(), device.Stream(), device.Stream()
    graph = sycl.CommandGraph()
    graph.begin_recording(recorded.queue)
    event = recorded.record_event()
    graph.end_recording()
    waiting.wait_event(event)
    assert waiting.is_capturing()
    graph.release()
    later.wait_event(event)
    assert not later.is_capturing() and not waiting.is_capturing()


def test_a_stream_that_waits_for_an_event_of_a_captured_xpugraph_joins_it_while_it_lives():
    """After a successful capture torch keeps only the executable graph, which holds the SYCL
    graph: a stream that waits for an event recorded during the capture joins the recording
    while the XPUGraph lives, and its work is never run (measured on Intel's runtime:
    scenario_executable_graph_keeps_its_recording_joinable)."""
    device = stand_in()
    captured_on, waiting = device.Stream(), device.Stream()
    graph = device.XPUGraph()
    with device.stream(captured_on):
        graph.capture_begin()
        event = captured_on.record_event()
        graph.capture_end()
    assert not captured_on.is_capturing()
    waiting.wait_event(event)
    assert waiting.is_capturing()
    graph.reset()
    assert not waiting.is_capturing()


def test_waiting_on_an_event_of_a_graph_destroyed_while_recording_returns():
    """``event.wait()`` throws for a node's event while its graph exists, and returns once the
    graph is gone (measured on Intel's runtime)."""
    device = stand_in()
    stream = device.Stream()
    graph = sycl.CommandGraph()
    graph.begin_recording(stream.queue)
    event = stream.record_event()
    with pytest.raises(sycl.SyclError, match="wait method cannot be used"):
        event.synchronize()
    graph.release()
    event.synchronize()


def test_a_recording_queue_that_depends_on_another_graphs_node_throws_sycls_text():
    """A queue recording into one graph, waiting for a node of another graph that exists:
    "Cannot submit to a recording queue with a dependency from a different graph." (measured
    on Intel's runtime); once that graph is gone, the dependency is an outside event."""
    device = stand_in()
    first, second = device.Stream(), device.Stream()
    first_graph, second_graph = sycl.CommandGraph(), sycl.CommandGraph()
    first_graph.begin_recording(first.queue)
    second_graph.begin_recording(second.queue)
    event = first.record_event()
    with pytest.raises(sycl.SyclError, match="dependency from a different graph"):
        second.wait_event(event)
    first_graph.release()
    with pytest.raises(sycl.SyclError, match=sycl.BARRIER_ON_OUTSIDE_EVENT):
        second.wait_event(event)


# -- recording modes (native recording's rules: tests/sycl_rules/test_native_recording.py) --


@pytest.mark.parametrize(
    "release, recording", [("2.13", None), ("2.14", "command-buffer"), ("2.14", None)]
)
def test_xpugraph_records_as_the_release_chooses(release, recording):
    device = StandInXpu(release_of(release), recording)
    graph = device.XPUGraph()
    graph.capture_begin()
    native = device.current_stream().queue.recording_into.native
    graph.capture_end()
    assert native is (release == "2.14" and recording is None)


def test_data_center_max_keeps_command_buffers_unless_native_recording_is_forced(monkeypatch):
    release = release_of("2.15")
    monkeypatch.delenv("SYCL_GRAPH_FORCE_NATIVE_RECORDING", raising=False)
    assert StandInXpu(release, data_center_max=True).recording == "command-buffer"
    assert StandInXpu(release).recording == "native"
    monkeypatch.setenv("SYCL_GRAPH_FORCE_NATIVE_RECORDING", "1")
    assert StandInXpu(release, data_center_max=True).recording == "native"


@pytest.mark.parametrize(
    "release, recording, error",
    [
        ("2.13", "native", "torch 2.13 records through command buffers only"),
        ("2.14", "level-zero", "recording must be one of 'command-buffer', 'native'"),
    ],
)
def test_on_cpu_refuses_a_recording_mode_the_release_has_not_and_changes_nothing(
    release, recording, error
):
    enabled = inductor_xpugraph.enabled_devices()
    with pytest.raises(ValueError, match=error):
        with sycl_rules.on_cpu(release, recording=recording):
            pass
    assert inductor_xpugraph.enabled_devices() == enabled


# -- the pool-id latch of torch 2.13 -------------------------------------------------------------


@pytest.mark.parametrize("release, latched", [("2.13", True), ("2.14", False), ("2.15", False)])
def test_a_capture_into_a_pool_whose_graphs_all_went_asserts_on_torch_2_13(release, latched):
    """Capture into pool P, drop every graph of P, capture into P again: torch 2.13's
    allocator kept P with no holds, and ``create_or_incref_pool`` asserts."""
    device = stand_in(release)
    pool = device.graph_pool_handle()
    first = device.XPUGraph()
    first.capture_begin(pool=pool)
    first.capture_end()
    del first
    again = device.XPUGraph()
    if latched:
        with pytest.raises(RuntimeError, match="use_count > 0 INTERNAL ASSERT"):
            again.capture_begin(pool=pool)
    else:
        again.capture_begin(pool=pool)
        again.capture_end()


def test_destroying_a_failed_xpugraph_returns_its_queue_to_executing():
    """``~XPUGraph`` destroys its SYCL graph, and a queue still recording into a graph whose
    last handle is gone executes again (measured on Intel's runtime)."""
    device = stand_in()
    stream = device.Stream()
    graph = device.XPUGraph()
    with device.stream(stream):
        graph.capture_begin()
        device.fail_next("end_recording", LEVEL_ZERO_ERROR)
        with pytest.raises(sycl.SyclError, match="DEVICE_LOST"):
            graph.capture_end()
    assert stream.is_capturing()
    del graph
    assert not stream.is_capturing()


def test_capture_begin_routes_the_device_allocator_into_the_pool():
    """XPUGraph::capture_begin: the caching allocator routes the capture's allocations into
    the pool, with a hold on it, until ``capture_end``."""
    device = stand_in()
    pool = device.graph_pool_handle()
    graph = device.XPUGraph()
    with device.stream(device.Stream()):
        graph.capture_begin(pool=pool)
        assert [routed for routed, _ in device.routing] == [pool]
        assert device.holds[pool] == 1
        graph.capture_end()
    assert device.routing == []


@pytest.mark.parametrize("release, routes", [("2.11", False), ("2.13", True), ("2.15", True)])
def test_capture_begin_routes_the_host_allocator_from_torch_2_13(release, routes):
    """From torch 2.13, XPUGraph::capture_begin routes the host (pinned memory) caching
    allocator into the pool too, with a filter that refers to the graph."""
    device = stand_in(release)
    graph = device.XPUGraph()
    with device.stream(device.Stream()):
        graph.capture_begin()
        assert bool(device.host_routing) is routes
        graph.capture_end()
    assert device.host_routing == []


@pytest.mark.parametrize("release", ["2.11", "2.13"])
def test_a_failed_capture_end_leaves_recording_routing_and_generator_as_they_were(release):
    """XPUGraph::capture_end ends the SYCL recording first and raises from there: the queue
    records, the allocators route into the pool and the generator stays in capture mode."""
    device = stand_in(release)
    stream = device.Stream()
    graph = device.XPUGraph()
    with device.stream(stream):
        graph.capture_begin()
        device.fail_next("end_recording", LEVEL_ZERO_ERROR)
        with pytest.raises(sycl.SyclError, match="DEVICE_LOST"):
            graph.capture_end()
    assert stream.is_capturing()
    assert [routed for routed, _ in device.routing] == [graph.pool()]
    assert bool(device.host_routing) is (release == "2.13")
    assert device.default_generators[0].state.capturing


def test_the_generator_leaves_capture_mode_only_at_a_successful_capture_end():
    """The default generator's state enters capture mode in ``capture_begin``
    (``capture_prologue``) and leaves it in ``capture_end``'s ``capture_epilogue``, reached
    only when the recording ended: not at a failed end, not when the graph is destroyed."""
    device = stand_in("2.11")
    generator = device.default_generators[0]
    stream = device.Stream()
    failed = device.XPUGraph()
    with device.stream(stream):
        failed.capture_begin()
        assert generator.state.capturing
        device.fail_next("end_recording", LEVEL_ZERO_ERROR)
        with pytest.raises(sycl.SyclError, match="DEVICE_LOST"):
            failed.capture_end()
    assert generator.state.capturing
    del failed
    assert generator.state.capturing
    succeeds = device.XPUGraph()
    with device.stream(stream):
        succeeds.capture_begin()
        succeeds.capture_end()
    assert not generator.state.capturing


def test_a_random_op_on_an_executing_queue_while_the_generator_captures_raises():
    """``XPUGeneratorState::increase``: an offset increment outside the capture that put the
    generator into capture mode raises."""
    device = stand_in()
    graph = device.XPUGraph()
    with device.stream(device.Stream()):
        graph.capture_begin()
    with SubmitToCurrentQueue(device):
        with pytest.raises(RuntimeError) as error:
            torch.rand(2)
    assert str(error.value) == OFFSET_OUTSIDE_CAPTURE


def _inverse():
    return torch.linalg.inv(torch.eye(3) * 2)


def _attention():
    q = torch.ones(1, 1, 2, 4)
    return torch.nn.functional.scaled_dot_product_attention(q, q, q)


@pytest.mark.parametrize(
    "release, op, refused",
    [
        ("2.11", _inverse, True),  # oneMKL: aten::linalg_inv_ex, on every release
        ("2.13", _inverse, True),
        ("2.15", _inverse, True),
        ("2.13", _attention, True),  # oneDNN's attention (the CPU's flash attention stands in)
        ("2.15", _attention, False),  # ... records on 2.15
    ],
    ids=["inv-2.11", "inv-2.13", "inv-2.15", "attention-2.13", "attention-2.15"],
)
def test_an_op_the_release_refuses_raises_sycls_error_in_a_live_capture(release, op, refused):
    """``releases``: an operator SYCL Graph refuses on the release raises SYCL's error when
    submitted while a capture records; any other runs (the capture's run)."""
    device = stand_in(release)
    stream = device.Stream()
    graph = device.XPUGraph()
    with device.stream(stream):
        graph.capture_begin()
    expected = op()
    with SubmitToCurrentQueue(device), device.stream(stream):
        if refused:
            with pytest.raises(sycl.SyclError) as error:
                op()
            assert str(error.value) == sycl.NODE_DEPENDS_ON_OUTSIDE_EVENT
        else:
            out = op()
    if not refused:  # compared outside: torch.equal waits on the host, which a capture refuses
        assert torch.equal(out, expected)


def queue_left_recording(device: StandInXpu):
    """A stream whose queue a failed ``capture_end`` left recording (no capture runs into
    it), and the graph that keeps it so."""
    stream = device.Stream()
    graph = device.XPUGraph()
    with device.stream(stream):
        graph.capture_begin()
        device.fail_next("end_recording", LEVEL_ZERO_ERROR)
        with pytest.raises(sycl.SyclError, match="DEVICE_LOST"):
            graph.capture_end()
    return stream, graph


def test_an_op_on_a_queue_left_recording_returns_memory_never_written():
    """Work submitted to a queue that records, and into which no capture runs, is a node of
    the graph: it does not run, and what it returns is never written."""
    device = stand_in()
    stream, graph = queue_left_recording(device)
    x = torch.ones(4)
    with SubmitToCurrentQueue(device), device.stream(stream):
        y = x + 1
    assert torch.isnan(y).all()
    assert device.dropped_work == 1


def test_an_in_place_op_on_a_queue_left_recording_leaves_its_target_unchanged():
    device = stand_in()
    stream, graph = queue_left_recording(device)
    x = torch.ones(4)
    with SubmitToCurrentQueue(device), device.stream(stream):
        x.add_(1)
    assert torch.equal(x, torch.ones(4))


def test_the_accelerator_graph_has_no_register_generator_state():
    """``torch.accelerator.Graph`` of torch 2.13-2.15 cannot register a ``torch.Generator``;
    the stand-in's raises where torch's has no such method."""
    backend = AcceleratorRulesBackend(0, stand_in("2.13"))
    assert not backend.graphs_register_generators
    with pytest.raises(RuntimeError, match="register_generator_state"):
        backend.new_graph().register_generator_state(torch.Generator())


# -- the xpu backend after a failed capture, under these rules ------------------------------------


@pytest.mark.parametrize("release", ["2.11", "2.13"])
def test_streams_taken_after_a_failed_capture_end_run_their_work(release):
    """xpu hands out the queue a failed capture left recording to whoever takes a stream 32
    streams later: the recovery must have made it execute again (by destroying the graph),
    for every one of the next 33 streams, the failed capture's queue among them."""
    device = stand_in(release)
    backend = XpuRulesBackend(0, device)
    failed_queue = backend.capture_stream.queue
    failure = fail_a_capture_end(backend, device)
    streams = [device.Stream() for _ in range(STREAMS_PER_POOL + 1)]
    assert any(stream.queue is failed_queue for stream in streams)
    x = torch.ones(4)
    for stream in streams:
        with SubmitToCurrentQueue(device), device.stream(stream):
            y = x + 1
        assert torch.equal(y, torch.full((4,), 2.0)), stream
    del failure


@pytest.mark.parametrize("release", ["2.11", "2.13"])
def test_the_device_synchronizes_after_a_failed_capture_end(release):
    """``torch.xpu.synchronize`` and ``empty_cache`` wait on every queue: they throw while
    the failed capture's queue records."""
    device = stand_in(release)
    backend = XpuRulesBackend(0, device)
    failure = fail_a_capture_end(backend, device)
    device.synchronize()
    device.empty_cache()
    del failure


@pytest.mark.parametrize("release", ["2.11", "2.13"])
def test_random_ops_work_after_a_failed_capture_end(release):
    """The failed ``capture_end`` left the default generator in capture mode: the recovery
    takes it out (2.11: an empty capture; 2.13: a fresh state, the device given up)."""
    device = stand_in(release)
    backend = XpuRulesBackend(0, device)
    failure = fail_a_capture_end(backend, device)
    assert not device.default_generators[0].state.capturing
    with SubmitToCurrentQueue(device):
        torch.rand(2)
    del failure


def test_captures_go_on_after_a_failed_capture_end_on_torch_2_11():
    """Without host routing (torch 2.11), destroying the failed graph undoes everything it
    left: the device keeps recording graphs, on the same capture stream."""
    device = stand_in("2.11")
    backend = XpuRulesBackend(0, device)
    capture_stream = backend.capture_stream
    failure = fail_a_capture_end(backend, device)
    assert backend.cannot_record is None
    assert backend.capture_stream is capture_stream
    graph, (out,) = backend.capture(add_one(), [torch.ones(4)], backend.new_pool(), PlaceNothing())
    assert torch.equal(out, torch.full((4,), 2.0))
    assert device.routing == [] and recording_queues(device) == []
    del failure


def test_a_failed_capture_end_stops_captures_on_torch_2_13_said_once(caplog, monkeypatch):
    """From torch 2.13 the host allocator keeps routing into the pool with a filter that
    refers to the destroyed graph, and no Python call ends it: captures stop on the device
    (``failure_leaves_host_routing``), with one warning, and no capture begins again (on an
    Intel GPU its host routing would read the destroyed graph's memory; the stand-in raises
    there instead, which the general fallback would hide). (Checked: with the stop removed
    from ``_recover_from_failed_capture``, the recovery's empty capture begins and this test
    fails.)"""
    device = stand_in("2.13")
    backend = XpuRulesBackend(0, device)
    pool = backend.new_pool()
    begun = []
    capture_begin = XPUGraph.capture_begin

    def counted_capture_begin(graph, pool=None):
        begun.append(pool)  # not the graph: destroying it is part of the recovery
        capture_begin(graph, pool=pool)

    monkeypatch.setattr(XPUGraph, "capture_begin", counted_capture_begin)
    device.fail_next("end_recording", LEVEL_ZERO_ERROR)
    with caplog.at_level(logging.WARNING, logger="inductor_xpugraph"):
        with pytest.raises(sycl.SyclError, match="DEVICE_LOST") as failure:
            backend.capture(add_one(), [torch.ones(4)], pool, PlaceNothing())
    assert len(begun) == 1, "a capture began after the failed one left host routing"
    assert backend.cannot_record == messages.HOST_ROUTING_LEFT
    warnings = [r for r in caplog.records if r.name == "inductor_xpugraph"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    del failure


def test_a_capture_end_that_fails_in_finalize_keeps_captures_on_torch_2_13():
    """XPUGraph's ``capture_end`` finalizes after it ended the recording, both routings and
    the generator's capture mode: a failure there leaves no host routing behind, so captures
    go on (only the device routing, still in place, tells that the host's is)."""
    device = stand_in("2.13")
    backend = XpuRulesBackend(0, device)
    pool = backend.new_pool()
    device.fail_next("finalize", LEVEL_ZERO_ERROR)
    with pytest.raises(sycl.SyclError, match="DEVICE_LOST"):
        backend.capture(add_one(), [torch.ones(4)], pool, PlaceNothing())
    assert backend.cannot_record is None
    assert device.host_routing == [] and device.routing == []
    assert not device.default_generators[0].state.capturing
    graph, outputs = backend.capture(add_one(), [torch.ones(4)], pool, PlaceNothing())
    assert recording_queues(device) == []


@pytest.mark.parametrize("release", ["2.11", "2.13"])
def test_the_callers_stream_never_joins_a_failed_recording(release, monkeypatch):
    """Note [Recovering from a failed capture], 3: the caller's stream must not wait on the
    capture stream while it records: it would join the recording and record every later op,
    never running it. Destroying the failed graph would end that join too, so the graph is
    held elsewhere here (as a debugger or a kept traceback may), and the recording outlives
    the recovery. (Checked: with ``on_capture_stream``'s ``stream_records`` guard removed, the
    caller's stream records at the end and this test fails.)"""
    device = stand_in(release)
    backend = XpuRulesBackend(0, device)
    held_elsewhere = []

    def held_xpugraph(keep_graph=False):
        held_elsewhere.append(XPUGraph(device))
        return held_elsewhere[-1]

    monkeypatch.setattr(device, "XPUGraph", held_xpugraph)
    failure = fail_a_capture_end(backend, device)
    assert recording_queues(device) == [held_elsewhere[-1].capture_stream.queue]
    assert not device.current_stream().is_capturing()
    assert not backend.capture_stream.is_capturing()  # replaced by one that executes
    del failure


@pytest.mark.parametrize("release", ["2.11", "2.13"])
def test_a_capture_begin_on_a_queue_another_graph_records_leaves_that_queue_alone(
    release, monkeypatch
):
    """Another capture (another thread's, on a stream that got the same queue 32 streams
    later) begins recording on the capture stream's queue between our wait and our
    ``capture_begin``, which throws SYCL's error. Nothing of ours records: the capture stream
    is replaced by one that executes, the routing is undone, the generator is out of capture
    mode, and the caller's stream did not join; the other graph's queue records into it
    alone until it ends."""
    device = stand_in(release)
    backend = XpuRulesBackend(0, device)
    pool = backend.new_pool()
    others = sycl.CommandGraph()

    class BegunElsewhere(XPUGraph):
        def capture_begin(self, pool=None):
            others.begin_recording(self.device.current_stream().queue)
            super().capture_begin(pool=pool)

    monkeypatch.setattr(device, "XPUGraph", lambda keep_graph=False: BegunElsewhere(device))
    taken = backend.capture_stream.queue
    with pytest.raises(sycl.SyclError) as failure:
        backend.capture(add_one(), [torch.ones(4)], pool, PlaceNothing())
    assert str(failure.value) == sycl.BEGIN_ON_RECORDING_QUEUE
    assert recording_queues(device) == [taken]
    assert taken.recording_into is others.recording_state
    assert not backend.capture_stream.is_capturing()
    assert not device.current_stream().is_capturing()
    assert device.routing == []
    assert not device.default_generators[0].state.capturing
    others.release()
    assert recording_queues(device) == []


def test_a_call_whose_capture_stream_another_graph_records_runs_un_graphed(fresh_runtime):
    """The capture stream's queue records for another graph when the call is recorded (a
    stream handed out 32 streams later is being captured by someone else): the call must
    still return its result, un-graphed, as every refused capture does."""
    with sycl_rules.on_cpu("2.11"):
        graphed = GraphedCallable(
            add_one(), "cpu", static_inputs=(), mutated_inputs=(), phase=Phase.INFERENCE, name="f"
        )
        graphed([torch.ones(4)])  # the warmup
        others = sycl.CommandGraph()
        others.begin_recording(tree_for("cpu").backend.capture_stream.queue)
        try:
            (out,) = graphed([torch.ones(4)])
            assert torch.equal(out, torch.full((4,), 2.0))
        finally:
            others.release()


@pytest.mark.parametrize("release", ["2.11", "2.13"])
def test_a_call_whose_capture_end_fails_returns_its_result(fresh_runtime, release):
    """The tree runs a call whose capture failed un-graphed, while it holds the capture's
    error: its run must not be recorded into the failed graph."""
    with sycl_rules.on_cpu(release) as device:
        graphed = GraphedCallable(
            add_one(), "cpu", static_inputs=(), mutated_inputs=(), phase=Phase.INFERENCE, name="f"
        )
        graphed([torch.ones(4)])  # the warmup
        device.fail_next("end_recording", LEVEL_ZERO_ERROR)
        (out,) = graphed([torch.ones(4)])
        assert stats.counters["capture_failures"] == 1
        assert torch.equal(out, torch.full((4,), 2.0))


def test_a_generator_input_is_refused_before_capture_on_accelerator_graphs():
    """``torch.accelerator.Graph`` cannot register a ``torch.Generator``: the backend says so
    before trying (``reason_not_to_capture``); ``XPUGraph`` can, and is not refused."""
    device = stand_in("2.13")
    args = [torch.ones(4), torch.Generator()]
    assert AcceleratorRulesBackend(0, device).reason_not_to_capture(args) == (
        messages.GENERATOR_NOT_REGISTERED
    )
    assert XpuRulesBackend(0, device).reason_not_to_capture(args) is None


def test_a_generator_taking_callable_runs_un_graphed_without_a_capture_on_accelerator_graphs(
    fresh_runtime,
):
    """Through the tree: the call that would record runs un-graphed, said as a skip, and no
    capture is tried (a failed one would make the tree start over)."""
    with sycl_rules.on_cpu("2.13", graph_api="accelerator"):
        graphed = GraphedCallable(
            add_one(), "cpu", static_inputs=(), mutated_inputs=(), phase=Phase.INFERENCE, name="g"
        )
        generator = torch.Generator()
        for _ in range(3):  # a warmup, the call that would record, one after
            (out,) = graphed([torch.ones(4), generator])
            assert torch.equal(out, torch.full((4,), 2.0))
    assert stats.counters["capture_failures"] == 0 and stats.counters["records"] == 0
    skips = [e for e in stats.events.values() if e.kind is stats.EventKind.SKIP]
    assert [(e.graph, e.reason) for e in skips] == [("g", messages.GENERATOR_NOT_REGISTERED)]


def spectrum():
    """``call(args) -> (|rfft(args[0])|,)``: oneMKL's FFT on xpu, which the 2.13 release
    refuses to record (``releases``)."""

    def call(args):
        return (torch.fft.rfft(args[0]).abs(),)

    return call


def fail_by_end_recording(device, graphed):
    device.fail_next("end_recording", LEVEL_ZERO_ERROR)
    graphed([torch.ones(4)])


def fail_by_a_refused_operator(device, graphed):
    (out,) = graphed([torch.ones(4)])
    torch.testing.assert_close(out, torch.fft.rfft(torch.ones(4)).abs())


@pytest.mark.parametrize("first_capture", [fail_by_end_recording, fail_by_a_refused_operator])
def test_a_warmup_that_raises_after_a_failed_capture_runs_the_call_un_graphed(
    fresh_runtime, first_capture
):
    """A library may keep an event of the failed graph on the capture stream (oneDNN keeps a
    stream's last event) and fail there later: a warmup that raises once a capture failed on
    the device (``failed_captures``), at ``capture_end`` or in the captured code (an operator
    the release refuses), runs the call on the caller's stream, un-graphed from then on
    (``GraphedCallable._run_eagerly``). (Checked: with only ``capture_begin``/``capture_end``
    failures counted, the refused operator's case raises into the caller.)"""
    release = "2.11" if first_capture is fail_by_end_recording else "2.13"
    with sycl_rules.on_cpu(release) as device:
        first = GraphedCallable(
            add_one() if first_capture is fail_by_end_recording else spectrum(),
            "cpu",
            static_inputs=(),
            mutated_inputs=(),
            phase=Phase.INFERENCE,
            name="a",
        )
        first([torch.ones(4)])  # the warmup
        first_capture(device, first)  # its capture fails; the device records on
        assert tree_for("cpu").backend.cannot_record is None
        caller = device.current_stream()
        add = add_one()

        def fails_off_the_callers_stream(args):
            if device.current_stream() != caller:
                raise RuntimeError("oneDNN: an event of the failed graph")
            return add(args)

        second = GraphedCallable(
            fails_off_the_callers_stream,
            "cpu",
            static_inputs=(),
            mutated_inputs=(),
            phase=Phase.INFERENCE,
            name="b",
        )
        for _ in range(2):  # the warmup that falls back, and a call after it
            (out,) = second([torch.ones(4)])
            assert torch.equal(out, torch.full((4,), 2.0))
    fallbacks = [e for e in stats.events.values() if e.kind is stats.EventKind.FALLBACK]
    assert [e.graph for e in fallbacks] == ["a", "b"]
    assert "warmup" in fallbacks[1].reason
