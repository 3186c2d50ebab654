"""Graph trees for ``torch.compile(mode="reduce-overhead")`` on Intel GPUs, cuda and a CPU emulator.

Importing this package registers, for device "xpu", an Inductor Python wrapper codegen whose
generated modules capture their compiled code into device graphs and replay it. Graphs are
used exactly where a CUDA user expects them: when Inductor's own switch is on
(``mode="reduce-overhead"`` or ``torch._inductor.config.triton.cudagraphs = True``).

Public API:
- ``enable(device)`` / ``disable(device)`` for "xpu", "cuda", "cpu" (the CPU emulator: for
  tests and demos, never faster); ``INDUCTOR_XPUGRAPH_DEVICES=xpu,cuda`` does the same at
  import (default: "xpu"; an empty value enables nothing).
- ``stats()``: counters (warmups, records, replays, rerecords, fallbacks, skips and their
  reasons, pool bytes). ``reset()``: drop every graph and pool, zero the counters.
- ``report()``: every tree, callable and event (skips, fallbacks, re-records) with the
  user's source lines, as data, text (``print(report())``) or a picture
  (``report("tree.png")``); ``INDUCTOR_XPUGRAPH_REPORT=1`` prints it at exit.
- ``mark_step_begin()``: the next graphed call starts a new iteration (generation);
  ``torch.compiler.cudagraph_mark_step_begin()`` does the same.
- ``config``: a torch ConfigModule, part of Inductor's cache key.

A bad ``INDUCTOR_XPUGRAPH_*`` value makes the import raise ValueError naming the variable and
what it accepts, and applies nothing; only this package's own command line records it instead,
so that ``python -m inductor_xpugraph doctor`` can report it (``_settings`` says why).
"""

from __future__ import annotations

import os

from . import _settings, config
from ._version import __version__
from .codegen import SUPPORTED_DEVICES, disable, enable, enabled_devices
from .report import report, report_at_exit_if_asked
from .trees import mark_step_begin, mark_warmup_incomplete, reset
from .trees import snapshot as stats

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

__all__ = [
    "__version__",
    "config",
    "disable",
    "enable",
    "enabled_devices",
    "mark_step_begin",
    "mark_warmup_incomplete",
    "report",
    "reset",
    "stats",
]
