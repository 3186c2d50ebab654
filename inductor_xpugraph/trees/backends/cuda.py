"""CUDA backend: ``torch.cuda.CUDAGraph`` over the shared stream-capture backend.

Used to validate the runtime on real hardware (NVIDIA H100/H200) side by side with upstream's
CUDA Graph Trees. The CUDA caching allocator can checkpoint a pool, so this backend also
offers the checkpoint operations of ``trees.memory.CheckpointedPool``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .device_graphs import DeviceGraphBackend


@contextlib.contextmanager
def _fresh_cublas_workspaces() -> Iterator[None]:
    # cuBLAS keeps a workspace per (handle, stream), allocated on first use and kept for the
    # life of the process. Cleared around warmups and captures, a workspace is allocated
    # where the run allocates (the pool, during a capture: scratch of that graph) and freed
    # afterwards, instead of pinning tens of MiB per stream. Upstream's trees do the same.
    torch._C._cuda_clearCublasWorkspaces()
    try:
        yield
    finally:
        torch._C._cuda_clearCublasWorkspaces()


class CudaGraphBackend(DeviceGraphBackend):
    device_type = "cuda"
    device_module = torch.cuda
    # "thread_local": other threads may keep allocating and launching while we capture.
    capture_begin_kwargs = {"capture_error_mode": "thread_local"}
    supports_pool_checkpoints = True

    def new_graph(self) -> torch.cuda.CUDAGraph:
        return torch.cuda.CUDAGraph()

    def warmup(self, fn, args):
        with _fresh_cublas_workspaces():
            return fn(args)

    def capture(self, fn, args, pool, place_inputs):
        with _fresh_cublas_workspaces():
            return super().capture(fn, args, pool, place_inputs)

    def checkpoint_pool(self, pool):
        return torch._C._cuda_getCheckpointState(self.device_index, pool.handle)

    def restore_pool(self, pool, checkpoint, new_owners):
        stale_storages: list[int] = []  # nothing allocated now is missing from the checkpoint
        owners = [storage._cdata for storage in new_owners]
        torch._C._cuda_setCheckpointPoolState(self.device_index, checkpoint, stale_storages, owners)
        if not all(torch._C._has_Standard_Deleter(owner) for owner in owners):
            raise RuntimeError(
                "inductor_xpugraph internal error: restoring a cuda pool checkpoint did not "
                "re-allocate the outputs of the graphs on the path"
            )

    def free_storages(self, storages):
        for storage in storages:
            torch._C._free_And_Remove_DeleterFn(storage._cdata)

    def pool_holds_exactly(self, pool, storages):
        ptrs = {storage.data_ptr() for storage in storages}
        return torch._C._cuda_checkPoolLiveAllocations(self.device_index, pool.handle, ptrs)
