"""CUDA backend: ``torch.cuda.CUDAGraph`` over the shared stream-capture backend.

Used to validate the runtime on real hardware (NVIDIA H100/H200) side by side with upstream's
CUDA Graph Trees. The CUDA caching allocator can checkpoint a pool, so this backend also
offers the checkpoint operations of ``trees.memory.CheckpointedPool``, over the ``_cuda_*``
bindings (``allocator_checkpoints``, shared with xpu).

cuBLAS workspaces. cuBLAS(Lt) keeps one workspace per (handle, stream): handles are per
thread, so the main thread and autograd's each get one for our capture stream, allocated
on first use (32 MiB + 1 MiB on an H100). A captured matmul bakes its workspace's address
into the graph, so the memory must stay reserved for as long as any graph that uses it can
replay. Upstream's trees call ``torch._C._cuda_clearCublasWorkspaces()`` around warmups and
captures; that frees *every* thread's and stream's workspaces, including those the caller's
un-graphed code is using, and on the H100 it gave Inductor's code, with no graph at all,
wrong gradients (docs/memory.md, "cuBLAS workspaces"). We never call
it. What we do depends on the torch release, found out once per backend
(``_graph_release_frees_workspaces``):

- ``KEEP_OUTSIDE_POOL`` (torch 2.11): destroying a graph leaves the workspaces alone. Before
  each capture, a small matmul and an addmm with a bias run on the capture stream, so this
  thread's workspaces exist before the capture, outside the pool, and are kept for the
  process's life: every graph on the stream shares them. Cost: one workspace per capturing
  thread, held in the default pool.
- ``FREE_AS_INTERMEDIATE`` (torch 2.15's ``CUDAGraph::reset`` calls
  ``clearCublasWorkspacesForStream`` on its capture stream): destroying *any* graph captured
  on our stream frees the workspaces every other graph on it still uses, so keeping them
  outside the pool cannot work. Instead they are allocated inside each capture, in the pool,
  and released right after it (by destroying an empty graph captured on the stream): the
  workspace is then one more intermediate of the graph just captured, whose memory later
  captures may reuse, as upstream's trees have it, without touching any other stream's.
  Warmups run on the capture stream too, so the release also runs right before each capture:
  a workspace a warmup allocated outside the pool must not be the one a graph bakes in.

Warmups run on the capture stream (``DeviceGraphBackend.warmup``), so the caller's stream
never gets a workspace that only graphed code needed.

Note [Someone else clears every workspace]: under ``KEEP_OUTSIDE_POOL`` our graphs bake
workspaces that torch's own map owns, and ``torch._C._cuda_clearCublasWorkspaces()`` frees
them. Upstream's trees call it around their warmups and captures, so they do whenever they
run in the same process (``benchmarks/real_clients.py --paired``), and so may a user.
Replays after that write their scratch into memory the allocator hands out again (on an
H200, tensors allocated on the capture stream after a clear were overwritten). So while a
backend keeps workspaces, torch's function is wrapped (``_watch_workspace_clears``): after
the clear, every such backend's tree stops replaying and records again from its next
generation, with new workspaces, and says why. The replay path pays nothing for it.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable

import torch

from .allocator_checkpoints import AllocatorCheckpoints
from .device_graphs import DeviceGraphBackend


class WorkspacePolicy(enum.Enum):
    KEEP_OUTSIDE_POOL = "keep the capture stream's workspaces outside the pool"
    FREE_AS_INTERMEDIATE = "free the capture stream's workspaces after each capture"


def _allocate_blas_workspaces(backend: CudaGraphBackend) -> None:
    """Give this thread's cuBLAS and cuBLASLt handles their workspaces for the capture stream,
    now (they allocate nothing once they exist)."""
    with backend.on_capture_stream():
        square = torch.ones(2, 2, device=f"cuda:{backend.device_index}")
        torch.mm(square, square)
        torch.addmm(square[0], square, square)


def _graph_release_frees_workspaces(backend: CudaGraphBackend) -> bool:
    """True when destroying a graph frees its capture stream's cuBLAS workspaces."""
    _allocate_blas_workspaces(backend)
    backend.capture_stream.synchronize()  # not the device: another thread may be capturing
    held = torch.cuda.memory_allocated(backend.device_index)
    backend.release_capture_stream_workspaces()
    # A workspace is at least 1 MiB (cuBLASLt's); smaller changes are other threads' work.
    return held - torch.cuda.memory_allocated(backend.device_index) >= 2**20


_workspace_policies: dict[int, WorkspacePolicy] = {}


def _workspace_policy(backend: CudaGraphBackend) -> WorkspacePolicy:
    """This torch's policy for the backend's device, found out on its first backend."""
    if backend.device_index not in _workspace_policies:
        frees = _graph_release_frees_workspaces(backend)
        _workspace_policies[backend.device_index] = (
            WorkspacePolicy.FREE_AS_INTERMEDIATE if frees else WorkspacePolicy.KEEP_OUTSIDE_POOL
        )
    return _workspace_policies[backend.device_index]


WORKSPACES_CLEARED = (
    "torch._C._cuda_clearCublasWorkspaces() freed the cuBLAS workspaces they use (upstream's "
    "CUDA Graph Trees call it around their warmups and captures: run one kind of tree per "
    "process)"
)
# Backends whose graphs use workspaces kept outside the pool, and torch's own clear.
_backends_keeping_workspaces: weakref.WeakSet[CudaGraphBackend] = weakref.WeakSet()
_torch_clear_workspaces: Callable[[], None] | None = None


def _clear_workspaces_and_invalidate_graphs() -> None:
    """``torch._C._cuda_clearCublasWorkspaces`` while a backend keeps workspaces (Note
    [Someone else clears every workspace])."""
    _torch_clear_workspaces()
    for backend in list(_backends_keeping_workspaces):
        if backend.on_graphs_invalidated is not None:
            backend.on_graphs_invalidated(WORKSPACES_CLEARED)


def _watch_workspace_clears(backend: CudaGraphBackend) -> None:
    global _torch_clear_workspaces
    _backends_keeping_workspaces.add(backend)
    if _torch_clear_workspaces is None:
        _torch_clear_workspaces = torch._C._cuda_clearCublasWorkspaces
        torch._C._cuda_clearCublasWorkspaces = _clear_workspaces_and_invalidate_graphs


class CudaGraphBackend(AllocatorCheckpoints, DeviceGraphBackend):
    device_type = "cuda"
    device_module = torch.cuda
    # "thread_local": other threads may keep allocating and launching while we capture.
    capture_begin_kwargs = {"capture_error_mode": "thread_local"}
    end_allocate_to_pool = staticmethod(torch._C._cuda_endAllocateToPool)
    release_pool = staticmethod(torch._C._cuda_releasePool)
    begin_allocate_to_pool = staticmethod(torch._C._cuda_beginAllocateCurrentThreadToPool)

    def __init__(self, device_index: int) -> None:
        super().__init__(device_index)
        self.workspace_policy = _workspace_policy(self)
        if self.workspace_policy is WorkspacePolicy.KEEP_OUTSIDE_POOL:
            _watch_workspace_clears(self)

    def new_graph(self) -> torch.cuda.CUDAGraph:
        return torch.cuda.CUDAGraph()

    def release_capture_stream_workspaces(self) -> None:
        """Capture an empty graph on the capture stream and destroy it: what a release of
        one of our graphs does to the stream's workspaces, without releasing any of them."""
        graph = self.capture_empty_graph()
        del graph

    def prepare_capture_stream(self):
        if self.workspace_policy is WorkspacePolicy.KEEP_OUTSIDE_POOL:
            _allocate_blas_workspaces(self)
        else:  # workspaces a warmup allocated outside the pool go; the capture's own come
            self.release_capture_stream_workspaces()

    def prepare_warmup_in_pool(self):
        # Kept workspaces must not be allocated in the pool, where they would stay for good.
        if self.workspace_policy is WorkspacePolicy.KEEP_OUTSIDE_POOL:
            _allocate_blas_workspaces(self)

    def after_warmup_in_pool(self):
        # The warmup's workspaces are its intermediates: the pool gets them back.
        if self.workspace_policy is WorkspacePolicy.FREE_AS_INTERMEDIATE:
            self.release_capture_stream_workspaces()

    def capture(self, fn, args, pool, place_inputs):
        if self.workspace_policy is WorkspacePolicy.KEEP_OUTSIDE_POOL:
            return super().capture(fn, args, pool, place_inputs)
        try:
            return super().capture(fn, args, pool, place_inputs)
        finally:  # (a failed capture's graph is destroyed, which frees them as well)
            self.release_capture_stream_workspaces()
