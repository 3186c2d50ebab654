"""The recording mode of this process's xpu devices, and how it was found.

``xpu_recording.decide`` is the one place the mode is decided, from what it is given; this
module gives it what the running torch says of a device: the setting, the SYCL compiler the
build names, the device's name (Data Center GPU Max), and a probe of the device
(``recording_probe``), run once per process and device. It keeps each decision for
``report()``.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

import torch

from ... import config
from .devices import DEVICES
from .recording_probe import ProbeResult, recording_probed
from .xpu_recording import Decision, decide, is_data_center_max


@functools.cache
def build_sycl_compiler() -> int | None:
    """The SYCL_COMPILER_VERSION this torch was built with (``torch.__config__.show()``,
    pytorch#174661), or None where it does not say (a build without XPU)."""
    try:
        shown = torch.__config__.show()
    except Exception:
        return None
    found = re.search(r"SYCL_COMPILER_VERSION\D{0,8}(\d{8})", shown)
    return int(found.group(1)) if found else None


# The decisions made for this process's xpu devices (torch's, not a stand-in), for ``report()``.
_decisions: dict[str, Decision] = {}
_decisions_lock = threading.Lock()


def device_recording(
    release: tuple[int, int],
    device_index: int = 0,
    *,
    module: Any = None,
    setting: str | None = None,
    captures_key: str | None = None,
) -> Decision:
    """How torch ``release``'s ``XPUGraph`` records on xpu device ``device_index`` of this
    process (``module``: the device module, ``torch.xpu`` by default; ``captures_key``: the
    device as the package's captures on it name it, "xpu:0" by default), and how that was
    found (module docstring): ``setting`` is ``config.xpu_recording`` by default; the probe
    runs once per process and device (``recording_probe``), never where the device module has
    no device. Never raises."""
    module = torch.xpu if module is None else module
    setting = config.xpu_recording if setting is None else setting
    name = ""
    available = False
    try:
        available = bool(module.is_available()) and device_index < module.device_count()
        if available and module is torch.xpu:
            name = torch.xpu.get_device_properties(device_index).name
    except Exception:  # no xpu device in this process (fake devices, codegen on the CPU)
        available = False

    def probe() -> Any:
        if not available:
            return ProbeResult(None, f"no xpu device {device_index} in this process", ran=False)
        if module is not torch.xpu:
            return recording_probed(module, device_index, captures_key=captures_key)
        return recording_probed(
            module,
            device_index,
            captures_key=captures_key,
            end_allocate_to_pool=getattr(torch._C, "_xpu_endAllocateToPool", None),
            failure_leaves_host_routing=DEVICES["xpu"].failure_leaves_host_routing,
        )

    decision = decide(
        release,
        setting=setting,
        data_center_max=is_data_center_max(name),
        sycl_compiler=build_sycl_compiler() if module is torch.xpu else None,
        probe=probe,
    )
    if available and module is torch.xpu:
        with _decisions_lock:
            _decisions[f"xpu:{device_index}"] = decision
    return decision


def device_recording_mode(release: tuple[int, int], device_index: int = 0) -> str:
    """``device_recording``'s mode."""
    return device_recording(release, device_index).mode


def decisions() -> dict[str, Decision]:
    """The latest decision made for each device of this process that has one ("xpu:0")."""
    with _decisions_lock:
        return dict(_decisions)
