"""The one interface the graph-tree runtime needs from a device.

A backend owns a device's capture stream and knows how to make a memory pool, capture a
callable into a graph that allocates from that pool, and replay it. Everything else (when to
warm up, record, replay; which inputs to copy; how outputs are handed out) is device-agnostic
and lives in ``inductor_xpugraph.trees``. Backends are small on purpose: ``xpu`` and ``cuda``
are the same code over two device modules, ``cpu`` is an emulator for tests and demos.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Protocol


class Graph(Protocol):
    def replay(self) -> None: ...


class GraphBackend(abc.ABC):
    """A device that can capture and replay graphs."""

    #: ``torch.device`` type string: "xpu", "cuda" or "cpu".
    device_type: str
    #: Whether a capture runs the code it captures (the CPU emulator: replays re-run host
    #: code, nothing gets faster). A stream capture executes nothing.
    capture_executes: bool = False

    #: ``() -> bool``: whether the current stream is being captured now, by us or by anyone
    #: else. An attribute, not a method: every call of a graphed callable asks, so each
    #: backend binds it once, in ``__init__``, to the cheapest function that answers.
    is_capturing: Callable[[], bool]

    #: ``() -> None``: return once no other thread of this process captures on the device.
    #: A replay waits for it: the device's random number generator is in capture mode while
    #: any thread captures, and a replay that draws from it then fails (torch's
    #: ``replay_prologue``: "Offset increment outside graph capture"). Bound once in
    #: ``__init__``, like ``is_capturing``; a device without that hazard binds a no-op.
    wait_for_other_captures: Callable[[], None] = staticmethod(lambda: None)

    #: Why no graph can be recorded on this device in this process (even an empty capture
    #: failed), or None. Every callable on the device then runs un-graphed.
    cannot_record: str | None = None

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        #: ``(reason) -> None``, set by the tree that owns this backend: called when
        #: something outside the tree made every graph captured so far unsafe to replay (on
        #: cuda, a clear of every cuBLAS workspace). The tree records again from its next
        #: generation.
        self.on_graphs_invalidated: Callable[[str], None] | None = None

    @property
    def device(self) -> str:
        return f"{self.device_type}:{self.device_index}"

    @abc.abstractmethod
    def new_pool(self) -> Any:
        """A private memory pool shared by every graph this backend captures."""

    @abc.abstractmethod
    def capture(
        self,
        fn: Callable[[list[Any]], Any],
        args: list[Any],
        pool: Any,
        place_inputs: Callable[[list[Any]], None],
    ) -> tuple[Graph, Any]:
        """Capture ``fn(args)`` into a new graph whose allocations come from ``pool``.

        ``place_inputs(args)`` runs first, inside the capture: the tensors it allocates (the
        static buffers of copied inputs) are the graph's, as its scratch is.
        Returns the graph and what ``fn`` returned during capture. On real devices the
        capture does not execute kernels: the returned tensors hold graph memory whose
        contents are only valid after ``graph.replay()``.
        """

    #: Captures of this backend that failed at ``capture_begin`` or ``capture_end``.
    failed_captures: int = 0

    def reason_not_to_capture(self, args: list[Any]) -> str | None:
        """Why a call with ``args`` cannot be captured on this device, known before trying
        (the callable then runs un-graphed, and the tree keeps its graphs), or None."""
        return None

    def synchronize(self) -> None:
        """Wait for everything queued on the device (the emulator runs nothing queued)."""

    def release_cached_memory(self) -> None:
        """Give the device the memory its allocator caches and no tensor holds, as
        ``torch.cuda.graph`` does before each capture. Called before each capture and before
        a callable's first warmup in the pool: memory a compilation left cached (Inductor's
        benchmarks and autotuning) would otherwise stay reserved beside the pool the graphs
        grow, never to be reused by them."""

    def release_dropped_pools(self) -> None:
        """Called after the tree dropped a pool, outside any capture of its own: give the
        memory of pools no graph holds any more back to the device, where leaving it cached
        is unsafe."""

    def warmup(self, fn: Callable[[list[Any]], Any], args: list[Any]) -> Any:
        """Run ``fn(args)`` un-graphed, before its capture, outside the pool."""
        return fn(args)

    #: Whether ``warmup_in_pool`` makes the run's allocations in the pool (``trees.memory``,
    #: "Warmups"); where False it is ``warmup``.
    warms_up_in_pool: bool = False

    def warmup_in_pool(self, fn: Callable[[list[Any]], Any], args: list[Any], pool: Any) -> Any:
        """Run ``fn(args)`` un-graphed, before its capture, this thread's allocations made in
        ``pool``, where the captures that follow can reuse them."""
        return self.warmup(fn, args)

    def reserve_in_pool(self, pool: Any, nbytes: int) -> bool:
        """Allocate ``nbytes`` in ``pool`` and free them, so that the pool keeps one segment
        of that size for the captures to carve up. False where the device cannot."""
        return False

    # -- allocator checkpoints (optional: see trees.memory) -----------------------------------

    #: True when the allocator can save and restore its bookkeeping of a pool.
    supports_pool_checkpoints: bool = False

    def checkpoint_pool(self, pool: Any) -> Any:
        """The allocator's bookkeeping of ``pool``: which of its blocks are allocated."""
        raise NotImplementedError

    def restore_pool(self, pool: Any, checkpoint: Any, new_owners: list[Any]) -> None:
        """Make the allocated blocks of ``pool`` those of ``checkpoint``.

        Blocks allocated now must be allocated in the checkpoint too. ``new_owners`` are
        unowned storages over the blocks the restore allocates: each becomes their owner.
        """
        raise NotImplementedError

    def free_storages(self, storages: list[Any]) -> None:
        """Free the pool memory these owning storages hold; they no longer own it after."""
        raise NotImplementedError

    def pool_holds_exactly(self, pool: Any, storages: list[Any]) -> bool:
        """True when the allocated blocks of ``pool`` are exactly those of ``storages``."""
        raise NotImplementedError
