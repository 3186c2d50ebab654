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
and ``torch._C._set_storage_data_ptr_access_error_msg``. Elsewhere (XPU and CPU builds) a
small C++ extension calls the same core methods. It is built with
``torch.utils.cpp_extension.load_inline`` the first time it is needed (about 30 s) and cached
by torch in ``TORCH_EXTENSIONS_DIR``, under a name of its own per torch release (several
virtual environments share that directory: a build for one release never replaces, or waits
on, another's). torch waits forever on the lock file of a build whose process died (killed,
interrupted); a lock older than any build takes is removed, with a warning. If it cannot be
built, a warning says so once and the runtime copies held memory out of the pool instead
(correct, but a copy per held output).
``copy_out_of_pool`` swaps two storages' data with ``UntypedStorage._swap_data_ptr_`` where
torch has it (2.13 on), else with the same extension (torch 2.11, CUDA builds included: the
first handover then builds it). With neither, ``can_copy_out_of_pool()`` is False and held
gradients are made stale instead (loud, as upstream's trees are).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from types import ModuleType

import torch

log = logging.getLogger("inductor_xpugraph")

TensorInvalidator = Callable[[torch.Tensor, str], None]
StorageInvalidator = Callable[[torch.UntypedStorage, str], None]

_EXTENSION_SOURCE = r"""
#include <torch/extension.h>

void invalidate_tensor(const at::Tensor& tensor, const std::string& message) {
  tensor.unsafeGetTensorImpl()->release_storage_and_set_meta_custom_data_ptr_error_msg_(message);
}

void invalidate_storage(int64_t storage_impl, const std::string& message) {
  reinterpret_cast<c10::StorageImpl*>(storage_impl)
      ->release_data_and_set_meta_custom_data_ptr_error_msg_(message);
}

// What UntypedStorage._swap_data_ptr_ does (torch 2.13 on): exchange the memory, and how it
// is allocated, of two storages of the same size on the same device.
void swap_storage_data(int64_t first_impl, int64_t second_impl) {
  auto* a = reinterpret_cast<c10::StorageImpl*>(first_impl);
  auto* b = reinterpret_cast<c10::StorageImpl*>(second_impl);
  TORCH_CHECK(a->nbytes() == b->nbytes() && a->device() == b->device(),
              "swap_storage_data: storages differ in size or device");
  at::DataPtr a_data = a->set_data_ptr(at::DataPtr(nullptr, a->device()));
  a->set_data_ptr(b->set_data_ptr(std::move(a_data)));
  at::Allocator* a_allocator = a->allocator();
  at::Allocator* b_allocator = b->allocator();
  bool a_resizable = a->resizable();
  bool b_resizable = b->resizable();
  a->set_resizable(false);
  b->set_resizable(false);
  a->set_allocator(b_allocator);
  b->set_allocator(a_allocator);
  a->set_resizable(b_resizable);
  b->set_resizable(a_resizable);
}
"""


_EXTENSION_NAME = "inductor_xpugraph_stale_outputs_" + re.sub(r"\W", "_", torch.__version__)
# A build takes well under a minute (about 30 s on two cores): a lock file older than this is
# one that a build which did not finish left behind.
STALE_LOCK_SECONDS = 300.0


def build_lock_is_a_file() -> bool:
    """Whether torch's extension builds lock with a file whose existence blocks (``FileBaton``,
    torch 2.11-2.13), which a build that died leaves behind for good. From torch 2.14 the lock
    is an OS-level one (``FileLock``): the kernel releases it when its holder dies, and its file
    stays after every build, so its existence says nothing."""
    from torch.utils import cpp_extension

    return "FileBaton" in vars(cpp_extension)


def wait_for_build_lock(build_directory: str, stale_after: float = STALE_LOCK_SECONDS) -> None:
    """Wait while another process builds the extension in ``build_directory``; remove its
    lock file once it is older than ``stale_after`` seconds (its build died)."""
    lock = os.path.join(build_directory, "lock")
    while os.path.exists(lock):
        try:
            age = time.time() - os.path.getmtime(lock)
        except FileNotFoundError:  # released just now
            return
        if age > stale_after:
            log.warning(
                "inductor_xpugraph: removing %s, left %.0f s ago by a build of the "
                "stale-output extension that did not finish",
                lock,
                age,
            )
            with contextlib.suppress(FileNotFoundError):
                os.remove(lock)
            return
        time.sleep(0.5)


@functools.cache
def _extension() -> ModuleType | None:
    try:
        from torch.utils.cpp_extension import _get_build_directory, load_inline

        if build_lock_is_a_file():
            wait_for_build_lock(_get_build_directory(_EXTENSION_NAME, False))
        return load_inline(
            name=_EXTENSION_NAME,
            cpp_sources=_EXTENSION_SOURCE,
            functions=["invalidate_tensor", "invalidate_storage", "swap_storage_data"],
            verbose=False,
        )
    except Exception as error:  # no compiler, no headers, read-only cache...
        log.warning(
            "inductor_xpugraph: cannot build the stale-output extension (%s); outputs of "
            "earlier generations the caller still holds are copied out of the graph pool "
            "where this torch can swap storages (2.13 on), and otherwise silently hold "
            "overwritten data. Clone outputs you keep across calls.",
            error,
        )
        return None


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
    log.info("inductor_xpugraph: building the storage extension for this torch (once, cached)")
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
