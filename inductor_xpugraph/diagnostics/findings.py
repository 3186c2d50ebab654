"""What a diagnosis is made of: one ``Finding`` per check (OK, WARN or FAIL, what was found,
what to do), and the devices there are to check. The doctor's checks and the device probe's
report both speak in findings; neither imports the other for them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


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


# The graph API the backend needs, per device: (torch module, graph class).
GRAPH_APIS = {"xpu": ("xpu", "XPUGraph"), "cuda": ("cuda", "CUDAGraph")}


def available_devices() -> list[str]:
    return [device for device, (module, _) in GRAPH_APIS.items() if _is_available(module)]


def _is_available(module_name: str) -> bool:
    module = getattr(torch, module_name, None)
    try:
        return module is not None and module.is_available()
    except Exception:  # a broken driver: check_devices says nothing is available
        return False
