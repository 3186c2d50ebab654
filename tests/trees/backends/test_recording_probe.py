"""How XPUGraph records on a device, found from the running torch (``xpu_recording.decide``):
the setting, else the build, else a probe on a throw-away capture (``recording_probe``), else
the assumption for the release. The probe runs against the stand-in of ``sycl_rules`` in both
recording modes, and against device modules that misbehave."""

import statistics
import time

import pytest
from support.recording_probes import fresh_probes  # noqa: F401 (autouse)

from inductor_xpugraph.sycl_rules import sycl
from inductor_xpugraph.sycl_rules.releases import RELEASES
from inductor_xpugraph.sycl_rules.torch_xpu import StandInXpu
from inductor_xpugraph.trees.backends import device_recording as device_recordings
from inductor_xpugraph.trees.backends import xpu_recording
from inductor_xpugraph.trees.backends.device_graphs import (
    _CAPTURES,
    _DEVICES_THAT_CANNOT_RECORD,
)
from inductor_xpugraph.trees.backends.device_recording import device_recording
from inductor_xpugraph.trees.backends.recording_probe import (
    ProbeResult,
    classify_wait_error,
    probe_recording_mode,
    recording_probed,
)
from inductor_xpugraph.trees.backends.xpu_recording import (
    ASSUMED,
    COMMAND_BUFFER,
    FORCE_NATIVE,
    FROM_BUILD,
    FROM_SETTING,
    NATIVE,
    PROBED,
    decide,
)


def stand_in(version: str, recording: str | None = None) -> StandInXpu:
    return StandInXpu(RELEASES[version], recording)


def left_as_it_was(device: StandInXpu) -> None:
    """Nothing of the probe stays on the stand-in: no queue records, no routing into a pool,
    the generator out of capture mode, a new capture records."""
    assert [q.name for q in device.queues() if q.state == "recording"] == []
    assert device.routing == [] and device.host_routing == []
    assert not device.default_generators[0].state.capturing
    assert device not in _DEVICES_THAT_CANNOT_RECORD
    graph = device.XPUGraph()
    graph.capture_begin(pool=device.graph_pool_handle())
    graph.capture_end()
    graph.reset()


MODES = [(version, mode) for version in ("2.14", "2.15") for mode in (COMMAND_BUFFER, NATIVE)]


@pytest.mark.parametrize(("version", "mode"), MODES)
def test_the_probe_finds_the_stand_in_s_mode(version, mode):
    device = stand_in(version, mode)
    found = probe_recording_mode(device, captures_key="cpu:0")
    assert (found.mode, found.ran) == (mode, True), found.why
    left_as_it_was(device)


@pytest.mark.parametrize(("version", "mode"), MODES)
def test_auto_is_probed_on_torch_2_14_and_later(version, mode):
    decision = device_recording(
        RELEASES[version].number,
        module=stand_in(version, mode),
        setting="auto",
        captures_key="cpu:0",
    )
    assert (decision.mode, decision.found) == (mode, PROBED)
    assert "host wait inside a capture" in decision.why
    assert " ms)" in decision.why


def test_torch_2_13_is_settled_by_the_build_without_a_probe():
    def no_probe():
        pytest.fail("the probe ran although the build settles the mode")

    decision = decide((2, 13), probe=no_probe)
    assert decision == (
        COMMAND_BUFFER,
        FROM_BUILD,
        "torch 2.13's XPUGraph records through SYCL Graph's command buffers",
    )
    on_the_stand_in = device_recording((2, 13), module=stand_in("2.13"), setting="auto")
    assert (on_the_stand_in.mode, on_the_stand_in.found) == (COMMAND_BUFFER, FROM_BUILD)


def test_the_build_settles_it_where_it_can():
    def no_probe():
        pytest.fail("the probe ran although the build settles the mode")

    forced = decide((2, 14), environ={FORCE_NATIVE: "1"}, data_center_max=True, probe=no_probe)
    assert (forced.mode, forced.found) == (NATIVE, FROM_BUILD)
    old_compiler = decide((2, 15), sycl_compiler=20250200, probe=no_probe)
    assert (old_compiler.mode, old_compiler.found) == (COMMAND_BUFFER, FROM_BUILD)
    assert "20250200" in old_compiler.why
    new_compiler = decide((2, 15), sycl_compiler=20260100, probe=lambda: ProbeResult(None, "?"))
    assert new_compiler.found == ASSUMED


def test_the_setting_wins_over_everything():
    def no_probe():
        pytest.fail("the probe ran although the setting decides")

    decision = decide((2, 14), setting=COMMAND_BUFFER, environ={FORCE_NATIVE: "1"}, probe=no_probe)
    assert decision == (
        COMMAND_BUFFER,
        FROM_SETTING,
        "inductor_xpugraph.config.xpu_recording = 'command-buffer'",
    )
    on_the_stand_in = device_recording(
        (2, 15), module=stand_in("2.15", COMMAND_BUFFER), setting=NATIVE
    )
    assert (on_the_stand_in.mode, on_the_stand_in.found) == (NATIVE, FROM_SETTING)


def test_without_a_device_the_release_decides():
    """This process has no xpu device: nothing is probed, the mode is the release's."""
    decision = device_recording((2, 14), setting="auto")
    assert (decision.mode, decision.found) == (NATIVE, ASSUMED)
    assert "the probe could not tell: no xpu device 0 in this process" in decision.why
    assert device_recordings.decisions() == {}  # no device of this process decided


def misbehaving(where: str, error: BaseException | None) -> StandInXpu:
    """A stand-in whose ``where`` call raises ``error`` (with ``error`` None: whose host wait
    inside a capture does not raise)."""
    device = stand_in("2.15", NATIVE)
    make_stream, make_graph = device.Stream, device.XPUGraph

    def fail(*args, **kwargs):
        if error is not None:
            raise error

    def stream(**kwargs):
        made = make_stream(**kwargs)
        if where == "Stream":
            fail()
        if where == "synchronize":
            made.synchronize = fail
        return made

    def graph():
        made = make_graph()
        if where == "capture_begin":
            made.capture_begin = fail
        return made

    device.Stream, device.XPUGraph = stream, graph
    return device


@pytest.mark.parametrize(
    ("where", "error", "said"),
    [
        ("Stream", ValueError("no streams today"), "the probe raised ValueError: no streams today"),
        (
            "capture_begin",
            RuntimeError("no graphs"),
            "capture_begin raised RuntimeError: no graphs",
        ),
        (
            "synchronize",
            RuntimeError("c10: synchronize is not allowed while capturing"),
            "an error neither mode is known to give: RuntimeError: c10: synchronize",
        ),
        ("synchronize", None, "did not raise"),
    ],
)
def test_a_probe_that_meets_something_unexpected_falls_back_and_says_why(where, error, said):
    device = misbehaving(where, error)
    found = probe_recording_mode(device, captures_key="cpu:0")
    assert found.mode is None and said in found.why, found.why
    decision = device_recording((2, 15), module=device, setting="auto", captures_key="cpu:0")
    assert (decision.mode, decision.found) == (NATIVE, ASSUMED)
    assert f"the probe could not tell: {found.why}" in decision.why
    assert [q.name for q in device.queues() if q.state == "recording"] == []
    assert device.routing == []
    assert not device.default_generators[0].state.capturing


def test_a_probe_whose_capture_does_not_end_recovers_as_a_failed_capture_does():
    """``capture_end`` fails after the recording ended (at finalize): the routing and the
    generator's capture mode ended, the device still records; the mode was found."""
    device = stand_in("2.14", COMMAND_BUFFER)
    device.fail_next("finalize", "level_zero backend failed with error: 20 (UR_RESULT_ERROR)")
    found = probe_recording_mode(device, captures_key="cpu:0")
    assert found.mode == COMMAND_BUFFER
    assert "then the probe's capture_end raised SyclError" in found.why
    left_as_it_was(device)


def test_a_probe_capture_that_leaves_the_host_routing_stops_the_device_s_graphs(caplog):
    """``capture_end`` fails while ending the recording (torch >= 2.13): the host allocator
    routes into the pool for good, as after any capture that failed so: the device is marked,
    as the package's own recovery marks it, and the generator leaves capture mode."""
    device = stand_in("2.14", NATIVE)
    device.fail_next("end_recording", "level_zero backend failed with error: 20 (UR_RESULT_ERROR)")
    found = probe_recording_mode(device, captures_key="cpu:0")
    assert found.mode == NATIVE
    assert "host (pinned memory) allocator" in _DEVICES_THAT_CANNOT_RECORD[device]["cpu:0"]
    assert "cpu:0 cannot record graphs in this process" in caplog.text
    assert not device.default_generators[0].state.capturing
    assert [q.name for q in device.queues() if q.state == "recording"] == []
    again = probe_recording_mode(device, captures_key="cpu:0")  # no capture on it any more
    assert again.mode is None
    assert again.why.startswith("no graph records on cpu:0 in this process: a failed capture")


def test_no_probe_while_a_capture_is_open():
    device = stand_in("2.15", NATIVE)
    graph = device.XPUGraph()
    graph.capture_begin(pool=device.graph_pool_handle())  # on the current stream
    try:
        found = recording_probed(device, captures_key="cpu:0")
        assert (found.mode, found.ran) == (None, False)
        assert found.why == "the current stream is being captured"
    finally:
        graph.capture_end()
        graph.reset()
    with _CAPTURES.running("cpu:0"):  # one of the package's captures, in another thread
        found = recording_probed(device, captures_key="cpu:0")
        assert (found.mode, found.ran) == (None, False)
        assert found.why == "a capture of this package is under way on cpu:0"
    assert recording_probed(device, captures_key="cpu:0").mode == NATIVE  # not kept: tried again


def test_the_probe_runs_once_per_process_and_device(monkeypatch):
    device = stand_in("2.15", COMMAND_BUFFER)
    graphs = []
    make = device.XPUGraph
    monkeypatch.setattr(device, "XPUGraph", lambda: graphs.append(1) or make())
    first = recording_probed(device, captures_key="cpu:0")
    assert recording_probed(device, captures_key="cpu:0") is first
    assert device_recording((2, 15), module=device, setting="auto").mode == COMMAND_BUFFER
    assert len(graphs) == 1
    assert recording_probed(stand_in("2.15", NATIVE), captures_key="cpu:0").mode == NATIVE


def test_the_probe_takes_a_side_stream_that_does_not_record_and_leaves_the_current_one():
    device = stand_in("2.14", NATIVE)
    current = device.current_stream()
    for queue in device.pools["low"]:  # the low-priority pool is busy recording but one queue
        if queue is not device.pools["low"][-1]:
            sycl.CommandGraph(native=True).begin_recording(queue)
    found = probe_recording_mode(device, captures_key="cpu:0")
    assert found.mode == NATIVE
    assert device.current_stream() is current


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        (
            "wait cannot be called for a queue which is recording to a command graph.",
            COMMAND_BUFFER,
        ),
        (
            "level_zero backend failed with error: 2147483646 (UR_RESULT_ERROR_UNKNOWN)",
            NATIVE,
        ),
        ("UR_RESULT_ERROR_GRAPH_CAPTURE_UNSUPPORTED", NATIVE),
        ("Graph nodes cannot depend on events from outside the graph.", None),
        ("", None),
    ],
)
def test_the_wait_s_error_says_the_mode(text, mode):
    assert classify_wait_error(RuntimeError(text))[0] == mode
    assert classify_wait_error(None)[0] is None


def test_the_probe_is_quick():
    """Well under 50 ms on the stand-in (printed; asserted generously, on the median)."""
    times = []
    for version, mode in MODES:
        for _ in range(10):
            device = stand_in(version, mode)
            start = time.perf_counter()
            probe_recording_mode(device, captures_key="cpu:0")
            times.append(time.perf_counter() - start)
    print(
        f"recording probe on the stand-in: median {statistics.median(times) * 1e3:.2f} ms, "
        f"max {max(times) * 1e3:.2f} ms over {len(times)}"
    )
    assert statistics.median(times) < 0.05


def test_a_compile_asks_for_the_mode_only_where_the_list_depends_on_it(monkeypatch):
    """The stand-in's list does not depend on a recording mode: nothing is decided for it;
    xpu's does (flash attention is listed under command buffers only)."""
    from inductor_xpugraph import sycl_rules
    from inductor_xpugraph.trees.backends import unrecordable_ops

    asked = []

    def decided(release):
        asked.append(release)
        return xpu_recording.Decision(COMMAND_BUFFER, FROM_SETTING, "a test")

    monkeypatch.setattr(unrecordable_ops, "device_recording", decided)
    with sycl_rules.on_cpu("2.14", recording=NATIVE):
        assert unrecordable_ops.listed_ops("cpu")
    assert asked == []
    assert "aten::_scaled_dot_product_flash_attention" in unrecordable_ops.listed_ops(
        "xpu", (2, 14)
    )
    assert asked == [(2, 14)]
