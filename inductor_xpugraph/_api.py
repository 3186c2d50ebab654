"""The package's public API, imported by ``inductor_xpugraph`` (see its docstring): at once,
or, for the command line, once its arguments are parsed (``inductor_xpugraph._load_api``)."""

from __future__ import annotations

import os

# The names of the package's ``__all__``, which ``inductor_xpugraph._load_api`` copies out.
from . import _settings, config  # noqa: F401
from ._version import __version__  # noqa: F401
from .codegen import SUPPORTED_DEVICES, disable, enable, enabled_devices  # noqa: F401
from .report import report, report_at_exit_if_asked  # noqa: F401
from .trees import mark_step_begin, mark_warmup_incomplete, reset  # noqa: F401
from .trees import snapshot as stats  # noqa: F401

_DEVICES_ENV = "INDUCTOR_XPUGRAPH_DEVICES"


def _enable_from_environment() -> None:
    requested = os.environ.get(_DEVICES_ENV, "xpu")
    devices = [d for d in (d.strip() for d in requested.split(",")) if d]
    unknown = [d for d in devices if d not in SUPPORTED_DEVICES]
    if unknown:  # checked before anything is enabled: a bad value applies nothing
        why = f"{_DEVICES_ENV}={requested!r}: {unknown} not among {SUPPORTED_DEVICES}"
        _settings.refuse(_DEVICES_ENV, why)
        return
    for device in devices:
        enable(device)


_enable_from_environment()
report_at_exit_if_asked()
