"""Stale outputs: make a tensor raise a clear error on any later access.

When a new generation starts, the outputs handed out in the previous one are about to be
overwritten by the next replays. Each such tensor object is cut from its storage and set to
raise our message on access (the core
``TensorImpl::release_storage_and_set_meta_custom_data_ptr_error_msg_``).

- CUDA builds of torch expose that as ``torch._C._set_storage_access_error_msg``;
- elsewhere (XPU, CPU builds) a ten-line C++ extension calls the same core method. It is
  built with ``torch.utils.cpp_extension.load_inline`` the first time it is needed (about
  30 s) and cached by torch in ``TORCH_EXTENSIONS_DIR``. If it cannot be built, a warning
  says so once and stale outputs silently hold overwritten data, as plain device graphs do.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

log = logging.getLogger("inductor_xpugraph")

Invalidator = Callable[[torch.Tensor, str], None]

_EXTENSION_SOURCE = r"""
#include <torch/extension.h>

void invalidate(const at::Tensor& tensor, const std::string& message) {
  tensor.unsafeGetTensorImpl()->release_storage_and_set_meta_custom_data_ptr_error_msg_(message);
}
"""


@functools.cache
def invalidator() -> Invalidator | None:
    binding = getattr(torch._C, "_set_storage_access_error_msg", None)
    if binding is not None:
        return binding
    try:
        from torch.utils.cpp_extension import load_inline

        module = load_inline(
            name="inductor_xpugraph_stale_outputs",
            cpp_sources=_EXTENSION_SOURCE,
            functions=["invalidate"],
            verbose=False,
        )
    except Exception as error:  # no compiler, no headers, read-only cache...
        log.warning(
            "inductor_xpugraph: cannot build the stale-output extension (%s); outputs of "
            "earlier generations will silently hold overwritten data instead of raising. "
            "Clone outputs you keep across calls.",
            error,
        )
        return None
    return module.invalidate
