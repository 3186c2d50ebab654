"""``python -m inductor_xpugraph doctor``: one line per check, exit 1 exactly when one FAILs."""

import os
import subprocess
import sys

import pytest

import inductor_xpugraph
from inductor_xpugraph import doctor
from inductor_xpugraph.doctor import Finding, Status


def run_doctor(**env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "inductor_xpugraph", "doctor"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )


def test_doctor_exits_nonzero_exactly_when_a_check_fails():
    result = run_doctor()
    lines = [line for line in result.stdout.splitlines() if line and not line.startswith(" ")]
    findings = lines[:-1]
    assert findings and all(line.split()[0] in ("OK", "WARN", "FAIL") for line in findings)
    failed = sum(line.startswith("FAIL") for line in findings)
    assert lines[-1].startswith(f"{failed} FAIL")
    assert result.returncode == (1 if failed else 0)


@pytest.mark.skipif(bool(doctor.available_devices()), reason="a device is present here")
def test_doctor_without_a_device_warns_that_only_the_emulator_runs_and_succeeds():
    result = run_doctor(INDUCTOR_XPUGRAPH_DEVICES="cpu")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARN  device: no xpu or cuda device is available" in result.stdout
    assert "-> on an Intel GPU machine install torch's XPU build" in result.stdout
    assert "OK    registration (cpu): our wrapper codegen is in use" in result.stdout


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
    """``check_registration`` for ``device`` enabled or not; the state is restored after."""
    was_enabled = device in inductor_xpugraph.enabled_devices()
    (inductor_xpugraph.enable if enabled else inductor_xpugraph.disable)(device)
    try:
        (finding,) = doctor.check_registration([device])
    finally:
        (inductor_xpugraph.enable if was_enabled else inductor_xpugraph.disable)(device)
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
    monkeypatch.setattr(doctor, "diagnose", lambda: [Finding("torch", Status.OK, "x"), failing])
    assert doctor.main() == 1
    out = capsys.readouterr().out
    assert "FAIL  device: broken\n      -> fix it" in out
    assert "1 FAIL, 0 WARN" in out


def test_triton_missing_with_a_device_fails(monkeypatch):
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: None)
    assert doctor.check_triton(["xpu"]).status is Status.FAIL
    assert doctor.check_triton([]).status is Status.OK
