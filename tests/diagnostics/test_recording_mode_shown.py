"""``doctor`` and ``report()`` say how XPUGraph records and how that was found
(``trees.backends.xpu_recording``): on the stand-in of ``--sycl-rules``, with what the recording
probe finds there, and on each xpu device of the process."""

import pytest
from support.recording_probes import fresh_probes  # noqa: F401 (autouse)

import inductor_xpugraph
from inductor_xpugraph import sycl_rules
from inductor_xpugraph.diagnostics import doctor
from inductor_xpugraph.diagnostics.findings import Status
from inductor_xpugraph.trees.backends import device_recording, recording_probe, xpu_recording
from inductor_xpugraph.trees.backends.xpu_recording import Decision


@pytest.mark.parametrize(
    ("rules", "said"),
    [
        (
            "2.13",
            "recording: command-buffer: torch 2.13's XPUGraph records through SYCL Graph's "
            "command buffers (from the build); the recording probe on the stand-in finds "
            "command-buffer too (",
        ),
        (
            "2.14",
            "(assumed from the release); the recording probe on the stand-in finds native too (",
        ),
        (
            "2.14:command-buffer",
            "recording: command-buffer: chosen with --sycl-rules "
            "2.14:command-buffer (from the setting); the recording probe on the stand-in finds "
            "command-buffer too (",
        ),
        (
            "2.15:native",
            "recording: native: chosen with --sycl-rules 2.15:native (from the "
            "setting); the recording probe on the stand-in finds native too (",
        ),
    ],
)
def test_doctor_says_how_the_stand_in_records_and_what_the_probe_finds(rules, said):
    finding = doctor.check_sycl_rules(rules)
    assert finding.status is Status.OK
    assert said in finding.detail, finding.detail


def test_doctor_warns_where_the_probe_disagrees(monkeypatch):
    found = recording_probe.ProbeResult(None, "the probe raised ValueError: no streams today")
    monkeypatch.setattr(recording_probe, "probe_recording_mode", lambda *a, **k: found)
    finding = doctor.check_sycl_rules("2.15:native")
    assert finding.status is Status.WARN
    assert "the recording probe on the stand-in cannot tell (0.0 ms): the probe raised" in (
        finding.detail
    )


def test_doctor_says_how_each_xpu_device_records(monkeypatch):
    assert doctor.check_xpu_recording(["cuda"]) == []
    monkeypatch.setattr(doctor.torch.xpu, "device_count", lambda: 2)
    decisions = {
        0: Decision("native", xpu_recording.PROBED, "a host wait ... (0.3 ms)"),
        1: Decision("native", xpu_recording.ASSUMED, "torch 2.14's XPUGraph records ..."),
    }
    monkeypatch.setattr(
        device_recording, "device_recording", lambda release, index: decisions[index]
    )
    probed, assumed = doctor.check_xpu_recording(["xpu"])
    assert (probed.status, probed.detail) == (
        Status.OK,
        "xpu:0: native, probed: a host wait ... (0.3 ms)",
    )
    assert assumed.status is Status.WARN
    assert "INDUCTOR_XPUGRAPH_XPU_RECORDING" in assumed.advice


def test_the_report_says_how_the_stand_in_records():
    with sycl_rules.on_cpu("2.14", recording="command-buffer"):
        report = inductor_xpugraph.report()
    (line,) = report.recording
    assert line.startswith(
        "cpu:0 (standing in for xpu, torch 2.14's rules): command-buffer, probed: a host wait "
        "inside a capture raised SYCL's command-buffer refusal"
    )
    assert f"xpu recording: {line}" in report.text()
    with sycl_rules.on_cpu("2.13"):
        (line,) = inductor_xpugraph.report().recording
    assert line.startswith(
        "cpu:0 (standing in for xpu, torch 2.13's rules): command-buffer, from the build: "
    )


def test_the_report_says_how_each_xpu_device_records(monkeypatch):
    assert inductor_xpugraph.report().recording == ()  # no xpu device decided here
    decision = Decision("native", xpu_recording.PROBED, "a host wait ... (0.3 ms)")
    monkeypatch.setitem(device_recording._decisions, "xpu:0", decision)
    report = inductor_xpugraph.report()
    assert report.recording == ("xpu:0: native, probed: a host wait ... (0.3 ms)",)
    assert "xpu recording: xpu:0: native, probed: a host wait" in report.text()
