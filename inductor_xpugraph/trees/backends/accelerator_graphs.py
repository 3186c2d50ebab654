"""Backend over ``torch.accelerator.Graph`` (torch >= 2.13), for any accelerator whose torch
registers a graph implementation.

torch 2.13 added one graph class for every accelerator, ``torch.accelerator.Graph``, backed by
whatever implementation the device registers (``REGISTER_GRAPH_IMPL``): XPU registers one
(``XPUGraphImpl``, aten/src/ATen/xpu/XPUGraph.cpp), an out-of-tree PrivateUse1 backend may
register its own, and CUDA registers none (torch 2.15), so cuda keeps ``torch.cuda.CUDAGraph``.
With it, a PrivateUse1 device gets graph trees without a backend of its own here, and xpu can
use it instead of ``torch.xpu.XPUGraph`` (``config.xpu_graph_api = "accelerator"``).

The backend is ``DeviceGraphBackend`` (capture stream, pool keeper, failed-capture recovery)
with the device module replaced by ``AcceleratorModule``. What differs from a device module's
graph API, and what is done about it:

- ``capture_begin()`` takes no arguments: the pool is the graph's ``graph_pool`` (given to its
  constructor, or set before the capture, as torch's ``reset`` docstring says).
  ``DeviceGraphBackend`` calls ``capture_begin(pool=...)``; ``_PoolGivenAtCaptureBegin`` sets
  ``graph_pool`` from it, then begins. The replay path calls torch's own ``replay``.
- There is no pool-handle function: a pool is named by the graph that made it. The pool's
  keeper, an empty graph captured first, makes it, and its ``pool()`` is the handle every
  later graph of the tree shares (``new_pool``). Where the device has a handle function of its
  own, the empty captures that need a fresh pool use it (``devices.Device.pool_calls``).
- Its context manager synchronizes the device and empties the caches on entry: never used.
- Streams are ``torch.Stream`` objects, made current with ``torch.accelerator.set_stream``;
  whether the current stream captures is its ``is_capturing()``.
- It cannot register a ``torch.Generator`` (no ``register_generator_state`` in torch 2.13 to
  2.15): a callable that takes one is not captured, decided before its capture
  (``DeviceGraphBackend.reason_not_to_capture``), and runs un-graphed.

Note [Pool routing after a failed capture]: a graph's ``capture_begin`` makes the device's
allocator route the capture's allocations into the pool; when ``capture_begin`` or
``capture_end`` raises part-way, ``DeviceGraphBackend._undo_pool_routing`` stops that with two
allocator calls that only the device's own torch module has. The device's record names them
(``devices.Device.pool_calls``). A device with none (every PrivateUse1 backend, until its
record is added): nothing can tell whether its allocator still routes into the pool after a failed
capture, nor stop it. Its graph implementation may have cleaned up; if it did not, this
thread's later allocations may keep going to the pool, and the pool's memory is not given
back before the process ends. That is logged, once per device, when it happens.

Not run on an Intel GPU or a PrivateUse1 device by this project: tests script the accelerator
API on the CPU (tests/trees/backends/test_accelerator_graph_backend.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..messages import GENERATOR_NOT_REGISTERED
from .allocator_checkpoints import AllocatorCheckpoints
from .device_graphs import DeviceGraphBackend, DevicePool
from .devices import device

log = logging.getLogger("inductor_xpugraph")


def has_accelerator_graph() -> bool:
    """Whether this torch has ``torch.accelerator.Graph`` (2.13 and later)."""
    return hasattr(getattr(torch, "accelerator", None), "Graph")


def _in_torch(path: str | None) -> Callable[..., Any] | None:
    """The object at ``path`` under ``torch``; None for no path, or one this torch lacks."""
    try:
        return None if path is None else functools.reduce(getattr, path.split("."), torch)
    except AttributeError:
        return None


class AcceleratorModule:
    """What ``DeviceGraphBackend`` uses of a device module (``torch.xpu``'s names), for one
    device type, from ``torch.accelerator`` and ``torch.Stream``."""

    def __init__(self, device_type: str, graph_pool_handle: Callable[[], Any] | None) -> None:
        self.device_type = device_type
        self.__name__ = f"torch.accelerator[{device_type}]"  # keys the capture streams
        self._graph_pool_handle = graph_pool_handle

    def is_available(self) -> bool:
        if not torch.accelerator.is_available():
            return False
        return torch.accelerator.current_accelerator().type == self.device_type

    def device_count(self) -> int:
        return torch.accelerator.device_count()

    def current_device(self) -> int:
        return torch.accelerator.current_device_index()

    def Stream(self, device: int) -> torch.Stream:  # noqa: N802 - a device module's name
        return torch.Stream(device=torch.device(self.device_type, device))

    def current_stream(self, device_index: int) -> torch.Stream:
        return torch.accelerator.current_stream(device_index)

    def device(self, device_index: int) -> Any:
        return torch.accelerator.device_index(device_index)

    @contextlib.contextmanager
    def stream(self, stream: torch.Stream) -> Iterator[None]:
        """Make ``stream`` current, then the one before again (nests, unlike entering the
        same ``torch.Stream`` twice)."""
        before = torch.accelerator.current_stream(stream.device_index)
        torch.accelerator.set_stream(stream)
        try:
            yield
        finally:
            torch.accelerator.set_stream(before)

    def is_current_stream_capturing(self) -> bool:
        return torch.accelerator.current_stream().is_capturing()

    def graph_pool_handle(self) -> Any:
        """A new pool id, or None where the device has no such call: the graph then makes a
        pool of its own."""
        return None if self._graph_pool_handle is None else self._graph_pool_handle()

    def empty_cache(self) -> None:
        torch.accelerator.empty_cache()

    def synchronize(self, device_index: int) -> None:
        torch.accelerator.synchronize(device_index)

    @property
    def default_generators(self) -> Any:
        return torch.get_device_module(self.device_type).default_generators


class _PoolGivenAtCaptureBegin:
    """A ``torch.accelerator.Graph`` with the ``capture_begin(pool=...)`` that
    ``DeviceGraphBackend`` calls on ``torch.xpu.XPUGraph``/``torch.cuda.CUDAGraph``. The
    graph's other methods are torch's own, bound once: a replay costs no extra call."""

    __slots__ = ("graph", "capture_end", "replay", "reset", "pool")

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.capture_end = graph.capture_end
        self.replay = graph.replay
        self.reset = graph.reset
        self.pool = graph.pool

    def capture_begin(self, pool: Any = None) -> None:
        self.graph.graph_pool = pool
        self.graph.capture_begin()

    def register_generator_state(self, generator: torch.Generator) -> None:
        register = getattr(self.graph, "register_generator_state", None)
        if register is None:
            raise RuntimeError(GENERATOR_NOT_REGISTERED)
        register(generator)


class AcceleratorGraphBackend(AllocatorCheckpoints, DeviceGraphBackend):
    """Graphs of ``torch.accelerator.Graph`` on one accelerator; one subclass per device type
    (``accelerator_backend_class``)."""

    #: ``capture_error_mode`` of every graph: what the device's implementation does by
    #: default (XPU's takes no other: it warns and falls back).
    capture_error_mode = "default"
    graphs_register_generators = has_accelerator_graph() and hasattr(
        torch.accelerator.Graph, "register_generator_state"
    )

    def __init__(self, device_index: int) -> None:
        calls = device(self.device_type).pool_calls
        handle = _in_torch(calls.graph_pool_handle)
        self.device_module = AcceleratorModule(self.device_type, handle)
        end_routing = _in_torch(calls.end_allocate_to_pool)
        self.end_allocate_to_pool = end_routing or self._cannot_undo_routing
        self.release_pool = _in_torch(calls.release_pool) or _nothing_to_release
        self.begin_allocate_to_pool = _in_torch(calls.begin_allocate_to_pool)
        super().__init__(device_index)

    def new_graph(self) -> _PoolGivenAtCaptureBegin:
        graph = torch.accelerator.Graph(capture_error_mode=self.capture_error_mode)
        return _PoolGivenAtCaptureBegin(graph)

    def new_pool(self) -> DevicePool:
        """A pool made by its keeper, an empty graph captured into a pool of its own, and
        named by it: every graph of the tree is captured into ``keeper.pool()``."""
        keeper = self.capture_empty_graph()
        return DevicePool(keeper.pool(), keeper)

    def _cannot_undo_routing(self, device_index: int, pool_handle: Any) -> None:
        """``end_allocate_to_pool`` of a device with no such call (Note [Pool routing after
        a failed capture])."""
        if self.device not in _warned_cannot_undo_routing:
            _warned_cannot_undo_routing.add(self.device)
            log.warning(
                "a graph capture on %s failed part-way, and torch has no call to stop its "
                "allocator routing this thread's allocations into the graph pool: if the "
                "device's graph implementation left it routing, later allocations may go to "
                "the pool, and its memory is not given back before the process ends",
                self.device,
            )


def _nothing_to_release(device_index: int, pool_handle: Any) -> None:
    """``release_pool`` of a device with no such call (Note [Pool routing after a failed
    capture])."""


_warned_cannot_undo_routing: set[str] = set()


@functools.cache
def accelerator_backend_class(device_type: str) -> type[AcceleratorGraphBackend]:
    """The ``AcceleratorGraphBackend`` of ``device_type`` (one class per device type), with
    its allocator's behaviour from the device's record (``device_graphs`` says why each
    matters)."""
    facts = device(device_type)
    return type(
        f"AcceleratorGraphBackend[{device_type}]",
        (AcceleratorGraphBackend,),
        {
            "device_type": device_type,
            "__module__": __name__,
            "empty_cache_after_pool_drop": facts.empty_cache_after_pool_drop,
            "failure_leaves_host_routing": facts.failure_leaves_host_routing,
        },
    )
