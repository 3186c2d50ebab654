"""Device backends of the graph-tree runtime: ``backend_class(device_type)``.

- "xpu": ``torch.xpu.XPUGraph`` (``xpu``), or ``torch.accelerator.Graph``
  (``accelerator_graphs``) with ``config.xpu_graph_api = "accelerator"`` on torch >= 2.13;
- "cuda": ``torch.cuda.CUDAGraph`` (``cuda``; torch registers no accelerator graph for CUDA);
- "cpu": the emulator, for tests and demos (``cpu_emulation``);
- torch's PrivateUse1 backend (``torch._C._get_privateuse1_backend_name()``), where this torch
  has ``torch.accelerator.Graph``: ``accelerator_graphs``, whose graphs work where the
  backend registers a graph implementation.

Each device's record (``devices``) says which; anything standing in for a device type
answers for it instead.
"""

from __future__ import annotations

from .base import Graph, GraphBackend
from .devices import device


def backend_class(device_type: str) -> type[GraphBackend]:
    """The backend of ``device_type``, or of what stands in for it (``devices.device``);
    reads ``config.xpu_graph_api`` for "xpu"."""
    return device(device_type).backend()


__all__ = ["Graph", "GraphBackend", "backend_class"]
