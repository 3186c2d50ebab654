"""How torch's ``XPUGraph`` records on an Intel GPU: through SYCL Graph's command buffers, or
natively through Level Zero. The two record different work, so what is partitioned out of a
graph (``unrecordable_ops``) depends on which one a device uses.

- *Command-buffer* recording (``sycl_ext_oneapi_graph`` record-and-replay): SYCL turns each
  submission to a recording queue into a node of its own graph, and checks every dependency.
  torch 2.11-2.13 record this way everywhere.
- *Native* recording (``property::graph::enable_native_recording``, spec and implementation in
  intel/llvm#21616 and #21626, 2026-03): the queue's Level Zero immediate command list captures
  whatever is appended to it, through SYCL or straight through Level Zero. Its limits
  (``sycl/doc/extensions/experimental/sycl_ext_oneapi_graph.asciidoc``, "Limitations of Native
  Recording"; ``sycl/source/detail/graph/graph_impl.cpp``): one ``begin_recording`` with one
  in-order queue per graph; no ``update()``, no ``async_malloc``, no ``get_nodes()``, no
  ``handler::host_task``; events signalled inside the graph are not for use outside it.
  Level Zero decides what is legal, and its refusals come back as ``errc::runtime``.

How torch chooses (``recording_mode``): ``XPUGraph::capture_begin`` asks for native recording
when torch is built with oneAPI >= 2026.1 (pytorch/pytorch#188874, torch 2.14), except on Data
Center GPU Max (PVC, ``XPU_GRAPH_IS_PVC_ARCHITECTURE`` in ``aten/src/ATen/xpu/XPUGraph.cpp``);
``SYCL_GRAPH_FORCE_NATIVE_RECORDING=1`` makes SYCL record every graph natively
(intel/llvm#22053, a oneAPI 2026.1 runtime). Read from public sources, not run on an Intel GPU.
A copy of a later PyTorch main also compiles native recording out of builds with XCCL
(``#if !defined(USE_C10D_XCCL)``, "Native recording is incompatible with dynamically adding
the XCCL queue"); whether a release ships that form is not known here, so it is not assumed.
Which form the released 2.14 and 2.15 wheels ship is not settled by any source read here.

So the package finds the mode of an xpu device of this process (``device_recording``) from
the running torch, in this order, and says how (``Decision.found``):

1. "from the setting": ``config.xpu_recording`` when it is not "auto";
2. "from the build", where the build settles it: a torch before 2.14, or one whose SYCL
   compiler predates oneAPI 2026.1 (``torch.__config__.show()``), has no native recording;
   ``SYCL_GRAPH_FORCE_NATIVE_RECORDING=1`` makes every graph native;
3. "probed": a throw-away capture on a side stream of the device, whose host wait fails
   differently in the two modes (``recording_probe``), once per process and device;
4. "assumed from the release", where the probe could not tell (no device, a capture open, an
   answer it does not know, said with the mode): the rules above, by torch release and
   device name.

``decide`` is the one place that decides; ``recording_mode`` is its answer for a release and
device without a probe (the stand-in of ``sycl_rules`` is built with it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

COMMAND_BUFFER = "command-buffer"
NATIVE = "native"
RECORDING_MODES = (COMMAND_BUFFER, NATIVE)

#: intel/llvm#22053: "1" makes every ``command_graph`` record natively.
FORCE_NATIVE = "SYCL_GRAPH_FORCE_NATIVE_RECORDING"
#: The first torch release whose ``XPUGraph`` asks for native recording (pytorch#188874).
FIRST_NATIVE_RELEASE = (2, 14)
#: The first SYCL compiler (oneAPI 2026.1) with ``property::graph::enable_native_recording``:
#: pytorch#188874 asks for native recording ``#if SYCL_COMPILER_VERSION >= 20260100``.
FIRST_NATIVE_SYCL_COMPILER = 20260100

# How a mode was found (``Decision.found``), most certain first.
FROM_SETTING = "from the setting"
FROM_BUILD = "from the build"
PROBED = "probed"
ASSUMED = "assumed from the release"
HOW_FOUND = (FROM_SETTING, FROM_BUILD, PROBED, ASSUMED)


class Decision(NamedTuple):
    """A recording mode, how it was found (``HOW_FOUND``), and why, in words."""

    mode: str
    found: str
    why: str

    def line(self) -> str:
        """The decision in one line: "native, probed: <why>"."""
        return f"{self.mode}, {self.found}: {self.why}"


def decide(
    release: tuple[int, int],
    *,
    setting: str = "auto",
    set_by: str | None = None,
    data_center_max: bool = False,
    environ: Mapping[str, str] = os.environ,
    sycl_compiler: int | None = None,
    probe: Callable[[], Any] | None = None,
) -> Decision:
    """The one place the mode is decided (module docstring): ``setting`` (a mode, or "auto";
    ``set_by``: who chose it, in words, where not ``config.xpu_recording``); what the build
    says (``release``, ``sycl_compiler``: its SYCL_COMPILER_VERSION where known, ``environ``);
    else ``probe()`` (a ``recording_probe.ProbeResult``, asked only here, only when needed);
    else the assumption for ``release`` on a device that is (``data_center_max``) or is not a
    Data Center GPU Max."""
    version = f"{release[0]}.{release[1]}"
    if setting != "auto":
        return Decision(
            setting, FROM_SETTING, set_by or f"inductor_xpugraph.config.xpu_recording = {setting!r}"
        )
    if release < FIRST_NATIVE_RELEASE:  # its oneAPI predates native recording
        return Decision(
            COMMAND_BUFFER,
            FROM_BUILD,
            f"torch {version}'s XPUGraph records through SYCL Graph's command buffers",
        )
    if sycl_compiler is not None and sycl_compiler < FIRST_NATIVE_SYCL_COMPILER:
        return Decision(
            COMMAND_BUFFER,
            FROM_BUILD,
            f"this torch was built with SYCL compiler {sycl_compiler}, before oneAPI 2026.1's "
            "native recording (pytorch/pytorch#188874 asks for it from 20260100)",
        )
    if environ.get(FORCE_NATIVE) == "1":
        return Decision(
            NATIVE,
            FROM_BUILD,
            f"{FORCE_NATIVE}=1 makes SYCL record every graph natively (intel/llvm#22053)",
        )
    untold = ""
    if probe is not None:
        found = probe()
        if found.mode in RECORDING_MODES:
            return Decision(
                found.mode,
                PROBED,
                f"{found.why} (a throw-away capture on a side stream, "
                f"{found.seconds * 1e3:.1f} ms)",
            )
        untold = f"; the probe could not tell: {found.why}"
    if data_center_max:
        return Decision(
            COMMAND_BUFFER,
            ASSUMED,
            f"torch {version}'s XPUGraph keeps command buffers on Data Center GPU Max (PVC); "
            f"{FORCE_NATIVE}=1 would force native recording{untold}",
        )
    return Decision(
        NATIVE,
        ASSUMED,
        f"torch {version}'s XPUGraph records through Level Zero on a client GPU "
        f"(pytorch/pytorch#188874; Data Center GPU Max keeps command buffers){untold}",
    )


def recording_mode(
    release: tuple[int, int],
    *,
    data_center_max: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """The recording mode of torch ``release``'s ``XPUGraph`` on a device (``data_center_max``:
    a Data Center GPU Max, PVC), in a process with ``environ``, as the sources read say (no
    setting, no probe)."""
    return decide(release, data_center_max=data_center_max, environ=environ).mode


def why_recording_mode(
    release: tuple[int, int],
    *,
    data_center_max: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """``recording_mode``'s answer, in words: which mode, and what decided it."""
    mode, _, why = decide(release, data_center_max=data_center_max, environ=environ)
    return f"{mode}: {why}"


def is_data_center_max(device_name: str) -> bool:
    """Whether an xpu device of this name is a Data Center GPU Max (PVC)."""
    return "Data Center GPU Max" in device_name
