"""The doctor's device probe: a graph of a matmul, attention and a random op captured and
replayed through a backend, each listed operator tried, all in a child process; and what the
doctor makes of each outcome.

Most tests run the probe in this process (``device_probe.probe_device``) on the CPU emulator, or on
a scripted backend over it that fails the way a device does; a few run the child process, whose
start-up (importing torch and this package) takes seconds.
"""

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import inductor_xpugraph
from inductor_xpugraph import __main__, sycl_rules
from inductor_xpugraph.diagnostics import device_probe, doctor, probe_report
from inductor_xpugraph.diagnostics.findings import Status
from inductor_xpugraph.sycl_rules import sycl
from inductor_xpugraph.trees.backends import (
    backend_class,
    capture_streams,
    device_graphs,
)
from inductor_xpugraph.trees.backends.cpu_emulation import CpuEmulationBackend
from inductor_xpugraph.trees.backends.devices import DEVICES
from inductor_xpugraph.trees.backends.xpu_unrecordable_ops import ONEMKL_OPS

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
    result = device_probe.probe_device("cpu", lambda: backend_class(0))
    return probe_report.probe_findings("cpu", probe_report.ChildRun(result))


def lines(findings):
    return "\n".join(finding.line() for finding in findings)


@pytest.fixture
def listed(monkeypatch):
    """``listed(op, ...)``: the emulator's do-not-capture list is these operators."""

    def set_list(*ops):
        cpu = dataclasses.replace(DEVICES["cpu"], unrecordable_ops=dict.fromkeys(ops, "why"))
        monkeypatch.setitem(DEVICES, "cpu", cpu)

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
    assert finding.advice == probe_report.NOTHING_RECORDS
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
    result = device_probe.probe_device("cpu", lambda: CpuEmulationBackend(0))
    result.generator_after = words
    (finding,) = probe_report.graph_findings("cpu", result)
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


# -- the CPU under SYCL Graph's rules (doctor --device cpu --sycl-rules RELEASE) -------------

SYCL_REFUSAL = f"SyclError: {sycl.NODE_DEPENDS_ON_OUTSIDE_EVENT}"
ONEDNN_ATTENTION = "aten::_scaled_dot_product_fused_attention_overrideable"


@pytest.fixture
def under_rules(monkeypatch):
    """``under_rules(release)``: the probe's findings on the CPU inside ``on_cpu(release)``,
    through the backend the package's trees use there, as the doctor's child runs it."""
    # Process-wide: which devices cannot record, and each thread's capture stream.
    monkeypatch.setattr(device_graphs, "_DEVICES_THAT_CANNOT_RECORD", {})
    monkeypatch.setattr(capture_streams, "_capture_streams", {})

    def run(rules):
        release, recording = sycl_rules.releases.rule_set(rules)
        with sycl_rules.on_cpu(release.version, recording=recording):
            assert backend_class("cpu") is sycl_rules.XpuRulesBackend
            result = device_probe.probe_device("cpu", lambda: backend_class("cpu")(0))
        assert result.sycl_rules == rules
        return probe_report.probe_findings("cpu", probe_report.ChildRun(result))

    return run


def op_line(findings, op):
    (finding,) = [f for f in findings if f.detail.startswith(f"{op} ")]
    return finding


def test_on_torch_2_13s_rules_onemkl_ops_and_attention_do_not_record_in_sycls_words(under_rules):
    findings = under_rules("2.13")
    graphs = findings[0]
    assert graphs.check == "graphs (stand-in xpu, torch 2.13 rules)"
    assert graphs.status is Status.WARN, lines(findings)
    assert graphs.detail == f"attention does not record: {SYCL_REFUSAL}"
    assert graphs.advice == (
        f"attention runs un-graphed: {CPU_ATTENTION} (standing for xpu's {ONEDNN_ATTENTION}) "
        "is on the do-not-capture list here, so Inductor partitions it out and graphs the rest"
    )
    attention = op_line(findings, CPU_ATTENTION)
    assert attention.detail == (
        f"{CPU_ATTENTION} (standing for xpu's {ONEDNN_ATTENTION}) does not record here "
        f"({SYCL_REFUSAL}): stays on the list, graphs are split around it"
    )
    for op in ONEMKL_OPS:  # each has sample inputs, and each is refused on every release
        finding = op_line(findings, op)
        assert finding.check == "do-not-capture list (stand-in xpu, torch 2.13 rules)"
        assert finding.status is Status.OK
        assert finding.detail == (
            f"{op} does not record here ({SYCL_REFUSAL}): stays on the list, graphs are split "
            "around it"
        )


def test_on_torch_2_15s_rules_attention_records_and_onemkl_still_does_not(under_rules):
    findings = under_rules("2.15:native")
    graphs = findings[0]
    assert graphs.status is Status.OK, lines(findings)
    assert graphs.check == "graphs (stand-in xpu, torch 2.15 rules, native recording)"
    assert f"a matmul, attention ({CPU_ATTENTION}) and torch.rand captured" in graphs.detail
    assert graphs.detail.endswith(
        "the CPU stands in for an xpu device under SYCL Graph's rules as torch 2.15's XPU "
        'runtime meets them (inductor_xpugraph.sycl_rules.on_cpu("2.15", recording="native")): '
        "a stand-in, not an XPU measurement"
    )
    assert not [f for f in findings if f.detail.startswith(f"{CPU_ATTENTION} ")]  # not listed
    linalg_inv = op_line(findings, "aten::linalg_inv_ex")
    assert linalg_inv.detail.startswith(
        f"aten::linalg_inv_ex does not record here (SyclError: {sycl.NATIVE_OUTSIDE_EVENT})"
    )


def test_the_onemkl_samples_run_their_operator_and_record_on_the_emulator(listed):
    """What the stand-in refuses, its rules refuse: without them each sample records, and
    replays as it ran un-graphed."""
    listed(*ONEMKL_OPS)
    findings = probe()
    assert [f.detail for f in findings[1:]] == [
        f"{op} records here, yet graphs are split around it" for op in ONEMKL_OPS
    ], lines(findings)


def test_a_stand_in_probe_that_gave_nothing_is_named_as_the_stand_in():
    run = probe_report.ChildRun(problem="timeout", detail="did not finish within 1 s")
    (finding,) = probe_report.probe_findings("cpu", run, "2.13")
    assert finding.check == "graphs (stand-in xpu, torch 2.13 rules)"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (["--sycl-rules", "2.13"], "it needs --device cpu and no other device (given: none)"),
        (
            ["--device", "xpu", "--sycl-rules", "2.13"],
            "it needs --device cpu and no other device (given: --device xpu)",
        ),
        (
            ["--device", "cpu", "--device", "cuda", "--sycl-rules", "2.13"],
            "(given: --device cpu, --device cuda)",
        ),
        (
            ["--device", "cpu", "--sycl-rules", "2.12"],
            "--sycl-rules 2.12: no rule set for torch 2.12; choose one of 2.11, 2.13, 2.14, 2.15",
        ),
        (
            ["--device", "cpu", "--sycl-rules", "2.13", "--no-probe"],
            "--sycl-rules probes the CPU under SYCL Graph's rules; --no-probe captures nothing",
        ),
        (
            ["--device", "cpu", "--sycl-rules", "2.13:native"],
            "--sycl-rules 2.13:native: torch 2.13 records through command buffers only",
        ),
        (
            ["--device", "cpu", "--sycl-rules", "2.14:level-zero"],
            "--sycl-rules 2.14:level-zero: recording must be one of 'command-buffer', 'native'",
        ),
    ],
)
def test_sycl_rules_options_that_cannot_run_exit_2_saying_why(options, error, capsys):
    assert __main__.main(["doctor", *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --sycl-rules") and error in err, err


def test_the_command_hands_the_doctor_the_release(monkeypatch):
    handed = []
    monkeypatch.setattr(doctor, "main", lambda devices, **options: handed.append(options) or 0)
    assert __main__.main(["doctor", "--device", "cpu", "--sycl-rules", "2.11"]) == 0
    assert handed[0]["sycl_rules"] == "2.11"


@pytest.mark.slow
def test_the_command_on_torch_2_13s_rules_prints_what_an_xpu_user_would_see():
    result = subprocess.run(
        [sys.executable, "-m", "inductor_xpugraph", "doctor", "--device", "cpu"]
        + ["--sycl-rules", "2.13"],
        capture_output=True,
        text=True,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert out.startswith(
        "OK    sycl rules: the CPU stands in for an xpu device under SYCL Graph's rules as torch "
        "2.13's XPU runtime meets them"
    )
    assert "a stand-in, not an XPU measurement" in out.splitlines()[0]
    assert (
        f"WARN  graphs (stand-in xpu, torch 2.13 rules): attention does not record: "
        f"{SYCL_REFUSAL}\n      -> attention runs un-graphed: {CPU_ATTENTION}"
    ) in out
    assert (
        "OK    do-not-capture list (stand-in xpu, torch 2.13 rules): aten::linalg_inv_ex does "
        f"not record here ({SYCL_REFUSAL}): stays on the list"
    ) in out


# -- the child process ------------------------------------------------------------------------


def child_result(device_type="cpu", backend=None, env=None, timeout=120.0):
    return probe_report.start(device_type, backend, env).result(timeout)


@pytest.fixture
def child_runs(monkeypatch):
    """``child_runs(code)``: the probe's child runs this Python code instead."""

    def replace(code: str):
        command = [sys.executable, "-c", code]
        monkeypatch.setattr(probe_report, "child_command", lambda *args: command)

    return replace


@pytest.mark.slow
def test_a_capture_failure_in_the_child_is_a_warn_in_the_devices_words():
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__)}
    run = child_result(backend="test_doctor_probe:RefusesAttention", env=env)
    assert run.probe is not None, run
    (finding, _) = probe_report.probe_findings("cpu", run)
    assert finding.status is Status.WARN
    assert finding.detail == f"attention does not record: RuntimeError: {REFUSAL}"


@pytest.mark.slow
def test_a_child_that_cannot_import_the_package_fails_naming_why(tmp_path):
    """The probe's process finds a torch that raises (a broken install shadowing torch)."""
    broken = tmp_path / "torch"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('a broken install')\n")
    run = child_result(env={**os.environ, "PYTHONPATH": str(tmp_path)})
    (finding,) = probe_report.probe_findings("cpu", run)
    assert finding.status is Status.FAIL
    assert "cannot import inductor_xpugraph: ImportError: a broken install" in finding.detail


def test_a_probe_that_does_not_finish_in_time_warns_with_its_last_step(child_runs):
    child_runs(
        "import time\n"
        f"print({device_probe.LINE_PREFIX!r} + 'stage capturing the graph', flush=True)\n"
        "time.sleep(60)\n"
    )
    (finding,) = probe_report.probe_findings("cpu", child_result(timeout=1.5))
    assert finding.status is Status.WARN
    assert finding.detail == (
        "the probe did not finish within 1.5 s (last step: capturing the graph)"
    )
    assert "--probe-timeout" in finding.advice


def test_a_probe_process_that_dies_fails_naming_the_signal_and_the_step(child_runs):
    child_runs(
        "import os, signal\n"
        f"print({device_probe.LINE_PREFIX!r} + 'stage replaying the graph', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    (finding,) = probe_report.probe_findings("cpu", child_result())
    assert finding.status is Status.FAIL
    assert (
        finding.detail == "the probe's process died (killed by SIGKILL) while replaying the graph"
    )


def test_a_probe_process_that_cannot_start_warns(monkeypatch):
    missing = ["/nonexistent/python-of-the-probe"]
    monkeypatch.setattr(probe_report, "child_command", lambda *args: missing)
    (finding,) = probe_report.probe_findings("cpu", child_result())
    assert finding.status is Status.WARN
    assert finding.detail.startswith("could not start the probe's process: FileNotFoundError")


def test_bad_settings_are_left_out_of_the_childs_environment(monkeypatch):
    environments = []
    monkeypatch.setattr(
        probe_report, "start", lambda device, env: environments.append(env) or "started"
    )
    monkeypatch.setenv("INDUCTOR_XPUGRAPH_WARMUP_RUNS", "0")
    monkeypatch.setenv("INDUCTOR_XPUGRAPH_RERECORD_LIMIT", "3")
    probe_report.start_probes(["cpu"], leave_out={"INDUCTOR_XPUGRAPH_WARMUP_RUNS"})
    (env,) = environments
    assert "INDUCTOR_XPUGRAPH_WARMUP_RUNS" not in env
    assert env["INDUCTOR_XPUGRAPH_RERECORD_LIMIT"] == "3"


@pytest.mark.skipif(
    probe_report.available_devices() != [], reason="needs a machine without xpu or cuda"
)
def test_probing_a_device_that_is_not_available_fails_without_a_child():
    (running,) = probe_report.start_probes(["xpu"], leave_out=set()).values()
    (finding,) = probe_report.probe_findings("xpu", running.result(timeout=0))
    assert finding.status is Status.FAIL
    assert finding.check == "graphs (xpu:0)"
    assert finding.detail == "the device cannot run the probe: torch.xpu.is_available() is False"


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a cuda device")
def test_the_probe_on_cuda_reports_ok():
    findings = probe_report.probe_findings("cuda", child_result("cuda"))
    assert [(f.check, f.status) for f in findings] == [
        ("graphs (cuda:0)", Status.OK),
        ("do-not-capture list (cuda)", Status.OK),
    ], lines(findings)


@pytest.mark.parametrize(
    ("rules", "said"),
    [
        ("2.13", "recording: command-buffer: torch 2.13's XPUGraph records through SYCL Graph's"),
        ("2.14", "recording: native: torch 2.14's XPUGraph records through Level Zero"),
        ("2.15:command-buffer", "recording: command-buffer: chosen with --sycl-rules"),
    ],
)
def test_doctor_says_which_recording_mode_the_stand_in_uses(rules, said, monkeypatch):
    monkeypatch.delenv("SYCL_GRAPH_FORCE_NATIVE_RECORDING", raising=False)
    assert said in doctor.check_sycl_rules(rules).detail
