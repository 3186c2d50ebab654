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
