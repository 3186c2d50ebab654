"""Turn the extension on and off for a device, without patching Inductor.

``enable(device)`` registers, for that device, ``GraphTreeWrapperCodegen`` as the Python
wrapper codegen, our ``DeviceOpOverrides`` subclass, and a cache-key pass; the device's
stock scheduling, C++/FX wrappers, custom pass and config are passed through untouched.
``disable(device)`` puts back exactly what was registered before. Both are idempotent.

Two registration traps are avoided (see ``../shared/notes/inductor-hooks.md``):
- ``register_backend_for_device`` resets the device's custom pass/config when they are not
  passed, and Inductor registers defaults lazily: we run ``init_backend_registration()``
  first and re-register from what is there;
- ``get_device_op_overrides`` loads the stock overrides lazily (2.13: over ours; 2.11: only
  when the table is empty): we force that load before registering ours.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

from torch._inductor.codegen import common

from .. import _settings
from .cache_key import CacheKeyPass
from .device_ops import OP_OVERRIDES
from .wrapper import GraphTreeWrapperCodegen

SUPPORTED_DEVICES = tuple(OP_OVERRIDES)
DEVICES_VARIABLE = "INDUCTOR_XPUGRAPH_DEVICES"
DEVICES_ACCEPTED = f"a comma-separated list of {', '.join(SUPPORTED_DEVICES)} (empty: none)"


@dataclasses.dataclass(frozen=True)
class _StockRegistration:
    codegen: common.DeviceCodegen
    custom_pass: Any
    custom_config: Any
    op_overrides: common.DeviceOpOverrides


_stock: dict[str, _StockRegistration] = {}
_lock = threading.Lock()


def enable(device: str) -> None:
    device = _check_device(device)
    with _lock:
        if device in _stock:
            return
        _load_stock_registrations()
        stock = _StockRegistration(
            codegen=common.device_codegens[device],
            custom_pass=common.custom_backend_passes.get(device),
            custom_config=common.custom_backend_codegen_configs.get(device),
            op_overrides=common.device_op_overrides_dict[device],
        )
        common.register_backend_for_device(
            device,
            stock.codegen.scheduling,
            GraphTreeWrapperCodegen,
            stock.codegen.cpp_wrapper_codegen,
            stock.codegen.fx_wrapper_codegen,
            device_custom_pass=CacheKeyPass(device, wrapped=stock.custom_pass),
            device_custom_config=stock.custom_config,
        )
        common.register_device_op_overrides(device, OP_OVERRIDES[device]())
        _stock[device] = stock


def disable(device: str) -> None:
    device = _check_device(device)
    with _lock:
        stock = _stock.pop(device, None)
        if stock is None:
            return
        common.register_backend_for_device(
            device,
            stock.codegen.scheduling,
            stock.codegen.wrapper_codegen,
            stock.codegen.cpp_wrapper_codegen,
            stock.codegen.fx_wrapper_codegen,
            device_custom_pass=stock.custom_pass,
            device_custom_config=stock.custom_config,
        )
        common.register_device_op_overrides(device, stock.op_overrides)


def enable_from_environment() -> None:
    """``import inductor_xpugraph``: enable the devices ``INDUCTOR_XPUGRAPH_DEVICES`` names
    (default "xpu"). A value that names a device it does not know is refused
    (``_settings.refuse``) before anything is enabled: a bad value applies nothing."""
    try:
        devices = devices_named(os.environ.get(DEVICES_VARIABLE, "xpu"))
    except ValueError as error:
        _settings.refuse(DEVICES_VARIABLE, f"{error}; it takes {DEVICES_ACCEPTED}")
        return
    for device in devices:
        enable(device)


def devices_named(value: str) -> list[str]:
    """The devices an ``INDUCTOR_XPUGRAPH_DEVICES`` value names; ValueError for a name that is
    not among ``SUPPORTED_DEVICES``."""
    devices = [d for d in (d.strip() for d in value.split(",")) if d]
    unknown = [d for d in devices if d not in SUPPORTED_DEVICES]
    if unknown:
        raise ValueError(
            f"{DEVICES_VARIABLE}={value!r}: {', '.join(map(repr, unknown))} is not a device"
        )
    return devices


def enabled_devices() -> tuple[str, ...]:
    return tuple(_stock)


def _check_device(device: str) -> str:
    if not isinstance(device, str) or device not in SUPPORTED_DEVICES:
        raise ValueError(
            f"inductor_xpugraph can be enabled for {SUPPORTED_DEVICES} "
            f"('cpu' is the emulator for tests and demos), got {device!r}"
        )
    return device


def _load_stock_registrations() -> None:
    common.init_backend_registration()
    # Importing these modules registers the stock overrides; the lookup marks the lazy
    # initialisation done (2.13), so it never runs again over ours.
    from torch._inductor.codegen import (
        cpu_device_op_overrides,  # noqa: F401
        mps_device_op_overrides,  # noqa: F401
    )
    from torch._inductor.codegen.cuda import device_op_overrides  # noqa: F401
    from torch._inductor.codegen.mtia import device_op_overrides as _mtia  # noqa: F401
    from torch._inductor.codegen.xpu import device_op_overrides as _xpu  # noqa: F401

    common.get_device_op_overrides("cpu")
