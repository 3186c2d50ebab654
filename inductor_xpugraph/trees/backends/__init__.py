"""Device backends of the graph-tree runtime: ``backend_class(device_type)``.

- "xpu": ``torch.xpu.XPUGraph`` (``xpu``), or ``torch.accelerator.Graph``
  (``accelerator_graphs``) with ``config.xpu_graph_api = "accelerator"`` on torch >= 2.13;
- "cuda": ``torch.cuda.CUDAGraph`` (``cuda``; torch registers no accelerator graph for CUDA);
- "cpu": the emulator, for tests and demos (``cpu_emulation``);
- torch's PrivateUse1 backend (``torch._C._get_privateuse1_backend_name()``), where this torch
  has ``torch.accelerator.Graph``: ``accelerator_graphs``, whose graphs work where the
  backend registers a graph implementation.

What stands in for a device type (``devices.standing_in``) answers for it instead.
"""

from __future__ import annotations

import torch

from ... import config
from .base import Graph, GraphBackend
from .devices import device


def backend_class(device_type: str) -> type[GraphBackend]:
    """The backend of ``device_type``, or of what stands in for it (``devices.device``);
    reads ``config.xpu_graph_api`` for "xpu". A backend's module is imported when first
    asked for: it binds its device's torch calls."""
    playing = device(device_type).backend
    if playing is not None:
        return playing
    if device_type == "xpu":
        return _xpu_backend_class()
    if device_type == "cuda":
        from .cuda import CudaGraphBackend

        return CudaGraphBackend
    if device_type == "cpu":
        from .cpu_emulation import CpuEmulationBackend

        return CpuEmulationBackend
    from .accelerator_graphs import accelerator_backend_class, has_accelerator_graph

    if device_type == torch._C._get_privateuse1_backend_name() and has_accelerator_graph():
        return accelerator_backend_class(device_type)
    lacking = "" if has_accelerator_graph() else f", which torch {torch.__version__} has not"
    raise ValueError(
        f"inductor_xpugraph has no graph backend for device type {device_type!r} "
        f"(supported: 'xpu', 'cuda', 'cpu' emulation, and the PrivateUse1 backend "
        f"{torch._C._get_privateuse1_backend_name()!r} where torch has "
        f"torch.accelerator.Graph{lacking})"
    )


def _xpu_backend_class() -> type[GraphBackend]:
    if config.xpu_graph_api == "accelerator":
        from .accelerator_graphs import accelerator_backend_class, has_accelerator_graph

        if not has_accelerator_graph():
            raise RuntimeError(
                f"inductor_xpugraph.config.xpu_graph_api='accelerator' needs "
                f"torch.accelerator.Graph (torch >= 2.13); this torch {torch.__version__} has "
                f"none: set it to 'xpu' (torch.xpu.XPUGraph)"
            )
        return accelerator_backend_class("xpu")
    from .xpu import XpuGraphBackend

    return XpuGraphBackend


__all__ = ["Graph", "GraphBackend", "backend_class"]
