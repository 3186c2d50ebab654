"""Host waits and replays inside a capture, on the stand-in (``sycl_rules.on_cpu``).

What Intel GPU users meet on real cards: an operator that waits on the host inside a captured
region (``.item()`` in a kernel, a blocking copy) throws SYCL's wait text; a replay while a
capture is open fails in the generator's ``replay_prologue``. The stand-in raises both as torch's
XPU runtime would; the tree must give eager's values, name the operator that waited, and never
replay into another thread's capture nor wait on the device while a capture is open.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from support.stand_in_rule_sets import RULE_SET_IDS, RULE_SETS

import inductor_xpugraph
from inductor_xpugraph import sycl_rules
from inductor_xpugraph.sycl_rules import sycl
from inductor_xpugraph.sycl_rules.backend import XpuRulesBackend
from inductor_xpugraph.sycl_rules.submission import SubmitToCurrentQueue
from inductor_xpugraph.sycl_rules.torch_xpu import (
    OFFSET_OUTSIDE_CAPTURE,
    REPLAY_DURING_CAPTURE,
)
from inductor_xpugraph.trees.backends import device_graphs
from inductor_xpugraph.trees.backends.xpu_recording import COMMAND_BUFFER, NATIVE


@torch.library.custom_op("xpugraph_host_waits::scale_by_sum", mutates_args=())
def scale_by_sum(x: torch.Tensor) -> torch.Tensor:
    """A custom operator that synchronizes: it reads a sum back to the host (``.item()``)."""
    return x * x.sum().item()


@scale_by_sum.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class HeldAtCapture:
    """A custom operator whose second run (the capture, after one warmup) tells ``capturing``
    and holds the capture open until ``release`` (or 10 s)."""

    def __init__(self) -> None:
        self.capturing = threading.Event()
        self.release = threading.Event()
        self.runs = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        if self.runs == 2:
            self.capturing.set()
            self.release.wait(10)
        return x.clone()


_held = HeldAtCapture()


@torch.library.custom_op("xpugraph_host_waits::held", mutates_args=())
def held(x: torch.Tensor) -> torch.Tensor:
    return _held(x)


@held.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def waits_in_the_middle(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.xpugraph_host_waits.scale_by_sum(x.sin() + 1).cos()


def draws_random_numbers(x: torch.Tensor) -> torch.Tensor:
    return x + (torch.rand_like(x) < 2).float() - 1  # x, through the generator


def held_open(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.xpugraph_host_waits.held(x * 2) + 1


@pytest.fixture(autouse=True)
def fresh_runtime():
    global _held
    _held = HeldAtCapture()
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    with inductor_xpugraph.config.patch(warmup_runs=1):
        yield
    torch._dynamo.reset()
    inductor_xpugraph.reset()  # and the operators captures failed in


def fallback_reasons() -> list[str]:
    return [e.reason for e in inductor_xpugraph.report().events if "capture on" in e.reason]


# -- the stand-in's rules -------------------------------------------------------------------


@pytest.mark.parametrize("recording", [COMMAND_BUFFER, NATIVE])
def test_an_item_on_a_recording_queue_raises_sycls_wait_text(recording):
    with sycl_rules.on_cpu("2.14", recording=recording) as device:
        x = torch.ones(3)
        graph = device.XPUGraph()
        with device.stream(device.Stream()):
            graph.capture_begin()
            with pytest.raises(sycl.SyclError) as raised:
                x.sum().item()
            graph.capture_end()
    expected = sycl.NATIVE_WAIT if recording == NATIVE else sycl.WAIT_ON_NODE_EVENT
    assert str(raised.value) == expected


def test_a_listed_host_waiting_operator_raises_the_wait_text_not_the_dependency_text():
    with sycl_rules.on_cpu("2.13") as device:
        assert "aten::embedding_dense_backward" in device.host_waits
        graph = device.XPUGraph()
        with device.stream(device.Stream()):
            graph.capture_begin()
            with pytest.raises(sycl.SyclError, match="wait method cannot be used"):
                torch.ops.aten.embedding_dense_backward(
                    torch.ones(2, 4), torch.tensor([0, 1]), 3, -1, False
                )
            graph.capture_end()


def test_an_item_on_an_executing_queue_returns():
    with sycl_rules.on_cpu("2.13"):
        assert torch.ones(3).sum().item() == 3.0


@pytest.mark.parametrize("release", ["2.13", "2.15"])
def test_a_replay_while_the_current_stream_records_raises_torchs_text(release):
    with sycl_rules.on_cpu(release) as device:
        done = device.XPUGraph()
        with device.stream(device.Stream()):
            done.capture_begin()
            done.capture_end()
        open_capture = device.XPUGraph()
        with device.stream(device.Stream()):
            open_capture.capture_begin()
            with pytest.raises(RuntimeError) as raised:
                done.replay()
            open_capture.capture_end()
    assert str(raised.value) == REPLAY_DURING_CAPTURE


def test_a_replay_that_drew_random_numbers_raises_while_another_capture_is_open():
    with sycl_rules.on_cpu("2.13") as device:
        drew = device.XPUGraph()
        with device.stream(device.Stream()):
            drew.capture_begin()
            torch.rand(3)
            drew.capture_end()
        other = device.XPUGraph()
        capture_stream = device.Stream()
        with device.stream(capture_stream):
            other.capture_begin()
        with pytest.raises(RuntimeError, match=OFFSET_OUTSIDE_CAPTURE):
            drew.replay()  # from a stream that executes: the generator is capturing
        with device.stream(capture_stream):
            other.capture_end()
        drew.replay()


# -- the tree under them -------------------------------------------------------------------


@pytest.mark.parametrize("release, recording", RULE_SETS, ids=RULE_SET_IDS)
def test_a_custom_operator_that_waits_on_the_host_gives_eager_values_and_is_named(
    release, recording
):
    x = torch.randn(8)
    with sycl_rules.on_cpu(release, recording=recording):
        compiled = torch.compile(waits_in_the_middle, mode="reduce-overhead")
        outputs = [compiled(x).clone() for _ in range(4)]
    for out in outputs:
        torch.testing.assert_close(out, waits_in_the_middle(x))
    assert inductor_xpugraph.stats()["capture_failures"] == 1
    (reason,) = fallback_reasons()
    assert "It failed in xpugraph_host_waits::scale_by_sum" in reason
    assert "never_capture_ops = ('xpugraph_host_waits::scale_by_sum',)" in reason
    assert "graphs compiled from now on in this process partition it out" in reason


def test_the_named_operator_in_never_capture_ops_leaves_no_capture_to_fail():
    x = torch.randn(8)
    with inductor_xpugraph.config.patch(never_capture_ops=("xpugraph_host_waits::scale_by_sum",)):
        with sycl_rules.on_cpu("2.13"):
            compiled = torch.compile(waits_in_the_middle, mode="reduce-overhead")
            for _ in range(3):
                torch.testing.assert_close(compiled(x), waits_in_the_middle(x))
    assert inductor_xpugraph.stats()["capture_failures"] == 0


def run_during_a_capture(device, in_other_thread, before=None, check=True) -> list[BaseException]:
    """Capture ``held_open`` in this thread and, while its capture is held open, run
    ``in_other_thread()`` in a second thread (with the stand-in's dispatch mode, which is
    per thread), then let the capture end. ``before()`` runs in the second thread before this
    thread's first call. Returns what the second thread raised. ``check``: compare this
    thread's outputs with eager's (not after a ``reset()``, which drops them)."""
    errors: list[BaseException] = []
    ready = threading.Event()
    x = torch.ones(4)

    def other() -> None:
        try:
            with SubmitToCurrentQueue(device):
                if before is not None:
                    before()
                ready.set()
                _held.capturing.wait(10)
                threading.Timer(0.2, _held.release.set).start()
                in_other_thread()
        except BaseException as error:  # noqa: BLE001 (handed to the test)
            errors.append(error)
            ready.set()
            _held.release.set()

    capturing = torch.compile(held_open, mode="reduce-overhead")
    thread = threading.Thread(target=other)
    thread.start()
    ready.wait(30)
    for _ in range(2):  # a warmup, then the capture the other thread runs during
        out = capturing(x)
        if check:
            torch.testing.assert_close(out, x * 2 + 1)
    thread.join(30)
    torch.testing.assert_close(capturing(x), x * 2 + 1)
    return errors


def test_a_replay_in_another_thread_waits_for_an_open_capture():
    x = torch.ones(4)
    with sycl_rules.on_cpu("2.13") as device:
        compiled = torch.compile(draws_random_numbers, mode="reduce-overhead")
        replayed: list[torch.Tensor] = []

        def call() -> None:
            replayed.append(compiled(x).clone())

        # The other thread's graph is recorded (warmup, record, replay) before the capture.
        errors = run_during_a_capture(device, call, before=lambda: [call() for _ in range(3)])
    assert errors == []
    for out in replayed:
        torch.testing.assert_close(out, x)
    assert inductor_xpugraph.stats()["replays"] >= 2


def test_a_reset_in_another_thread_during_a_capture_waits_on_nothing():
    with sycl_rules.on_cpu("2.13") as device:
        errors = run_during_a_capture(device, inductor_xpugraph.reset, check=False)
    assert errors == []


def test_a_first_call_in_another_thread_during_a_capture_warms_up_and_records():
    x = torch.ones(4)
    with sycl_rules.on_cpu("2.13") as device:
        compiled = torch.compile(draws_random_numbers, mode="reduce-overhead")
        compiled(x)
        errors = run_during_a_capture(
            device, lambda: [torch.testing.assert_close(compiled(x), x) for _ in range(3)]
        )
    assert errors == []
    assert inductor_xpugraph.stats()["capture_failures"] == 0


def test_a_compiled_call_inside_a_users_capture_runs_in_it_without_replaying():
    x = torch.ones(4)
    with sycl_rules.on_cpu("2.13") as device:
        compiled = torch.compile(draws_random_numbers, mode="reduce-overhead")
        for _ in range(3):
            compiled(x)
        replays = inductor_xpugraph.stats()["replays"]
        users = device.XPUGraph()
        with device.stream(device.Stream()):
            users.capture_begin()
            inside = compiled(x)
            users.capture_end()
        users.replay()
        torch.testing.assert_close(inside, x)
    assert inductor_xpugraph.stats()["replays"] == replays


def test_later_compiles_leave_out_the_operator_a_capture_failed_in():
    with sycl_rules.on_cpu("2.13"):
        compiled = torch.compile(waits_in_the_middle, mode="reduce-overhead", dynamic=False)
        for _ in range(3):
            compiled(torch.randn(8))
        for _ in range(3):  # a new shape: compiled again, without trying to capture the op
            y = torch.randn(16)
            torch.testing.assert_close(compiled(y), waits_in_the_middle(y))
    assert inductor_xpugraph.stats()["capture_failures"] == 1
    said = " ".join(e.reason for e in inductor_xpugraph.report().events)
    assert (
        "xpugraph_host_waits::scale_by_sum is not captured on cpu: a capture failed in it" in said
    )


def test_reset_forgets_the_operators_captures_failed_in():
    with sycl_rules.on_cpu("2.13"):
        compiled = torch.compile(waits_in_the_middle, mode="reduce-overhead", dynamic=False)
        for _ in range(3):
            compiled(torch.randn(8))
        inductor_xpugraph.reset()
        torch._dynamo.reset()
        for _ in range(3):
            compiled(torch.randn(8))
    assert inductor_xpugraph.stats()["capture_failures"] == 1  # tried, and failed, again


def test_a_pool_dropped_while_one_of_our_captures_runs_empties_no_cache(monkeypatch):
    with sycl_rules.on_cpu("2.13") as device:
        backend = XpuRulesBackend(0, device)
        emptied = []
        monkeypatch.setattr(device, "empty_cache", lambda: emptied.append(1))
        with device_graphs._CAPTURES.running(backend.device):  # a capture under way
            backend.release_dropped_pools()
        assert emptied == []
        backend.release_dropped_pools()
        assert emptied == [1]


def test_a_pool_dropped_during_a_users_capture_leaves_that_capture_recording():
    with sycl_rules.on_cpu("2.13") as device:
        backend = XpuRulesBackend(0, device)
        users = device.XPUGraph()
        stream = device.Stream()
        with device.stream(stream):
            users.capture_begin()
        backend.release_dropped_pools()  # the device's empty_cache refuses: nothing is freed
        assert stream.queue.state == "recording"
        with device.stream(stream):
            users.capture_end()
        users.replay()


def test_a_replay_waits_for_another_threads_capture_no_longer_than_the_limit(monkeypatch, caplog):
    monkeypatch.setattr(device_graphs, "OTHER_CAPTURE_WAIT_S", 0.05)
    started, release = threading.Event(), threading.Event()

    def capture() -> None:  # a capture whose code waits for the other thread
        with device_graphs._CAPTURES.running("cpu:7"):
            started.set()
            release.wait(10)

    thread = threading.Thread(target=capture)
    thread.start()
    started.wait(10)
    begin = time.perf_counter()
    device_graphs._CAPTURES.wait_for_other_threads("cpu:7")
    waited = time.perf_counter() - begin
    release.set()
    thread.join(10)
    assert 0.04 <= waited < 5
    assert "waited 0.05 s for another thread's capture" in caplog.text
