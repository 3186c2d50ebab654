"""CUDA backend: ``torch.cuda.CUDAGraph`` over the shared stream-capture backend.

Used to validate the runtime on real hardware (NVIDIA H100/H200) side by side with upstream's
CUDA Graph Trees.
"""

from __future__ import annotations

import contextlib

import torch

from .device_graphs import DeviceGraphBackend


class CudaGraphBackend(DeviceGraphBackend):
    device_type = "cuda"
    device_module = torch.cuda
    # "thread_local": other threads may keep allocating and launching while we capture.
    capture_begin_kwargs = {"capture_error_mode": "thread_local"}

    def new_graph(self) -> torch.cuda.CUDAGraph:
        return torch.cuda.CUDAGraph()

    # cuBLAS keeps a workspace per (handle, stream), allocated on first use and kept. Cleared
    # around warmups and captures, a workspace is allocated for the run and freed after it
    # (inside the pool, as scratch of the graph, for a capture) instead of pinning tens of
    # MiB per stream for the life of the process. Upstream's trees do the same.

    def warmup(self, fn, args):
        with _fresh_cublas_workspaces():
            return fn(args)

    def capture(self, fn, args, pool):
        with _fresh_cublas_workspaces():
            return super().capture(fn, args, pool)


@contextlib.contextmanager
def _fresh_cublas_workspaces():
    torch._C._cuda_clearCublasWorkspaces()
    try:
        yield
    finally:
        torch._C._cuda_clearCublasWorkspaces()
