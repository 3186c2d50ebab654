"""Graph trees for ``torch.compile(mode="reduce-overhead")`` on Intel GPUs, cuda and a CPU emulator.

Importing this package registers, for device "xpu", an Inductor Python wrapper codegen whose
generated modules capture their compiled code into device graphs and replay it. Graphs are
used exactly where a CUDA user expects them: when Inductor's own switch is on
(``mode="reduce-overhead"`` or ``torch._inductor.config.triton.cudagraphs = True``).

Public API:
- ``enable(device)`` / ``disable(device)`` for "xpu", "cuda", "cpu" (the CPU emulator: for
  tests and demos, never faster); ``enable`` warns once where this process cannot run the
  device. ``INDUCTOR_XPUGRAPH_DEVICES=xpu,cuda`` does the same at import, silently (default:
  "xpu"; an empty value enables nothing).
- ``stats()``: counters (warmups, records, replays, rerecords, fallbacks, skips and their
  reasons, pool bytes). ``reset()``: drop every graph and pool, zero the counters.
- ``report()``: every tree, callable and event (skips, fallbacks, re-records) with the
  user's source lines, as data, text (``print(report())``) or a picture
  (``report("tree.png")``); ``INDUCTOR_XPUGRAPH_REPORT=1`` prints it at exit.
- ``mark_step_begin()``: the next graphed call starts a new iteration (generation);
  ``torch.compiler.cudagraph_mark_step_begin()`` does the same.
- ``config``: a torch ConfigModule, part of Inductor's cache key.

A bad ``INDUCTOR_XPUGRAPH_*`` value is warned about once at import, naming the variable and what
it accepts, and ignored (the setting keeps its default; a bad device list enables nothing);
this package's own command line says it in one line instead, and ``python -m
inductor_xpugraph doctor`` reports it (``_settings`` says why).
"""

from __future__ import annotations

import importlib
from typing import Any

from . import _settings
from ._version import __version__

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


def _load_api() -> None:
    """Import the API (torch, the registration, the settings from the environment) into this
    package; what ``import inductor_xpugraph`` does, except under the command line, which
    calls it once its arguments are parsed."""
    config = importlib.import_module(".config", __name__)  # (not ``from .``: __getattr__)
    from .codegen import disable, enable_from_environment, enabled_devices
    from .diagnostics.report import counters as stats
    from .diagnostics.report import report, report_at_exit_if_asked
    from .enabling import enable
    from .trees import mark_step_begin, mark_warmup_incomplete, reset

    globals().update(
        config=config,
        disable=disable,
        enable=enable,
        enabled_devices=enabled_devices,
        mark_step_begin=mark_step_begin,
        mark_warmup_incomplete=mark_warmup_incomplete,
        report=report,
        reset=reset,
        stats=stats,
    )
    enable_from_environment()
    report_at_exit_if_asked()


if _settings.started_by_the_command_line:
    # ``python -m inductor_xpugraph`` or the ``inductor-xpugraph`` script: the command line
    # parses its arguments before anything imports torch (help and usage errors answer at
    # once), then loads the API for the command it runs.
    def __getattr__(name: str) -> Any:
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        _load_api()
        return globals()[name]

else:
    _load_api()
