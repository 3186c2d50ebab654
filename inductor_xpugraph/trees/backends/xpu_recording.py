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
"""

from __future__ import annotations

import os
from collections.abc import Mapping

COMMAND_BUFFER = "command-buffer"
NATIVE = "native"
RECORDING_MODES = (COMMAND_BUFFER, NATIVE)

#: intel/llvm#22053: "1" makes every ``command_graph`` record natively.
FORCE_NATIVE = "SYCL_GRAPH_FORCE_NATIVE_RECORDING"
#: The first torch release whose ``XPUGraph`` asks for native recording (pytorch#188874).
FIRST_NATIVE_RELEASE = (2, 14)


def recording_mode(
    release: tuple[int, int],
    *,
    data_center_max: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """The recording mode of torch ``release``'s ``XPUGraph`` on a device (``data_center_max``:
    a Data Center GPU Max, PVC), in a process with ``environ``."""
    return _decide(release, data_center_max, environ)[0]


def why_recording_mode(
    release: tuple[int, int],
    *,
    data_center_max: bool = False,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """``recording_mode``'s answer, in words: which mode, and what decided it."""
    mode, why = _decide(release, data_center_max, environ)
    return f"{mode}: {why}"


def _decide(
    release: tuple[int, int], data_center_max: bool, environ: Mapping[str, str]
) -> tuple[str, str]:
    """The one place the mode is decided: (mode, what decided it)."""
    version = f"{release[0]}.{release[1]}"
    if release < FIRST_NATIVE_RELEASE:  # its oneAPI predates native recording
        return (
            COMMAND_BUFFER,
            f"torch {version}'s XPUGraph records through SYCL Graph's command buffers",
        )
    if environ.get(FORCE_NATIVE) == "1":
        return NATIVE, f"{FORCE_NATIVE}=1 makes SYCL record every graph natively (intel/llvm#22053)"
    if data_center_max:
        return COMMAND_BUFFER, (
            f"torch {version}'s XPUGraph keeps command buffers on Data Center GPU Max (PVC); "
            f"{FORCE_NATIVE}=1 would force native recording"
        )
    return NATIVE, (
        f"torch {version}'s XPUGraph records through Level Zero on a client GPU "
        f"(pytorch/pytorch#188874; Data Center GPU Max keeps command buffers)"
    )


def is_data_center_max(device_name: str) -> bool:
    """Whether an xpu device of this name is a Data Center GPU Max (PVC)."""
    return "Data Center GPU Max" in device_name


def device_recording_mode(release: tuple[int, int], device_index: int = 0) -> str:
    """The recording mode of torch ``release``'s ``XPUGraph`` on xpu device ``device_index``
    of this process (a device that cannot be asked counts as a client GPU)."""
    import torch

    try:
        name = torch.xpu.get_device_properties(device_index).name
    except Exception:  # no xpu device in this process (fake devices, codegen on the CPU)
        name = ""
    return recording_mode(release, data_center_max=is_data_center_max(name))
