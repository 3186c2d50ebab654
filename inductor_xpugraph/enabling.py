"""``inductor_xpugraph.enable(device)`` as a user calls it: the registration
(``codegen.registration.enable``) and, where this process cannot run the device, a warning
naming what is missing, once per device and process.

Enabling a device this process lacks is accepted, not refused: it changes nothing here, and
code that enables the device it will deploy on (``enable("cuda")`` in a script that also runs
on a laptop) keeps running. It is said, because such a call otherwise passes without a word
and the model then runs without graphs (every counter of ``stats()`` stays zero). The import's
own enabling (``INDUCTOR_XPUGRAPH_DEVICES``, xpu by default, on every machine) goes straight to
the registration and says nothing.
"""

from __future__ import annotations

import threading
import warnings

import torch
from torch._dynamo import device_interface

from .codegen import registration

_warned: set[str] = set()  # devices warned about in this process
_lock = threading.Lock()


def enable(device: str) -> None:
    """Use this package's graph trees for ``device`` ("xpu", "cuda", or "cpu": the CPU
    emulator) in code compiled from now on; idempotent. ValueError for another name; a
    warning, once, where this process cannot run ``device``."""
    registration.enable(device)
    missing = device_missing(device)
    if not missing:
        return
    with _lock:
        if device in _warned:
            return
        _warned.add(device)
    warnings.warn(
        f"inductor_xpugraph.enable({device!r}): {missing}, so nothing is compiled for "
        f"{device} in this process and this call changes nothing here; "
        "inductor_xpugraph.enable('cpu') runs the CPU emulator (tests and demos)",
        stacklevel=2,
    )


def device_missing(device: str) -> str:
    """What this process lacks to run ``device`` (its torch build, or a device torch sees), in
    words; "" where it can (the CPU always can). Asked as Inductor asks: through the device's
    interface (``torch._dynamo.device_interface``)."""
    if device == "cpu":
        return ""
    try:
        if device_interface.get_interface_for_device(device).is_available():
            return ""
    except Exception:  # a broken driver: said as no device
        pass
    if device == "cuda" and torch.version.cuda is None and torch.version.hip is None:
        return f"this torch ({torch.__version__}) is built without CUDA"
    if device == "xpu" and not torch.xpu._is_compiled():
        return f"this torch ({torch.__version__}) is built without XPU"
    return (
        f"this torch ({torch.__version__}) sees no {device} device "
        f"(torch.{device}.is_available() is False)"
    )
