"""What happens to graph memory the caller still holds when its generation ends.

The next replays will overwrite it, so every tensor over it must either raise or stop
reading it. Three primitives, each on every backend:

- ``tensor_invalidator()``: one tensor object is cut from its storage and raises our message
  on any access (the core ``TensorImpl::release_storage_and_set_meta_custom_data_ptr_error_msg_``).
- ``storage_invalidator()``: a storage object raises our message on any data access, so every
  tensor over it does too, views included (``StorageImpl::
  release_data_and_set_meta_custom_data_ptr_error_msg_``; this is what upstream's trees do).
- ``copy_out_of_pool(storages)``: each storage object gets a copy of its data in fresh memory
  outside the pool, so every tensor over it keeps its values; new storage objects over the
  graph memory are returned for the runtime to continue with.

CUDA builds of torch expose the two invalidations as ``torch._C._set_storage_access_error_msg``
and ``torch._C._set_storage_data_ptr_access_error_msg``. Elsewhere (XPU and CPU builds) the
package's compiled module calls the same core methods (``native``: built when the package is
installed; never built or waited for here). ``copy_out_of_pool`` swaps two storages' data with
``UntypedStorage._swap_data_ptr_`` where torch has it (2.13 on), else with the compiled module
(torch 2.11, CUDA builds included).

Without the compiled module for this torch, a process keeps the path that needs none for its
whole life (held outputs are copied out of the pool where torch swaps storages; with neither,
``can_copy_out_of_pool()`` is False and held gradients are made stale, loud as upstream's
trees are), says so once with what it costs and how to fix it, and where a build can succeed,
starts one in the background for the processes that come after (``native``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from types import ModuleType

import torch

from .. import native
from . import messages

log = logging.getLogger("inductor_xpugraph")

TensorInvalidator = Callable[[torch.Tensor, str], None]
StorageInvalidator = Callable[[torch.UntypedStorage, str], None]


@functools.cache
def _extension() -> ModuleType | None:
    """The compiled module, or None at once; the first time it is missing, say so and what it
    costs on this torch, and start a build for later processes where one can succeed."""
    module = native.load()
    if module is not None:
        return module
    why = native.missing()
    if why is None:  # appeared since ``load`` looked: the next process uses it
        return None
    if why.can_build and native.start_background_build():
        log_file = native.environment_cache() / f"{native.module_name()}.log"
        fix = messages.compiled_module_building(str(log_file), native.BUILD_COMMAND)
        why = native.Missing(why.what, fix, why.can_build)
    log.warning(why.line(cost_without_the_compiled_module()))
    return None


def cost_without_the_compiled_module() -> str:
    """What running without the compiled module costs on this torch."""
    return messages.without_compiled_module(
        can_swap=hasattr(torch.UntypedStorage, "_swap_data_ptr_"),
        can_invalidate=hasattr(torch._C, "_set_storage_access_error_msg"),
    )


@functools.cache
def tensor_invalidator() -> TensorInvalidator | None:
    binding = getattr(torch._C, "_set_storage_access_error_msg", None)
    if binding is not None:
        return binding
    extension = _extension()
    return extension.invalidate_tensor if extension is not None else None


@functools.cache
def storage_invalidator() -> StorageInvalidator | None:
    binding = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)
    if binding is None:
        extension = _extension()
        if extension is None:
            return None
        binding = extension.invalidate_storage
    return lambda storage, message: binding(storage._cdata, message)


@functools.cache
def _storage_swapper() -> Callable[[torch.UntypedStorage, torch.UntypedStorage], None] | None:
    if hasattr(torch.UntypedStorage, "_swap_data_ptr_"):  # torch >= 2.13
        return torch.UntypedStorage._swap_data_ptr_
    extension = _extension()
    if extension is None:
        return None
    return lambda first, second: extension.swap_storage_data(first._cdata, second._cdata)


def can_copy_out_of_pool() -> bool:
    return _storage_swapper() is not None


def copy_out_of_pool(storages: Sequence[torch.UntypedStorage]) -> list[torch.UntypedStorage]:
    """Move each storage's data to fresh memory; return new storages over the old memory.

    Every tensor over one of ``storages`` keeps its values, now in memory of its own (freed
    with it). Each returned storage takes over the old memory exactly as its storage held it
    (owning it or not). The copies are one batched launch on the current stream, queued
    before anything that overwrites the old memory. Only when ``can_copy_out_of_pool()``.
    """
    swap = _storage_swapper()
    copies = [torch.empty(s.nbytes(), dtype=torch.uint8, device=s.device) for s in storages]
    sources = [torch.empty(0, dtype=torch.uint8, device=s.device).set_(s) for s in storages]
    torch._foreach_copy_(copies, sources)
    fresh = [copy.untyped_storage() for copy in copies]
    del copies, sources  # they would count as references to the memory they end up over
    for storage, new in zip(storages, fresh):
        swap(storage, new)
    return fresh
