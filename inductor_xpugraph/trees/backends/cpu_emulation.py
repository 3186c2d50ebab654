"""CPU *emulation* backend, for tests and demos only: it makes nothing faster.

There are no CPU graphs. This backend imitates what a device graph does to memory so that
the whole runtime, and real Inductor-generated CPU code, can be exercised on a machine
without an accelerator:

- capture runs the callable once while the generated module's ``empty_strided_cpu`` is
  routed to a recorder, so every buffer it allocates belongs to the graph ("the pool"). That
  run, on the real input values, stands in for the first replay, which therefore does nothing:
  a device's capture executes nothing and its first replay everything, and here too every
  side effect of a recording call (input mutations, random draws, collectives with other
  processes) happens exactly once. A capture that raises puts its inputs and the RNG back;
- replay runs the callable again with the same static arguments while ``empty_strided_cpu``
  hands back those same buffers in the same order: kernels write into the memory captured,
  exactly as a real replay does. A different allocation sequence is an error.
- a result that did not come from ``empty_strided_cpu`` (an ATen op allocating its own
  output) is copied into the tensor recorded at capture, which is where a real graph, whose
  every allocation comes from its pool, would have written it.

What it cannot show: replay re-executes host code (a real graph does not), capture legality
(syncs, host reads), allocator pool sharing between graphs, performance.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from ..storages import alias_over, unowned
from .base import GraphBackend

_ALLOCATOR_NAME = "empty_strided_cpu"


class EmulatedGraph:
    """A recorded callable that re-runs into the buffers it allocated at capture."""

    def __init__(self, fn: Callable[[list[Any]], Any], args: list[Any]) -> None:
        self._fn = fn
        # Like a real graph, hold addresses, not the caller's tensor or storage objects
        # (those may be retired later, and the runtime counts their references).
        self._args = [
            alias_over(a, unowned(a.untyped_storage())) if isinstance(a, torch.Tensor) else a
            for a in args
        ]
        # Memory a device pool would keep reserved for this graph, kept allocated: its copied
        # inputs' buffers and outputs of earlier graphs lent to it (storages that own their
        # memory; the runtime's storages over graph memory never do).
        self._keep_alive = [
            a.untyped_storage()
            for a in args
            if isinstance(a, torch.Tensor) and a.untyped_storage().resizable()
        ]
        self._module_globals = _module_globals_of(fn)
        self.buffers: list[torch.Tensor] = []
        self._buffer_specs: list[tuple[Any, ...]] = []
        self._outputs: Any = None
        # True from a capture to the first replay, whose results the capture run produced.
        self._ran_at_capture = False

    def capture(self) -> Any:
        real_alloc = self._module_globals[_ALLOCATOR_NAME]

        def record(size, stride, dtype):
            buffer = real_alloc(size, stride, dtype)
            self.buffers.append(buffer)
            self._buffer_specs.append((tuple(size), tuple(stride), dtype))
            return buffer

        self._outputs = self._run_with_allocator(record)
        self._ran_at_capture = True
        return self._outputs

    def replay(self) -> None:
        if self._ran_at_capture:  # the capture's run was this replay's work (module docstring)
            self._ran_at_capture = False
            return
        next_buffer = iter(zip(self.buffers, self._buffer_specs))

        def reuse(size, stride, dtype):
            try:
                buffer, spec = next(next_buffer)
            except StopIteration:
                raise RuntimeError(
                    "emulated graph replay allocated more buffers than its capture"
                ) from None
            if spec != (tuple(size), tuple(stride), dtype):
                raise RuntimeError(
                    f"emulated graph replay allocated {(size, stride, dtype)} where the "
                    f"capture allocated {spec}"
                )
            return buffer

        outputs = self._run_with_allocator(reuse)
        for replayed, captured in zip(_flat(outputs), _flat(self._outputs)):
            if isinstance(captured, torch.Tensor) and replayed is not captured:
                if replayed.data_ptr() != captured.data_ptr():
                    captured.copy_(replayed)

    def _run_with_allocator(self, alloc: Callable[..., torch.Tensor]) -> Any:
        globals_ = self._module_globals
        with _REBIND_LOCK:
            real_alloc = globals_[_ALLOCATOR_NAME]
            globals_[_ALLOCATOR_NAME] = alloc
            try:
                return self._fn(list(self._args))
            finally:
                globals_[_ALLOCATOR_NAME] = real_alloc


class EmulatedPool:
    """A pool's name, and what it was asked to reserve (``reserve_in_pool``)."""

    reserved_bytes = 0


class CpuEmulationBackend(GraphBackend):
    device_type = "cpu"
    capture_executes = True
    # Warmups "in the pool" run as any other (a pool here is only a name), so that the tree
    # keeps the rules of warmups in a device's pool here too (``trees.memory``).
    warms_up_in_pool = True

    def __init__(self, device_index: int) -> None:
        super().__init__(device_index)
        self._capturing = threading.local()
        self.is_capturing = self._capture_is_active

    def new_pool(self) -> EmulatedPool:
        return EmulatedPool()  # buffers are owned by each EmulatedGraph

    def reserve_in_pool(self, pool: EmulatedPool, nbytes: int) -> bool:
        pool.reserved_bytes = nbytes  # host memory is not reserved; the request is kept
        return True

    def capture(
        self,
        fn: Callable[[list[Any]], Any],
        args: list[Any],
        pool: Any,
        place_inputs: Callable[[list[Any]], None],
    ) -> tuple[EmulatedGraph, Any]:
        place_inputs(args)  # the emulated graph keeps what it allocates, as its buffers
        graph = EmulatedGraph(fn, args)
        # The capture's run is the recording call's one run (module docstring). If it raises,
        # a device capture would have executed nothing: every input it may have written to
        # (mutated parameters, buffers Inductor reuses in place) and the RNG are put back.
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage()
            for t in args
            if isinstance(t, torch.Tensor)
        }
        saved = [(storage, storage.clone()) for storage in storages.values()]
        rng_state = torch.get_rng_state()
        self._capturing.active = True
        try:
            outputs = graph.capture()
        except BaseException:
            for storage, before in saved:
                storage.copy_(before)
            torch.set_rng_state(rng_state)
            raise
        finally:
            self._capturing.active = False
        return graph, _over_callers_inputs(graph, outputs, args)

    def _capture_is_active(self) -> bool:
        return getattr(self._capturing, "active", False)


def _over_callers_inputs(graph: EmulatedGraph, outputs: Any, args: list[Any]):
    """The capture's outputs, with those over an input rebuilt over that input's own storage
    (the caller's tensor, or the buffer a copied input was placed in), as a device capture,
    which runs on those tensors, returns them.

    The emulated capture runs on tensors over the captured addresses, so an output over an
    input came out over a storage of its own, fixed to the address. A parameter that the
    forward returns for its backward then read freed memory when the parameter's owner moved
    its memory in place (FSDP frees a layer's gathered parameters after its forward and
    gathers them again for its backward); and the runtime could not tell an output over a
    copied input's buffer (which it hands out over the caller's tensor when the input's memory
    moves, ``Recording``'s ``moving_inputs``).
    """
    aliased = {
        graph._args[i].untyped_storage()._cdata: arg
        for i, arg in enumerate(args)
        if isinstance(arg, torch.Tensor)
    }

    def rebuilt(out: Any) -> Any:
        if not isinstance(out, torch.Tensor):
            return out
        arg = aliased.get(out.untyped_storage()._cdata)
        if arg is None:
            return out
        return alias_over(out, arg.untyped_storage())

    if isinstance(outputs, (list, tuple)):
        return type(outputs)(rebuilt(out) for out in outputs)
    return rebuilt(outputs)


# Rebinding a module global is process-wide: one emulated run at a time.
_REBIND_LOCK = threading.RLock()


def _module_globals_of(fn: Callable[..., Any]) -> dict[str, Any]:
    code_owner = getattr(fn, "__func__", fn)  # bound methods (Runner.call) and functions
    module_globals = getattr(code_owner, "__globals__", None)
    if module_globals is None or _ALLOCATOR_NAME not in module_globals:
        raise TypeError(
            f"the cpu emulation backend can only capture Inductor-generated CPU code "
            f"(a function whose module defines {_ALLOCATOR_NAME}); got {fn!r}"
        )
    return module_globals


def _flat(outputs: Any) -> list[Any]:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
