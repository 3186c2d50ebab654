"""Device backends of the graph-tree runtime: ``backend_for(device_type, index)``."""

from __future__ import annotations

from .base import Graph, GraphBackend


def backend_class(device_type: str) -> type[GraphBackend]:
    if device_type == "xpu":
        from .xpu import XpuGraphBackend

        return XpuGraphBackend
    if device_type == "cuda":
        from .cuda import CudaGraphBackend

        return CudaGraphBackend
    if device_type == "cpu":
        from .cpu_emulation import CpuEmulationBackend

        return CpuEmulationBackend
    raise ValueError(
        f"inductor_xpugraph has no graph backend for device type {device_type!r} "
        f"(supported: 'xpu', 'cuda', 'cpu' emulation)"
    )


__all__ = ["Graph", "GraphBackend", "backend_class"]
