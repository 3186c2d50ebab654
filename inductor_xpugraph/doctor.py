"""``python -m inductor_xpugraph doctor``: is this machine's stack right for graph trees?

Each check returns one ``Finding``: OK, WARN (works, with a limit worth knowing) or FAIL
(graphs will not work as expected), with what was found and, unless OK, what to do. The
command prints one line per finding and exits 1 when any check FAILs, else 0. Checks:

- torch: its version against the supported range;
- per device (xpu, cuda): available or not, its name, the graph API the backend needs;
  no device at all is a WARN (only the CPU emulator runs: tests and demos);
- Triton, which Inductor needs to generate the kernels of an available device;
- the stale-output error path: torch's binding, else the C++ extension (built on first use,
  cached by torch), else copies or silently stale outputs;
- registration: the extension is enabled for each available device (and the emulator, when
  enabled) and Inductor would use our wrapper codegen for it.
"""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import dataclass

import torch

SUPPORTED_TORCH = ((2, 11), (2, 15))  # oldest and newest minor versions verified


class Status(enum.Enum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    detail: str
    advice: str = ""

    def line(self) -> str:
        text = f"{self.status.value:<4}  {self.check}: {self.detail}"
        return f"{text}\n      -> {self.advice}" if self.advice else text


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
_GRAPH_APIS = {"xpu": ("xpu", "XPUGraph"), "cuda": ("cuda", "CUDAGraph")}


def available_devices() -> list[str]:
    return [
        device
        for device, (module, _) in _GRAPH_APIS.items()
        if getattr(torch, module, None) is not None and getattr(torch, module).is_available()
    ]


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
        module_name, graph_class = _GRAPH_APIS[device]
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


def check_stale_output_errors() -> Finding:
    """Which path turns held outputs of earlier steps into errors (``trees.invalidation``)."""
    from .trees import invalidation

    if hasattr(torch._C, "_set_storage_access_error_msg"):
        return Finding("stale-output errors", Status.OK, "torch's own binding")
    if invalidation.tensor_invalidator() is not None:
        return Finding(
            "stale-output errors", Status.OK, "the C++ extension (built, cached by torch)"
        )
    if invalidation.can_copy_out_of_pool():
        return Finding(
            "stale-output errors",
            Status.WARN,
            "the C++ extension cannot be built: held outputs are copied out of the graph "
            "pool instead (correct, a copy per held output and step)",
            "install a C++ compiler and torch's headers so that the extension can be built",
        )
    return Finding(
        "stale-output errors",
        Status.FAIL,
        "no binding, no extension, no storage swap: an output kept across steps would "
        "silently hold overwritten data",
        "install a C++ compiler (the extension needs it), or torch 2.13 or newer",
    )


# Devices where stock reduce-overhead already records graph trees (upstream's).
_DEVICES_WITH_UPSTREAM_TREES = frozenset({"cuda"})


def check_registration(devices: list[str]) -> list[Finding]:
    from torch._inductor.codegen import common

    from .codegen import enabled_devices
    from .codegen.wrapper import GraphTreeWrapperCodegen

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


def diagnose() -> list[Finding]:
    from .codegen import enabled_devices

    devices = available_devices()
    emulator = ["cpu"] if "cpu" in enabled_devices() else []
    return [
        check_torch(),
        *check_devices(devices),
        check_triton(devices),
        check_stale_output_errors(),
        *check_registration(devices + emulator),
    ]


def main() -> int:
    import inductor_xpugraph  # noqa: F401  (registration from the environment, as a user has)

    findings = diagnose()
    for finding in findings:
        print(finding.line())
    failed = [f for f in findings if f.status is Status.FAIL]
    print(f"\n{len(failed)} FAIL, {sum(f.status is Status.WARN for f in findings)} WARN")
    return 1 if failed else 0
