"""The doctor's side of the device probe (``device_probe``): start it in a child process per device,
collect what each child says (or why it said nothing: it did not start, timed out, died), and
turn that into findings, with what each outcome means for a user of reduce-overhead.

With ``sycl_rules`` (a torch release, ``doctor --device cpu --sycl-rules 2.13``) the CPU's child
runs inside ``sycl_rules.on_cpu(release)``, and every finding of it says so: its lines are the
CPU standing in for an xpu device under that release's SYCL Graph rules, not an XPU measurement.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

from .. import native
from ..trees.messages import first_line
from . import device_probe
from .findings import Finding, Status, available_devices

# -- the child process -----------------------------------------------------------------------------


@dataclasses.dataclass
class ChildRun:
    """What a probe's child process gave: its result, or why there is none."""

    probe: device_probe.DeviceProbe | None = None
    problem: str = ""  # "timeout", "not started", "died", "import", "error"
    detail: str = ""  # the problem, in words
    stage: str = ""  # the last step it started


class RunningProbe:
    """A probe's child process, started; ``result(timeout)`` waits for it and ends it."""

    def __init__(
        self,
        device_type: str,
        backend: str | None,
        env: dict[str, str],
        sycl_rules: str | None = None,
    ) -> None:
        self.device_type = device_type
        self.started = time.monotonic()
        self.error: OSError | None = None
        # The child imports this very package, wherever this process found it.
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        paths = [package_root, env.get("PYTHONPATH", "")]
        env = {**env, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}
        try:
            self.process = subprocess.Popen(
                child_command(device_type, backend, sycl_rules),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                start_new_session=True,  # its own process group: ended with what it started
            )
        except OSError as error:
            self.error = error

    def result(self, timeout: float) -> ChildRun:
        """Its result; ``timeout`` seconds after it started, it is ended."""
        if self.error is not None:
            return ChildRun(problem="not started", detail=first_line(self.error))
        timed_out = False
        try:
            left = max(0.0, timeout - (time.monotonic() - self.started))
            out, err = self.process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            timed_out = True
            self._end()
            try:
                out, err = self.process.communicate(timeout=10)
            except subprocess.TimeoutExpired:  # something it started holds the pipes
                out, err = "", ""
        return self._read(out or "", err or "", timed_out, timeout)

    def _end(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (AttributeError, OSError):
            self.process.kill()

    def _read(self, out: str, err: str, timed_out: bool, timeout: float) -> ChildRun:
        run = ChildRun()
        for line in out.splitlines():
            if not line.startswith(device_probe.LINE_PREFIX):
                continue
            kind, _, text = line[len(device_probe.LINE_PREFIX) :].partition(" ")
            if kind == "stage":
                run.stage = text
            elif kind == "result":
                run.probe = device_probe.DeviceProbe.from_json(text)
            elif kind in ("import-error", "error"):
                run.problem, run.detail = kind.replace("-error", ""), text
        if run.probe is not None or run.problem:
            return run
        if timed_out:
            run.problem, run.detail = "timeout", f"did not finish within {timeout:g} s"
            return run
        run.problem, run.detail = "died", _exit_words(self.process.returncode)
        last_error_line = (err.strip().splitlines() or [""])[-1]
        if last_error_line:
            run.detail += f" ({last_error_line[:200]})"
        return run


def _exit_words(code: int) -> str:
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def start(
    device_type: str,
    backend: str | None = None,
    env: dict[str, str] | None = None,
    sycl_rules: str | None = None,
):
    """Start the probe of ``device_type`` in a child process (``backend``: "module:Class" to
    probe another backend class than this project's; ``sycl_rules``: a torch release, the CPU
    under its SYCL Graph rules); ``.result(timeout)`` collects it."""
    env = dict(os.environ if env is None else env)
    return RunningProbe(device_type, backend, env, sycl_rules)


def child_command(
    device_type: str, backend: str | None = None, sycl_rules: str | None = None
) -> list[str]:
    """The child's command line: ``backend`` ("module:Class") probes another backend class;
    ``sycl_rules`` ("2.13") probes inside ``sycl_rules.on_cpu(sycl_rules)``."""
    options = [
        *([backend] if backend else []),
        *(["--sycl-rules", sycl_rules] if sycl_rules else []),
    ]
    return [sys.executable, "-c", device_probe.CHILD_CODE, device_type, *options]


def where(device_type: str, sycl_rules: str | None = None) -> str:
    """What a probe's lines are about: "xpu:0", "cpu" (the emulator), or the CPU standing in
    for an xpu device under torch ``sycl_rules``'s SYCL Graph rules."""
    if sycl_rules:
        release, _, recording = sycl_rules.partition(":")
        return f"stand-in xpu, torch {release} rules" + (
            f", {recording} recording" if recording else ""
        )
    return device_probe.device_label(device_type)


def stand_in_words(rules: str) -> str:
    """What the lines of a probe under the SYCL Graph rules ``rules`` ("2.13", "2.14:native")
    are, in words."""
    release, _, recording = rules.partition(":")
    call = f'"{release}"' + (f', recording="{recording}"' if recording else "")
    return (
        f"the CPU stands in for an xpu device under SYCL Graph's rules as torch {release}'s XPU "
        f"runtime meets them (inductor_xpugraph.sycl_rules.on_cpu({call})): a stand-in, not an "
        "XPU measurement"
    )


# -- findings --------------------------------------------------------------------------------------

PROBE_TIMEOUT = 180.0  # seconds: a first capture on a fresh machine loads and compiles kernels

NOTHING_RECORDS = (
    "every compiled graph runs un-graphed: reduce-overhead gives no speedup here, results "
    "stay correct"
)
_PART_MEANING = {
    "matmul": "graphs that contain a matmul (most graphs) will run un-graphed on this machine",
    "attention": "graphs that contain attention will run un-graphed on this machine",
    "random": "graphs that contain random ops (dropout, torch.rand) will run un-graphed on "
    "this machine",
}
_KEEP_OFF = (
    "keep reduce-overhead off on this device (leave it out of INDUCTOR_XPUGRAPH_DEVICES) and "
    "report this output"
)
_CHECK_THE_DEVICE = (
    "check the GPU driver and torch's {1} build: "
    "python -c \"import torch; print(torch.ones(2, device='{0}') * 2)\""
)
# Why a child gave no result: (status, what happened, what it means or what to do).
_CHILD_PROBLEMS = {
    "timeout": (
        Status.WARN,
        "the probe {detail} (last step: {stage})",
        "rerun with a longer --probe-timeout; a capture or replay that never finishes would "
        "hang reduce-overhead too: then " + _KEEP_OFF,
    ),
    "not started": (
        Status.WARN,
        "could not start the probe's process: {detail}",
        "graphs on this device are untested; run the doctor again",
    ),
    "import": (
        Status.FAIL,
        "the probe's process cannot import inductor_xpugraph: {detail}",
        "fix what it names",
    ),
    "error": (
        Status.WARN,
        "the probe failed while {stage}: {detail}",
        "a bug of the doctor, not of the device: report this output",
    ),
    "died": (
        Status.FAIL,
        "the probe's process died ({detail}) while {stage}",
        "reduce-overhead may end a program the same way here: " + _KEEP_OFF,
    ),
}


def probe_findings(device_type: str, run: ChildRun, sycl_rules: str | None = None) -> list[Finding]:
    """What a probe's child gave (``RunningProbe.result``), as findings (``sycl_rules``: the
    release the child's CPU followed, if any)."""
    if run.probe is None:
        status, detail, advice = _CHILD_PROBLEMS[run.problem]
        words = detail.format(detail=run.detail, stage=run.stage or "starting")
        return [Finding(f"graphs ({where(device_type, sycl_rules)})", status, words, advice)]
    probe = run.probe
    if sycl_rules and not probe.sycl_rules:  # a child that failed before it knew the backend
        probe = dataclasses.replace(probe, sycl_rules=sycl_rules)
    return graph_findings(device_type, probe) + op_list_findings(device_type, probe)


def graph_findings(device_type: str, probe: device_probe.DeviceProbe) -> list[Finding]:
    """The probe's graph (``device_probe`` steps 1-3): OK, or one finding per problem."""
    check = f"graphs ({where(device_type, probe.sycl_rules)})"
    if probe.unusable:
        advice = (
            _CHECK_THE_DEVICE.format(device_type, device_type.upper())
            if device_type != "cpu"
            else "the CPU emulator always runs: report this output"
        )
        return [
            Finding(
                check, Status.FAIL, f"the device cannot run the probe: {probe.unusable}", advice
            )
        ]
    findings = []
    for attempt in [probe.graph, *probe.parts.values()]:
        if attempt.recorded and attempt.wrong:
            findings.append(
                Finding(
                    check,
                    Status.FAIL,
                    "replayed results differ from un-graphed ones: " + "; ".join(attempt.wrong),
                    "graphs give wrong results here: " + _KEEP_OFF,
                )
            )
        if attempt.recorded and attempt.random_repeats:
            findings.append(
                Finding(
                    check,
                    Status.FAIL,
                    "random values are the same at every replay",
                    "dropout and sampling in graphs would repeat one draw: " + _KEEP_OFF,
                )
            )
    if not probe.graph.recorded:
        findings += _not_recorded(device_type, probe, check)
    if probe.generator_after:
        findings.append(_generator_finding(check, "after the captures", probe.generator_after))
    if findings:
        return findings
    attention = "attention"
    if probe.attention_ops:
        attention += f" ({', '.join(probe.attention_ops)})"
    emulated = "; CPU emulator: checks this runtime, not a device" if device_type == "cpu" else ""
    if probe.sycl_rules:
        emulated = "; " + stand_in_words(probe.sycl_rules)
    return [
        Finding(
            check,
            Status.OK,
            f"a matmul, {attention} and torch.rand captured in one graph and replayed: results "
            f"match un-graphed ones, random values fresh at each replay, random ops work "
            f"after{emulated}",
        )
    ]


def _not_recorded(device_type: str, probe: device_probe.DeviceProbe, check: str) -> list[Finding]:
    """The graph did not record: which parts of it do not, and what that means."""
    failed = [part for part in device_probe.PARTS if not probe.parts[part].recorded]
    if len(failed) == len(device_probe.PARTS):
        return [
            Finding(
                check, Status.WARN, f"cannot record a graph: {probe.graph.words}", NOTHING_RECORDS
            )
        ]
    if not failed:
        return [
            Finding(
                check,
                Status.WARN,
                "a matmul, attention and torch.rand each record alone, not in one graph: "
                + probe.graph.words,
                "some graphs will run un-graphed on this machine",
            )
        ]
    findings = []
    for part in failed:
        meaning = _PART_MEANING[part]
        if part == "attention" and probe.attention_ops:
            ops = ",".join(probe.attention_ops)
            if set(probe.attention_ops) <= set(probe.not_to_capture):
                named = ", ".join(_named(op, probe) for op in probe.attention_ops)
                meaning = (
                    f"attention runs un-graphed: {named} is on the do-not-capture list here, so "
                    "Inductor partitions it out and graphs the rest"
                )
            else:
                meaning += (
                    f"; with INDUCTOR_XPUGRAPH_NEVER_CAPTURE_OPS={ops} (or "
                    "inductor_xpugraph.config.never_capture_ops) Inductor partitions it out "
                    "and graphs the rest"
                )
        words = probe.parts[part].words
        findings.append(Finding(check, Status.WARN, f"{part} does not record: {words}", meaning))
    return findings


def _generator_finding(check: str, when: str, words: str) -> Finding:
    return Finding(
        check,
        Status.FAIL,
        f"a random op raises un-graphed {when}: {words}",
        "a failed capture left the random number generator in capture mode: once a capture "
        "fails, every random op of the program does; " + _KEEP_OFF,
    )


def op_list_findings(device_type: str, probe: device_probe.DeviceProbe) -> list[Finding]:
    """Per operator of the device's do-not-capture list (``device_probe`` step 4): whether it
    records here, and what to do when that disagrees with the list or with
    ``config.allow_capture_ops``."""
    from .. import config

    listed_for = where(device_type, probe.sycl_rules) if probe.sycl_rules else device_type
    check = f"do-not-capture list ({listed_for})"
    if probe.unusable:
        return []
    if not probe.ops:
        return [Finding(check, Status.OK, "empty on this device")]
    allowed = tuple(config.allow_capture_ops)
    # allow_capture_ops takes an operator by its name or the xpu name it stands for; the
    # instruction names the xpu one, which a real xpu device takes too.
    recording = tuple(
        probe.stands_for.get(op.op, op.op) for op in probe.ops if op.outcome == "records"
    )
    to_allow = tuple(dict.fromkeys(allowed + recording))
    take_off = (
        f"take it off the list on this machine: INDUCTOR_XPUGRAPH_ALLOW_CAPTURE_OPS="
        f"{','.join(to_allow)} or inductor_xpugraph.config.allow_capture_ops = {to_allow!r}"
    )
    put_back = (
        "graphs that contain it fail to capture and run un-graphed: take it out of "
        "INDUCTOR_XPUGRAPH_ALLOW_CAPTURE_OPS / inductor_xpugraph.config.allow_capture_ops"
    )
    findings = []
    not_tried: dict[str, list[str]] = {}  # why -> operators
    for op in probe.ops:
        is_allowed = op.op in allowed or probe.stands_for.get(op.op) in allowed
        name = _named(op.op, probe)
        if op.outcome == "not tried":
            not_tried.setdefault(op.words, []).append(op.op)
        elif op.outcome == "records" and is_allowed:
            detail = f"{name} records here; taken off the list by config.allow_capture_ops"
            findings.append(Finding(check, Status.OK, detail))
        elif op.outcome == "records":
            detail = f"{name} records here, yet graphs are split around it"
            findings.append(Finding(check, Status.WARN, detail, take_off))
        elif is_allowed:
            detail = (
                f"{name} does not record here ({op.words}), yet config.allow_capture_ops "
                "takes it off the list"
            )
            findings.append(Finding(check, Status.WARN, detail, put_back))
        else:
            detail = (
                f"{name} does not record here ({op.words}): stays on the list, graphs are "
                "split around it"
            )
            findings.append(Finding(check, Status.OK, detail))
    for why, ops in not_tried.items():
        findings.append(
            Finding(check, Status.OK, f"{_op_names(ops)}: not tried here: {why}; stays on the list")
        )
    if probe.generator_after_ops:
        findings.append(_generator_finding(check, "after trying them", probe.generator_after_ops))
    return findings


def _named(op: str, probe: device_probe.DeviceProbe) -> str:
    """``op``, and the xpu operator it stands for on the stand-in, where the names differ."""
    xpu_op = probe.stands_for.get(op)
    return f"{op} (standing for xpu's {xpu_op})" if xpu_op and xpu_op != op else op


def _op_names(ops: list[str]) -> str:
    """``ns::a``, or ``ns::{a, b}`` for several of one namespace."""
    by_namespace: dict[str, list[str]] = {}
    for op in ops:
        namespace, _, name = op.partition("::")
        by_namespace.setdefault(namespace, []).append(name)
    return ", ".join(
        f"{namespace}::{names[0]}" if len(names) == 1 else f"{namespace}::{{{', '.join(names)}}}"
        for namespace, names in by_namespace.items()
    )


# -- the doctor's entry ----------------------------------------------------------------------------


def default_probe_devices() -> list[str]:
    """Each available device, and the CPU emulator when enabled (INDUCTOR_XPUGRAPH_DEVICES)."""
    from ..codegen import enabled_devices

    return available_devices() + (["cpu"] if "cpu" in enabled_devices() else [])


class _Known:
    """The result of a probe that needed no child (a device that is not available)."""

    def __init__(self, run: ChildRun) -> None:
        self.run = run

    def result(self, timeout: float) -> ChildRun:
        return self.run


def start_probes(
    devices: list[str], leave_out: set[str], sycl_rules: str | None = None
) -> dict[str, RunningProbe | _Known]:
    """Start the probe of each of ``devices`` in a child process of its own, with the
    environment variables ``leave_out`` (bad settings, reported apart) left out of it;
    ``sycl_rules``: the CPU's under that torch release's SYCL Graph rules."""
    env = {name: value for name, value in os.environ.items() if name not in leave_out}
    # The doctor builds nothing unless asked: a probe without the compiled module says so.
    env[native.BACKGROUND_BUILD_VARIABLE] = "0"
    available = available_devices()
    started: dict[str, RunningProbe | _Known] = {}
    for device in dict.fromkeys(devices):
        if device == "cpu" and sycl_rules:
            started[device] = start(device, env=env, sycl_rules=sycl_rules)
        elif device == "cpu" or device in available:
            started[device] = start(device, env=env)
        else:
            unusable = f"torch.{device}.is_available() is False"
            probe = device_probe.DeviceProbe(device_probe.device_label(device), unusable=unusable)
            started[device] = _Known(ChildRun(probe))
    return started
