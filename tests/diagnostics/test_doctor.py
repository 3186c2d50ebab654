"""``python -m inductor_xpugraph doctor``: one line per check, exit 1 exactly when one FAILs;
a bad setting or a check that raises is a FAIL line, never a traceback. The device probe has
tests of its own (test_doctor_probe.py)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import inductor_xpugraph
from inductor_xpugraph import __main__, codegen
from inductor_xpugraph.diagnostics import doctor, probe_report
from inductor_xpugraph.diagnostics.findings import Finding, Status


def run_doctor(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inductor_xpugraph", "doctor", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )


def test_doctor_exits_nonzero_exactly_when_a_check_fails():
    result = run_doctor("--no-probe")
    lines = [line for line in result.stdout.splitlines() if line and not line.startswith(" ")]
    findings = lines[:-1]
    assert findings and all(line.split()[0] in ("OK", "WARN", "FAIL") for line in findings)
    failed = sum(line.startswith("FAIL") for line in findings)
    assert lines[-1].startswith(f"{failed} FAIL")
    assert result.returncode == (1 if failed else 0)


@pytest.mark.slow
@pytest.mark.skipif(bool(doctor.available_devices()), reason="a device is present here")
def test_doctor_without_a_device_warns_that_only_the_emulator_runs_and_probes_it():
    result = run_doctor(INDUCTOR_XPUGRAPH_DEVICES="cpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARN  device: no xpu or cuda device is available" in result.stdout
    assert "-> on an Intel GPU machine install torch's XPU build" in result.stdout
    assert "OK    registration (cpu): our wrapper codegen is in use" in result.stdout
    assert "OK    graphs (cpu): a matmul, attention" in result.stdout
    assert "OK    do-not-capture list (cpu): empty on this device" in result.stdout


def test_the_emulator_is_probed_when_enabled(monkeypatch):
    monkeypatch.setattr(probe_report, "available_devices", lambda: [])
    was_enabled = "cpu" in inductor_xpugraph.enabled_devices()
    inductor_xpugraph.disable("cpu")
    try:
        assert probe_report.default_probe_devices() == []
        inductor_xpugraph.enable("cpu")
        assert probe_report.default_probe_devices() == ["cpu"]
    finally:
        (inductor_xpugraph.enable if was_enabled else inductor_xpugraph.disable)("cpu")


def test_the_command_hands_the_doctor_the_devices_asked_for(monkeypatch):
    handed = []
    monkeypatch.setattr(doctor, "main", lambda devices, **options: handed.append(devices) or 0)
    __main__.main(["doctor", "--device", "cpu", "--device", "xpu"])
    __main__.main(["doctor"])
    assert handed == [["cpu", "xpu"], None]


@pytest.mark.parametrize(
    ("version", "status"),
    [
        ("2.10.0", Status.FAIL),
        ("2.11.0+cu130", Status.OK),
        ("2.13.0+cpu", Status.OK),
        ("2.15.0", Status.OK),
        ("2.16.0.dev20261101", Status.WARN),
        ("not-a-version", Status.WARN),
    ],
)
def test_torch_versions_are_checked_against_the_supported_range(version, status):
    finding = doctor.check_torch(version)
    assert finding.status is status
    assert version in finding.detail


def registration_finding(device: str, enabled: bool):
    """``check_registration`` for ``device`` registered or not (the registration itself, which
    does not warn about a device this machine lacks, as ``inductor_xpugraph.enable`` does);
    the state is restored after."""
    was_enabled = device in codegen.enabled_devices()
    (codegen.enable if enabled else codegen.disable)(device)
    try:
        (finding,) = doctor.check_registration([device])
    finally:
        (codegen.enable if was_enabled else codegen.disable)(device)
    return finding


def test_xpu_without_the_extension_enabled_fails_with_what_to_do():
    finding = registration_finding("xpu", enabled=False)
    assert finding.status is Status.FAIL
    assert "inductor_xpugraph.enable('xpu')" in finding.advice


def test_cuda_without_the_extension_enabled_warns_that_upstream_trees_serve_it():
    finding = registration_finding("cuda", enabled=False)
    assert finding.status is Status.WARN
    assert "upstream's graph trees" in finding.detail
    assert "inductor_xpugraph.enable('cuda')" in finding.advice


def test_an_enabled_device_uses_our_wrapper_codegen():
    assert registration_finding("cuda", enabled=True).status is Status.OK


def test_stale_output_errors_have_a_path_here():
    finding = doctor.check_stale_output_errors()
    assert finding.status is not Status.FAIL, finding.line()


def test_main_returns_one_when_any_check_fails(monkeypatch, capsys):
    failing = Finding("device", Status.FAIL, "broken", "fix it")
    findings = [Finding("torch", Status.OK, "x"), failing]
    monkeypatch.setattr(doctor, "diagnose", lambda *args, **kwargs: findings)
    assert doctor.main() == 1
    out = capsys.readouterr().out
    assert "FAIL  device: broken\n      -> fix it" in out
    assert "1 FAIL, 0 WARN" in out


def test_triton_missing_with_a_device_fails(monkeypatch):
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: None)
    assert doctor.check_triton(["xpu"]).status is Status.FAIL
    assert doctor.check_triton([]).status is Status.OK


# -- settings: a bad value is a FAIL line, not a traceback --------------------------------------


def test_a_bogus_device_setting_is_a_fail_line_naming_the_variable_and_what_it_accepts(
    monkeypatch, capsys
):
    monkeypatch.setenv("INDUCTOR_XPUGRAPH_DEVICES", "cpu,bogus")
    assert doctor.main(probe=False) == 1
    out = capsys.readouterr().out
    assert "FAIL  settings: INDUCTOR_XPUGRAPH_DEVICES='cpu,bogus': 'bogus' is not a device\n" in out
    assert "-> INDUCTOR_XPUGRAPH_DEVICES accepts a comma-separated list of xpu, cuda, cpu" in out
    assert "Traceback" not in out


def test_the_command_with_a_bogus_setting_prints_a_fail_line_not_a_traceback():
    result = run_doctor("--no-probe", INDUCTOR_XPUGRAPH_DEVICES="bogus")
    assert "FAIL  settings: INDUCTOR_XPUGRAPH_DEVICES='bogus'" in result.stdout
    assert "Traceback" not in result.stderr
    assert result.returncode == 1


@pytest.mark.parametrize(
    ("variable", "value", "accepts"),
    [
        ("INDUCTOR_XPUGRAPH_WARMUP_RUNS", "0", "an integer >= 1"),
        ("INDUCTOR_XPUGRAPH_RERECORD_LIMIT", "abc", "an integer >= 0"),
        ("INDUCTOR_XPUGRAPH_SKIP_DYNAMIC_GRAPHS", "maybe", "1/true/yes/on/0/false/no/off"),
        ("INDUCTOR_XPUGRAPH_NEVER_CAPTURE_OPS", "not an op", "a comma-separated list of operator"),
    ],
)
def test_a_bad_setting_value_is_a_fail_line_with_what_it_accepts(
    monkeypatch, variable, value, accepts
):
    monkeypatch.setenv(variable, value)
    (finding,) = doctor.check_settings()
    assert finding.status is Status.FAIL
    assert finding.detail.startswith(f"{variable}={value!r} is not a valid value")
    assert finding.advice.startswith(f"{variable} accepts {accepts}")


def test_valid_settings_are_named_in_an_ok_line(monkeypatch):
    monkeypatch.setenv("INDUCTOR_XPUGRAPH_WARMUP_RUNS", "2")
    (finding,) = doctor.check_settings()
    assert finding.status is Status.OK
    assert "INDUCTOR_XPUGRAPH_WARMUP_RUNS='2'" in finding.detail


def test_every_setting_read_from_the_environment_is_one_the_doctor_checks():
    """The doctor finds each setting's variable by name (``setting_variable``)."""
    source = pathlib.Path(inductor_xpugraph.config.__file__).read_text()
    read = re.findall(r'_from_environment\(\s*"(\w+)",\s*"(\w+)"', source)
    assert read
    for name, variable in read:
        assert doctor.setting_variable(name) == variable


def test_a_check_that_raises_is_a_fail_line_not_a_traceback(monkeypatch):
    def broken(devices):
        raise RuntimeError("cannot read the driver\nsecond line")

    monkeypatch.setattr(doctor, "check_triton", broken)
    findings = doctor.diagnose(probe=False)
    (triton,) = [finding for finding in findings if finding.check == "triton"]
    assert triton.status is Status.FAIL
    assert triton.detail == "the check raised RuntimeError: cannot read the driver"


def test_the_upstream_settings_line_names_those_with_no_effect_here():
    import torch

    (line,) = doctor.check_upstream_settings()
    assert line.status is Status.OK and "mean the same here" in line.detail
    if hasattr(torch._inductor.config.triton, "cudagraph_trees_objgraph"):
        assert "cudagraph_trees_objgraph" in line.detail


def test_an_upstream_setting_with_no_effect_that_is_set_is_a_warn_line():
    import torch

    name = "cudagraph_trees_objgraph"
    if not hasattr(torch._inductor.config.triton, name):
        pytest.skip(f"torch {torch.__version__} has no triton.{name}")
    with torch._inductor.config.patch({f"triton.{name}": True}):
        findings = doctor.check_upstream_settings()
    (warn,) = [f for f in findings if f.status is Status.WARN]
    assert f"triton.{name} is set and has no effect here" in warn.detail


def test_cudagraph_or_error_set_is_a_warn_line_naming_where_inductor_raises():
    import torch

    if not hasattr(torch._inductor.config.triton, "cudagraph_or_error"):
        pytest.skip(f"torch {torch.__version__} has no triton.cudagraph_or_error")
    with torch._inductor.config.patch({"triton.cudagraph_or_error": True}):
        findings = doctor.check_upstream_settings()
    (warn,) = [f for f in findings if f.status is Status.WARN]
    assert "cudagraph_or_error is set" in warn.detail and "Inductor raises" in warn.detail
    assert ("xpu" in warn.detail) == (torch.__version__ >= "2.15")


def test_the_graphs_line_says_why_nothing_was_probed(monkeypatch):
    """With no device to probe (and the emulator not asked for), and with ``--no-probe``, the
    graphs line says what happened, and how to probe the CPU emulator."""
    monkeypatch.setattr(probe_report, "default_probe_devices", lambda: [])
    assert f"OK    graphs: {doctor.NOTHING_TO_PROBE}" in [f.line() for f in doctor.diagnose()]
    not_probed = [f.line() for f in doctor.diagnose(probe=False)]
    assert "OK    graphs: not probed (--no-probe): nothing captured" in not_probed
