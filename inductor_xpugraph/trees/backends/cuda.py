"""CUDA backend: ``torch.cuda.CUDAGraph`` over the shared stream-capture backend.

Used to validate the runtime on real hardware (NVIDIA H100/H200) side by side with upstream's
CUDA Graph Trees. The CUDA caching allocator can checkpoint a pool, so this backend also
offers the checkpoint operations of ``trees.memory.CheckpointedPool``.
"""

from __future__ import annotations

import torch

from .device_graphs import DeviceGraphBackend


def _allocate_blas_workspaces(stream: torch.cuda.Stream, device_index: int) -> None:
    """Give this thread's cuBLAS handles their workspaces for ``stream`` now, outside the pool.

    cuBLAS(Lt) keeps one workspace per (handle, stream), allocated on first use and kept for
    the life of the process. Allocated inside a capture it would lie in the graph pool, held
    there for good. So a matmul and an addmm with a bias (cuBLASLt) run on the capture stream
    before each capture (they allocate nothing after the first time on a thread).

    Upstream's trees instead call ``torch._C._cuda_clearCublasWorkspaces()`` around warmups
    and captures. We did too, until it gave wrong gradients without any graph: Inductor's
    code, compiled without graphs, with that call between its forward and backward, returned
    a wrong first-layer bias gradient in 6 of 9 trials on the H100
    (``benchmarks/dynamic_training_check.py``). It is not called.
    """
    with torch.cuda.device(device_index), torch.cuda.stream(stream):
        square = torch.ones(2, 2, device=f"cuda:{device_index}")
        torch.mm(square, square)
        torch.addmm(square[0], square, square)


class CudaGraphBackend(DeviceGraphBackend):
    device_type = "cuda"
    device_module = torch.cuda
    # "thread_local": other threads may keep allocating and launching while we capture.
    capture_begin_kwargs = {"capture_error_mode": "thread_local"}
    supports_pool_checkpoints = True

    def new_graph(self) -> torch.cuda.CUDAGraph:
        return torch.cuda.CUDAGraph()

    def capture(self, fn, args, pool, place_inputs):
        _allocate_blas_workspaces(self.capture_stream, self.device_index)
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
