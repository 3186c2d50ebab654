"""CUDA backend: ``torch.cuda.CUDAGraph`` over the shared stream-capture backend.

Used to validate the runtime on real hardware (NVIDIA H100/H200) side by side with upstream's
CUDA Graph Trees.
"""

from __future__ import annotations

import torch

from .device_graphs import DeviceGraphBackend


class CudaGraphBackend(DeviceGraphBackend):
    device_type = "cuda"
    device_module = torch.cuda
    # "thread_local": other threads may keep allocating and launching while we capture.
    capture_begin_kwargs = {"capture_error_mode": "thread_local"}

    def new_graph(self) -> torch.cuda.CUDAGraph:
        return torch.cuda.CUDAGraph()

    def capture(self, fn, args, pool):
        # cuBLAS keeps a workspace per (handle, stream), allocated on first use. Cleared
        # around the capture, the capture stream's workspace is allocated inside the pool
        # and freed afterwards (it is scratch of this graph), instead of pinning tens of
        # MiB for the life of the process. Upstream's trees do the same.
        torch._C._cuda_clearCublasWorkspaces()
        try:
            return super().capture(fn, args, pool)
        finally:
            torch._C._cuda_clearCublasWorkspaces()
