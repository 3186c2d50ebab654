"""The doctor's device probe: a graph of a matmul, attention and a random op captured and
replayed through a backend, each listed operator tried, all in a child process; and what the
doctor makes of each outcome.

Most tests run the probe in this process (``_probe.probe_device``) on the CPU emulator, or on a
scripted backend over it that fails the way a device does; a few run the child process, whose
start-up (importing torch and this package) takes seconds.
"""

import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import inductor_xpugraph
from inductor_xpugraph import _probe, _probe_report
from inductor_xpugraph.doctor import Status
from inductor_xpugraph.trees.backends import unrecordable_ops
from inductor_xpugraph.trees.backends.cpu_emulation import CpuEmulationBackend

# What SYCL Graph says when a capture meets fused attention (intel/torch-xpu-ops#3142).
REFUSAL = (
    "The sycl_ext_oneapi_work_group_scratch_memory feature is not yet available for use with "
    "SYCL Graph extension"
)
CPU_ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"


class _Refuse(TorchDispatchMode):
    """Raises the device's refusal when an operator whose name contains ``pattern`` runs."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = pattern

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.pattern in func._schema.name:
            raise RuntimeError(f"{REFUSAL}\n(a second line the doctor leaves out)")
        return func(*args, **(kwargs or {}))


class RefusesEverything(CpuEmulationBackend):
    """A device whose captures fail on every operator (the emulator's warmups and replays
    are untouched)."""

    refused = ""

    def capture(self, fn, args, pool, place_inputs):
        with _Refuse(self.refused):
            return super().capture(fn, args, pool, place_inputs)


class RefusesAttention(RefusesEverything):
    refused = "scaled_dot_product"


class _ReplaysWrong:
    def __init__(self, graph, outputs):
        self.graph, self.outputs = graph, outputs

    def replay(self):
        self.graph.replay()
        self.outputs[0].add_(1.0)


class ReplaysWrong(CpuEmulationBackend):
    """A device whose replays write a wrong first output."""

    def capture(self, fn, args, pool, place_inputs):
        graph, outputs = super().capture(fn, args, pool, place_inputs)
        return _ReplaysWrong(graph, outputs), outputs


class _ReplaysNothing:
    def replay(self):
        pass


class RepeatsRandomValues(CpuEmulationBackend):
    """A device whose replays leave the capture's values: random ops draw once."""

    def capture(self, fn, args, pool, place_inputs):
        _, outputs = super().capture(fn, args, pool, place_inputs)
        return _ReplaysNothing(), outputs


def probe(backend_class=CpuEmulationBackend):
    """The doctor's findings of the probe on the emulator with ``backend_class``."""
    result = _probe.probe_device("cpu", lambda: backend_class(0))
    return _probe_report.probe_findings("cpu", _probe_report.ChildRun(result))


def lines(findings):
    return "\n".join(finding.line() for finding in findings)


@pytest.fixture
def listed(monkeypatch):
    """``listed(op, ...)``: the emulator's do-not-capture list is these operators."""

    def set_list(*ops):
        monkeypatch.setitem(unrecordable_ops.UNRECORDABLE_OPS, "cpu", dict.fromkeys(ops, "why"))

    return set_list


def test_the_probe_on_the_emulator_reports_ok():
    findings = probe()
    assert [(f.check, f.status) for f in findings] == [
        ("graphs (cpu)", Status.OK),
        ("do-not-capture list (cpu)", Status.OK),
    ], lines(findings)
    assert "results match un-graphed ones, random values fresh at each replay" in lines(findings)
    assert CPU_ATTENTION in findings[0].detail


def test_a_device_that_records_nothing_warns_in_its_own_words_that_graphs_run_ungraphed():
    (finding, _) = probe(RefusesEverything)
    assert finding.status is Status.WARN
    assert finding.detail == f"cannot record a graph: RuntimeError: {REFUSAL}"
    assert finding.advice == _probe_report.NOTHING_RECORDS
    assert "reduce-overhead gives no speedup here, results stay correct" in finding.advice


def test_attention_that_does_not_record_warns_that_graphs_with_attention_run_ungraphed():
    (finding, _) = probe(RefusesAttention)
    assert finding.status is Status.WARN
    assert finding.detail == f"attention does not record: RuntimeError: {REFUSAL}"
    assert finding.advice.startswith("graphs that contain attention will run un-graphed")
    assert f"INDUCTOR_XPUGRAPH_NEVER_CAPTURE_OPS={CPU_ATTENTION}" in finding.advice


def test_attention_on_the_do_not_capture_list_is_said_to_be_partitioned_out():
    with inductor_xpugraph.config.patch(never_capture_ops=(CPU_ATTENTION,)):
        (finding, _) = probe(RefusesAttention)
    assert finding.status is Status.WARN
    assert "is on the do-not-capture list here, so Inductor partitions it out" in finding.advice


def test_replays_that_differ_from_eager_fail():
    (finding, _) = probe(ReplaysWrong)
    assert finding.status is Status.FAIL
    assert finding.detail.startswith("replayed results differ from un-graphed ones: matmul")


def test_random_values_that_repeat_at_each_replay_fail():
    (finding, _) = probe(RepeatsRandomValues)
    assert finding.status is Status.FAIL
    assert finding.detail == "random values are the same at every replay"


def test_a_generator_left_in_capture_mode_fails():
    words = "RuntimeError: Offset increment outside graph capture encountered unexpectedly."
    result = _probe.probe_device("cpu", lambda: CpuEmulationBackend(0))
    result.generator_after = words
    (finding,) = _probe_report.graph_findings("cpu", result)
    assert finding.status is Status.FAIL
    assert finding.detail == f"a random op raises un-graphed after the captures: {words}"


def test_a_listed_op_that_records_is_reported_with_how_to_take_it_off(listed):
    listed(CPU_ATTENTION)
    (_, finding) = probe()
    assert finding.status is Status.WARN
    assert finding.detail == f"{CPU_ATTENTION} records here, yet graphs are split around it"
    assert f"INDUCTOR_XPUGRAPH_ALLOW_CAPTURE_OPS={CPU_ATTENTION} or " in finding.advice
    assert f"inductor_xpugraph.config.allow_capture_ops = ('{CPU_ATTENTION}',)" in finding.advice


def test_the_take_it_off_instruction_keeps_the_operators_already_allowed(listed):
    listed(CPU_ATTENTION)
    with inductor_xpugraph.config.patch(allow_capture_ops=("mylib::op",)):
        (_, finding) = probe()
    assert f"ALLOW_CAPTURE_OPS=mylib::op,{CPU_ATTENTION} or" in finding.advice


def test_a_listed_op_already_allowed_that_records_is_ok(listed):
    listed(CPU_ATTENTION)
    with inductor_xpugraph.config.patch(allow_capture_ops=(CPU_ATTENTION,)):
        (_, finding) = probe()
    assert finding.status is Status.OK
    assert "taken off the list by config.allow_capture_ops" in finding.detail


def test_a_listed_op_that_does_not_record_stays_on_the_list(listed):
    listed(CPU_ATTENTION)
    findings = probe(RefusesAttention)
    assert findings[-1].status is Status.OK
    assert findings[-1].detail == (
        f"{CPU_ATTENTION} does not record here (RuntimeError: {REFUSAL}): stays on the list, "
        "graphs are split around it"
    )


def test_an_allowed_op_that_does_not_record_warns_to_put_it_back(listed):
    listed(CPU_ATTENTION)
    with inductor_xpugraph.config.patch(allow_capture_ops=(CPU_ATTENTION,)):
        findings = probe(RefusesAttention)
    assert findings[-1].status is Status.WARN
    assert "take it out of INDUCTOR_XPUGRAPH_ALLOW_CAPTURE_OPS" in findings[-1].advice


def test_listed_collectives_are_not_tried_for_want_of_a_process_group(listed):
    listed("_c10d_functional::all_reduce", "_c10d_functional::wait_tensor")
    (_, finding) = probe()
    assert finding.status is Status.OK
    assert finding.detail == (
        "_c10d_functional::{all_reduce, wait_tensor}: not tried here: needs a process group; "
        "stays on the list"
    )


def test_a_listed_op_without_sample_inputs_is_not_tried(listed):
    listed("mylib::custom_kernel")
    (_, finding) = probe()
    assert finding.detail == (
        "mylib::custom_kernel: not tried here: doctor has no sample inputs for it; stays on the "
        "list"
    )


def test_a_listed_op_whose_sample_runs_another_kernel_here_is_not_tried(listed):
    listed("aten::_scaled_dot_product_flash_attention")  # the cuda/xpu kernel, not the cpu one
    (_, finding) = probe()
    assert "not tried here: F.scaled_dot_product_attention with the FLASH_ATTENTION kernel " in (
        finding.detail
    )
    assert f"runs {CPU_ATTENTION} here, not it" in finding.detail


# -- the child process ------------------------------------------------------------------------


def child_result(device_type="cpu", backend=None, env=None, timeout=120.0):
    return _probe_report.start(device_type, backend, env).result(timeout)


@pytest.fixture
def child_runs(monkeypatch):
    """``child_runs(code)``: the probe's child runs this Python code instead."""

    def replace(code: str):
        command = [sys.executable, "-c", code]
        monkeypatch.setattr(_probe_report, "child_command", lambda *args: command)

    return replace


@pytest.mark.slow
def test_a_capture_failure_in_the_child_is_a_warn_in_the_devices_words():
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__)}
    run = child_result(backend="test_doctor_probe:RefusesAttention", env=env)
    assert run.probe is not None, run
    (finding, _) = _probe_report.probe_findings("cpu", run)
    assert finding.status is Status.WARN
    assert finding.detail == f"attention does not record: RuntimeError: {REFUSAL}"


@pytest.mark.slow
def test_a_child_that_cannot_import_the_package_fails_naming_the_setting():
    run = child_result(env={**os.environ, "INDUCTOR_XPUGRAPH_WARMUP_RUNS": "0"})
    (finding,) = _probe_report.probe_findings("cpu", run)
    assert finding.status is Status.FAIL
    assert "cannot import inductor_xpugraph: ValueError: INDUCTOR_XPUGRAPH_WARMUP_RUNS='0'" in (
        finding.detail
    )


def test_a_probe_that_does_not_finish_in_time_warns_with_its_last_step(child_runs):
    child_runs(
        "import time\n"
        f"print({_probe.LINE_PREFIX!r} + 'stage capturing the graph', flush=True)\n"
        "time.sleep(60)\n"
    )
    (finding,) = _probe_report.probe_findings("cpu", child_result(timeout=1.5))
    assert finding.status is Status.WARN
    assert finding.detail == (
        "the probe did not finish within 1.5 s (last step: capturing the graph)"
    )
    assert "--probe-timeout" in finding.advice


def test_a_probe_process_that_dies_fails_naming_the_signal_and_the_step(child_runs):
    child_runs(
        "import os, signal\n"
        f"print({_probe.LINE_PREFIX!r} + 'stage replaying the graph', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    (finding,) = _probe_report.probe_findings("cpu", child_result())
    assert finding.status is Status.FAIL
    assert (
        finding.detail == "the probe's process died (killed by SIGKILL) while replaying the graph"
    )


def test_a_probe_process_that_cannot_start_warns(monkeypatch):
    missing = ["/nonexistent/python-of-the-probe"]
    monkeypatch.setattr(_probe_report, "child_command", lambda *args: missing)
    (finding,) = _probe_report.probe_findings("cpu", child_result())
    assert finding.status is Status.WARN
    assert finding.detail.startswith("could not start the probe's process: FileNotFoundError")


def test_bad_settings_are_left_out_of_the_childs_environment(monkeypatch):
    environments = []
    monkeypatch.setattr(
        _probe_report, "start", lambda device, env: environments.append(env) or "started"
    )
    monkeypatch.setenv("INDUCTOR_XPUGRAPH_WARMUP_RUNS", "0")
    monkeypatch.setenv("INDUCTOR_XPUGRAPH_RERECORD_LIMIT", "3")
    _probe_report.start_probes(["cpu"], leave_out={"INDUCTOR_XPUGRAPH_WARMUP_RUNS"})
    (env,) = environments
    assert "INDUCTOR_XPUGRAPH_WARMUP_RUNS" not in env
    assert env["INDUCTOR_XPUGRAPH_RERECORD_LIMIT"] == "3"


@pytest.mark.skipif(
    _probe_report.available_devices() != [], reason="needs a machine without xpu or cuda"
)
def test_probing_a_device_that_is_not_available_fails_without_a_child():
    (running,) = _probe_report.start_probes(["xpu"], leave_out=set()).values()
    (finding,) = _probe_report.probe_findings("xpu", running.result(timeout=0))
    assert finding.status is Status.FAIL
    assert finding.check == "graphs (xpu:0)"
    assert finding.detail == "the device cannot run the probe: torch.xpu.is_available() is False"


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a cuda device")
def test_the_probe_on_cuda_reports_ok():
    findings = _probe_report.probe_findings("cuda", child_result("cuda"))
    assert [(f.check, f.status) for f in findings] == [
        ("graphs (cuda:0)", Status.OK),
        ("do-not-capture list (cuda)", Status.OK),
    ], lines(findings)
