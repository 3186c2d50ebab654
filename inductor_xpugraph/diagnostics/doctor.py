"""``python -m inductor_xpugraph doctor``: is this machine's stack right for graph trees?

Each check returns one ``Finding``: OK, WARN (works, with a limit worth knowing) or FAIL
(graphs will not work as expected), with what was found and, unless OK, what to do. The
command prints one line per finding and exits 1 when any check FAILs, else 0. Checks:

- torch: its version against the supported range;
- settings: each ``INDUCTOR_XPUGRAPH_*`` variable that ``import inductor_xpugraph`` reads holds
  a value it accepts (a bad one is warned about at import and ignored);
- per device (xpu, cuda): available or not, its name, the graph API the backend needs;
  no device at all is a WARN (only the CPU emulator runs: tests and demos);
- per xpu device: how torch's XPUGraph records there (command buffers or natively), and how
  that was found: from the setting, from the build, probed, or assumed from the release (a
  WARN: the probe could not tell; ``trees.backends.xpu_recording``);
- Triton, which Inductor needs to generate the kernels of an available device;
- where the CPU emulator is probed or enabled, the C++ compiler Inductor compiles its CPU
  kernels with (``cpp_compiler``: looked up as Inductor looks, never run);
- the stale-output error path: torch's binding, else the package's compiled module (found,
  never built here: ``python -m inductor_xpugraph build`` builds it), else copies or
  silently stale outputs;
- registration: the extension is enabled for each available device (and the emulator, when
  enabled) and Inductor would use our wrapper codegen for it;
- graphs, per device probed (each available xpu and cuda device; the CPU emulator when
  INDUCTOR_XPUGRAPH_DEVICES names it; or those given with ``--device``): a matmul, attention and
  a random op captured and replayed through this project's backend, in a child process
  (``device_probe``), and each operator of the device's do-not-capture list tried there. With
  ``--device cpu --sycl-rules RELEASE``, the CPU under SYCL Graph's rules as torch RELEASE's
  XPU runtime meets them (``sycl_rules.on_cpu``): what that release would refuse on an Intel
  GPU, shown on the stand-in (a first ``sycl rules`` line says so, with the stand-in's
  recording mode, how it was chosen, and what the recording probe finds on it), not an XPU
  measurement.

No check raises: one that does is a FAIL line with its error. A bad setting is a FAIL line:
``python -m inductor_xpugraph`` imports the package before it runs, and that import, which
warns about a bad ``INDUCTOR_XPUGRAPH_*`` value and ignores it in any other program, ignores it
silently there and leaves it to this check (``_settings``). The settings check reads the
environment afresh, so ``doctor.main()`` in a process whose environment changed after the
import reports what a new import would refuse; the probe's child runs without the refused
variables.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch

from ..trees.messages import first_line
from .findings import GRAPH_APIS, Finding, Status, available_devices

SUPPORTED_TORCH = ((2, 11), (2, 15))  # oldest and newest minor versions verified


def check_torch(version: str | None = None) -> Finding:
    version = version or torch.__version__
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return Finding("torch", Status.WARN, f"cannot read version {version!r}")
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_TORCH
    supported = f"{low_major}.{low_minor} to {high_major}.{high_minor}"
    if (major, minor) < (low_major, low_minor):
        return Finding(
            "torch",
            Status.FAIL,
            f"{version} is older than the supported range ({supported})",
            f"install torch {low_major}.{low_minor} or newer (device graph APIs and Inductor's "
            "wrapper registration this package needs appeared there)",
        )
    if (major, minor) > (high_major, high_minor):
        return Finding(
            "torch",
            Status.WARN,
            f"{version} is newer than the versions verified ({supported})",
            "run the test suite (python -m pytest) against it; report what fails",
        )
    return Finding("torch", Status.OK, f"{version} (supported: {supported})")


# device -> (torch module, the graph class its backend captures with)
def check_devices(devices: list[str]) -> list[Finding]:
    if not devices:
        return [
            Finding(
                "device",
                Status.WARN,
                "no xpu or cuda device is available; only the CPU emulator runs (tests and "
                "demos, never faster)",
                "on an Intel GPU machine install torch's XPU build and the GPU driver; check "
                "with python -c 'import torch; print(torch.xpu.is_available())'",
            )
        ]
    findings = []
    for device in devices:
        module_name, graph_class = GRAPH_APIS[device]
        module = getattr(torch, module_name)
        name = module.get_device_name(0)
        if hasattr(module, graph_class):
            findings.append(
                Finding(device, Status.OK, f"{name}; torch.{module_name}.{graph_class} present")
            )
        else:
            findings.append(
                Finding(
                    device,
                    Status.FAIL,
                    f"{name}; torch.{module_name}.{graph_class} is missing",
                    f"install a torch build with {device} graph support (2.11 or newer)",
                )
            )
    return findings


def check_triton(devices: list[str]) -> Finding:
    if importlib.util.find_spec("triton") is None:
        if devices:
            return Finding(
                "triton",
                Status.FAIL,
                "not installed; Inductor cannot generate kernels for " + ", ".join(devices),
                "install the Triton that matches your torch (torch's XPU wheels bring "
                "pytorch-triton-xpu; CUDA wheels bring triton)",
            )
        return Finding("triton", Status.OK, "not installed (not needed without a device)")
    import triton

    return Finding("triton", Status.OK, f"{triton.__version__}")


def check_cpp_compiler(emulator: bool) -> list[Finding]:
    """Where the CPU emulator is checked (``emulator``): the C++ compiler Inductor compiles
    the emulator's CPU kernels with, or a FAIL saying that there is none and how to get one
    (without it the emulator runs nothing that has a kernel of Inductor's)."""
    from . import cpp_compiler

    if not emulator:
        return []
    found = cpp_compiler.found()
    if found is not None:
        return [
            Finding(
                "C++ compiler (cpu)",
                Status.OK,
                f"{found}: Inductor compiles the CPU emulator's kernels with it",
            )
        ]
    return [
        Finding(
            "C++ compiler (cpu)",
            Status.FAIL,
            f"{cpp_compiler.NEEDED}; none found: looked for {cpp_compiler.searched()}",
            cpp_compiler.FIX,
        )
    ]


def check_stale_output_errors() -> Finding:
    """Which path turns held outputs of earlier steps into errors (``trees.invalidation``):
    torch's binding, else the package's compiled module (``native``; looked for, never built
    here), else copies or silently stale outputs."""
    from .. import native
    from ..trees.invalidation import cost_without_the_compiled_module

    has_binding = hasattr(torch._C, "_set_storage_access_error_msg")
    has_swap = hasattr(torch.UntypedStorage, "_swap_data_ptr_")
    if has_binding and has_swap:
        return Finding("stale-output errors", Status.OK, "torch's own binding and storage swap")
    found = native.find()
    if found is not None and native.load() is not None:
        return Finding("stale-output errors", Status.OK, f"the compiled module ({found})")
    why = native.missing()
    what = why.what if why else f"the compiled module at {found} does not load"
    fix = why.fix if why else f"Remove it and run `{native.BUILD_COMMAND}`."
    silent = not (has_binding or has_swap)  # kept outputs would hold overwritten data
    return Finding(
        "stale-output errors",
        Status.FAIL if silent else Status.WARN,
        f"{what}; {cost_without_the_compiled_module()}",
        fix,
    )


# Devices where stock reduce-overhead already records graph trees (upstream's).
_DEVICES_WITH_UPSTREAM_TREES = frozenset({"cuda"})


def check_registration(devices: list[str]) -> list[Finding]:
    from torch._inductor.codegen import common

    from ..codegen import enabled_devices
    from ..codegen.wrapper import GraphTreeWrapperCodegen

    findings = []
    for device in devices:
        if device not in enabled_devices():
            # On cuda, upstream's CUDA Graph Trees serve reduce-overhead: ours are opt-in there.
            opt_in = device in _DEVICES_WITH_UPSTREAM_TREES
            findings.append(
                Finding(
                    f"registration ({device})",
                    Status.WARN if opt_in else Status.FAIL,
                    "inductor_xpugraph is not enabled for this device: reduce-overhead runs "
                    + ("upstream's graph trees" if opt_in else "without our graphs"),
                    f"call inductor_xpugraph.enable({device!r}) or set "
                    f"INDUCTOR_XPUGRAPH_DEVICES={device} before importing the package"
                    + (" to use ours" if opt_in else ""),
                )
            )
            continue
        codegen = common.get_wrapper_codegen_for_device(device)
        if codegen is not None and issubclass(codegen, GraphTreeWrapperCodegen):
            findings.append(
                Finding(f"registration ({device})", Status.OK, "our wrapper codegen is in use")
            )
        else:
            findings.append(
                Finding(
                    f"registration ({device})",
                    Status.FAIL,
                    f"enabled, but Inductor's wrapper codegen for {device} is {codegen!r}",
                    "something registered another backend after inductor_xpugraph; enable "
                    "it again after that",
                )
            )
    return findings


# -- settings --------------------------------------------------------------------------------------

DEVICES_VARIABLE = "INDUCTOR_XPUGRAPH_DEVICES"  # (``codegen.registration`` reads it)


def setting_variable(name: str) -> str:
    """The environment variable of setting ``name`` of ``inductor_xpugraph.config``."""
    return "INDUCTOR_XPUGRAPH_" + name.upper()


def _accepted(name: str, default: object) -> str:
    """What setting ``name`` accepts from the environment, in words."""
    from .._settings import _FALSE, _TRUE, CHECKS

    if isinstance(default, bool):
        return "/".join(_TRUE + _FALSE)
    if isinstance(default, tuple):
        return "a comma-separated list of operator names (namespace::op or namespace::op.overload)"
    try:  # each check says what it accepts: "inductor_xpugraph.config.<name> must be ..., got"
        CHECKS[name](name, object())
    except ValueError as refusal:
        return str(refusal).split(" must be ", 1)[-1].rsplit(", got ", 1)[0]
    return f"what inductor_xpugraph.config.{name} accepts"


def bad_settings() -> dict[str, tuple[str, str]]:
    """Per ``INDUCTOR_XPUGRAPH_*`` variable of this process whose value ``import
    inductor_xpugraph`` refuses: why, and what it accepts."""
    from .. import _settings, config
    from ..codegen.registration import DEVICES_ACCEPTED, devices_named

    environ = os.environ
    bad = {}
    if DEVICES_VARIABLE in environ:
        try:
            devices_named(environ[DEVICES_VARIABLE])
        except ValueError as error:
            bad[DEVICES_VARIABLE] = (str(error), DEVICES_ACCEPTED)
    for name in _settings.CHECKS:
        variable = setting_variable(name)
        if name.startswith("_") or variable not in environ:
            continue
        default = getattr(config, name)
        try:
            _settings.environment_value(name, variable, default)
        except ValueError as error:
            bad[variable] = (str(error), _accepted(name, default))
    return bad


def check_settings() -> list[Finding]:
    """A FAIL per bad ``INDUCTOR_XPUGRAPH_*`` value, else an OK naming the settings given."""
    from .. import _settings

    bad = bad_settings()
    if bad:
        return [
            Finding(
                "settings",
                Status.FAIL,
                why,
                f"{variable} accepts {accepted}; until it is fixed or unset, import "
                "inductor_xpugraph warns and ignores it",
            )
            for variable, (why, accepted) in bad.items()
        ]
    settings = [name for name in _settings.CHECKS if not name.startswith("_")]
    variables = [DEVICES_VARIABLE] + [setting_variable(name) for name in settings]
    given = [f"{name}={os.environ[name]!r}" for name in variables if name in os.environ]
    if not given:
        return [Finding("settings", Status.OK, "defaults (no INDUCTOR_XPUGRAPH_* setting given)")]
    return [Finding("settings", Status.OK, "valid: " + ", ".join(given))]


def check_upstream_settings() -> list[Finding]:
    """Upstream's settings of its trees, as this process has them: an OK line naming those
    honoured here and those with no effect, and a WARN per setting with no effect that is set
    (a script that calls ``diagnose()`` after configuring sees its own), and for
    ``cudagraph_or_error`` where Inductor raises on the graphs we capture."""
    import torch

    from ..trees.recording_policy import HONOURED, NOT_APPLIED, upstream_settings_set

    triton = torch._inductor.config.triton
    honoured = [name for name in HONOURED if hasattr(triton, name)]  # this torch's
    no_effect = [name for name in NOT_APPLIED if hasattr(triton, name)]
    findings = [
        Finding(
            "upstream settings",
            Status.OK,
            f"mean the same here: {', '.join(honoured) or 'none'}; no effect: "
            f"{', '.join(no_effect) or 'none'} (triton.*, docs/upstream-settings.md)",
        )
    ]
    for name in upstream_settings_set():
        if name in NOT_APPLIED:
            findings.append(
                Finding(
                    "upstream settings",
                    Status.WARN,
                    f"triton.{name} is set and has no effect here: {NOT_APPLIED[name]}",
                )
            )
        elif name == "cudagraph_or_error":
            # Inductor logs its own skip of a graph it leaves to us for cuda graphs, and for
            # every GPU's from torch 2.15, and raises there with this setting.
            release = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
            devices = "cuda and xpu" if release >= (2, 15) else "cuda"
            findings.append(
                Finding(
                    "upstream settings",
                    Status.WARN,
                    f"triton.cudagraph_or_error is set: on {devices} Inductor raises on every "
                    f"graph this package captures (it counts them as skipped by its own "
                    f"cudagraphs); leave it unset there",
                )
            )
    return findings


# -- the command -----------------------------------------------------------------------------------


def _guarded(check: str, run: Callable[[], Finding | list[Finding]]) -> list[Finding]:
    """``run()``'s findings; a check that raises is a FAIL line, never a traceback."""
    try:
        found = run()
    except Exception as error:
        return [
            Finding(
                check,
                Status.FAIL,
                f"the check raised {first_line(error)}",
                "an unusual installation, or a bug of the doctor: report this output",
            )
        ]
    return found if isinstance(found, list) else [found]


def _guarded_value(run: Callable[[], Any], default: Any) -> Any:
    try:
        return run()
    except Exception:  # reported by the check that calls it
        return default


def check_sycl_rules(release: str) -> Finding:
    """The first line of a doctor run under ``--sycl-rules``: what its probe lines are, the
    stand-in's recording mode and how it was chosen, and what the recording probe
    (``recording_probe``) finds on the stand-in: WARN where it finds another mode or none."""
    from ..sycl_rules.releases import rule_set
    from ..sycl_rules.torch_xpu import StandInXpu
    from ..trees.backends.recording_probe import probe_recording_mode
    from ..trees.backends.xpu_recording import decide
    from .probe_report import stand_in_words

    rules, recording = rule_set(release)
    chosen = decide(
        rules.number,
        setting=recording or "auto",
        set_by=f"chosen with --sycl-rules {release}",
    )
    probed = probe_recording_mode(StandInXpu(rules, recording), captures_key="cpu:0")
    took = f"{probed.seconds * 1e3:.1f} ms"
    if probed.mode == chosen.mode:
        status, found = Status.OK, f"finds {probed.mode} too ({took})"
    elif probed.mode is None:
        status, found = Status.WARN, f"cannot tell ({took}): {probed.why}"
    else:
        status, found = Status.WARN, f"finds {probed.mode} ({took}): {probed.why}"
    return Finding(
        "sycl rules",
        status,
        f"{stand_in_words(release)}; recording: {chosen.mode}: {chosen.why} ({chosen.found}); "
        f"the recording probe on the stand-in {found}. The graphs and do-not-capture list "
        "lines below say what records there and why, in SYCL's words; not speed, nor any "
        "kernel's own behaviour",
        "" if status is Status.OK else "a bug of the stand-in or of the probe: report it",
    )


def check_xpu_recording(devices: list[str]) -> list[Finding]:
    """How torch's XPUGraph records on each xpu device here (``xpu_recording``), and how that
    was found: WARN where only assumed from the release (the probe could not tell)."""
    if "xpu" not in devices:
        return []
    from ..trees.backends.device_recording import device_recording
    from ..trees.backends.devices import torch_release
    from ..trees.backends.xpu_recording import ASSUMED

    findings = []
    for index in range(torch.xpu.device_count()):
        decision = device_recording(torch_release(), index)
        assumed = decision.found == ASSUMED
        findings.append(
            Finding(
                "xpu recording",
                Status.WARN if assumed else Status.OK,
                f"xpu:{index}: {decision.line()}",
                "where you know how this build records, set it: "
                "INDUCTOR_XPUGRAPH_XPU_RECORDING=command-buffer or =native"
                if assumed
                else "",
            )
        )
    return findings


NOTHING_TO_PROBE = (
    "no xpu or cuda device to probe; `doctor --device cpu` probes the CPU emulator "
    "(the runtime, not a device)"
)


def diagnose(
    probe_devices: list[str] | None = None,
    probe: bool = True,
    probe_timeout: float | None = None,
    sycl_rules: str | None = None,
) -> list[Finding]:
    """Every check. ``probe_devices``: the devices whose graphs are probed (default: each
    available device, and the CPU emulator when enabled); none when ``device_probe`` is False.
    ``probe_timeout``: seconds each probe may take (``probe_report.PROBE_TIMEOUT``).
    ``sycl_rules``: a torch release ("2.13"): the CPU's probe runs under its SYCL Graph rules
    (``sycl_rules.on_cpu``), standing in for an xpu device; ValueError for a release it has
    no rules of."""
    from ..codegen import enabled_devices
    from . import probe_report
    from .report import not_enabled_hint

    if sycl_rules is not None:
        from ..sycl_rules.releases import rule_set

        rule_set(sycl_rules)  # raises, naming the releases it has rules of

    settings = _guarded("settings", check_settings)
    devices = available_devices()
    running: dict[str, Any] = {}

    def start_probes() -> list[Finding]:  # first: they run while the other checks do
        chosen = probe_devices or probe_report.default_probe_devices()
        leave_out = set(_guarded_value(bad_settings, {}))  # the settings line says why
        running.update(probe_report.start_probes(chosen, leave_out, sycl_rules))
        return []

    not_started = _guarded("graphs", start_probes) if probe else []
    emulator = ["cpu"] if "cpu" in enabled_devices() else []
    checks_the_emulator = bool(emulator) or "cpu" in (probe_devices or [])
    findings = [
        *([check_sycl_rules(sycl_rules)] if sycl_rules else []),
        *_guarded("torch", check_torch),
        *settings,
        *_guarded("device", lambda: check_devices(devices)),
        *_guarded("xpu recording", lambda: check_xpu_recording(devices)),
        *_guarded("triton", lambda: check_triton(devices)),
        *_guarded("C++ compiler (cpu)", lambda: check_cpp_compiler(checks_the_emulator)),
        *_guarded("stale-output errors", check_stale_output_errors),
        *_guarded("upstream settings", check_upstream_settings),
        *_guarded("registration", lambda: check_registration(devices + emulator)),
    ]
    findings += not_started
    hint = _guarded_value(not_enabled_hint, None)  # in a process that compiled: see report
    if hint is not None:
        findings.append(Finding("registration", Status.WARN, hint))
    if not probe:
        findings.append(Finding("graphs", Status.OK, "not probed (--no-probe): nothing captured"))
    elif not running and not not_started:
        findings.append(Finding("graphs", Status.OK, NOTHING_TO_PROBE))
    timeout = probe_report.PROBE_TIMEOUT if probe_timeout is None else probe_timeout
    for device, child in running.items():
        rules = sycl_rules if device == "cpu" else None
        findings += _guarded(
            f"graphs ({probe_report.where(device, rules)})",
            lambda: probe_report.probe_findings(device, child.result(timeout), rules),
        )
    return findings


def main(
    probe_devices: list[str] | None = None,
    probe: bool = True,
    probe_timeout: float | None = None,
    sycl_rules: str | None = None,
) -> int:
    """Print one line per finding and a count; 1 when any check FAILs, else 0."""
    findings = diagnose(probe_devices, probe, probe_timeout, sycl_rules)
    for finding in findings:
        print(finding.line())
    failed = [f for f in findings if f.status is Status.FAIL]
    print(f"\n{len(failed)} FAIL, {sum(f.status is Status.WARN for f in findings)} WARN")
    return 1 if failed else 0
