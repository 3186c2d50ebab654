"""Which operator of a compiled graph raised: read from the error's traceback.

A capture that a device refuses fails inside one call of the generated module's ``call``
(or of a partition of it): the line of that module where the error passed names the operator,
as Inductor writes it (``buf1 = torch.ops.mylib.sync.default(buf0)``, or
``extern_kernels.mm(...)`` for ATen's). The innermost frame of the module is that line; its
text, from the module's file, gives the name ``never_capture_ops`` takes
(``"namespace::op"``). A line that calls no operator (a Triton kernel's launch, say) names
none. This reads only the traceback: it works the same on every device, and costs nothing
until a capture fails.
"""

from __future__ import annotations

import dataclasses
import inspect
import linecache
import re
from collections.abc import Callable
from typing import Any

# ``torch.ops.<namespace>.<op>.<overload>(`` and ``aten.<op>.<overload>(`` (Inductor binds
# ``aten = torch.ops.aten``), and ``extern_kernels.<op>(`` (ATen's out= variants).
_OPERATOR_CALL = re.compile(r"\btorch\.ops\.(\w+)\.(\w+)(?:\.\w+)?\(|\baten\.(\w+)(?:\.\w+)?\(")
_EXTERN_KERNEL = re.compile(r"\bextern_kernels\.(\w+)\(")


@dataclasses.dataclass(frozen=True)
class FailedOperator:
    """The operator a generated module was running when an error passed through it."""

    #: "namespace::op", as ``config.never_capture_ops`` takes it.
    name: str
    #: The generated module's line that called it, stripped.
    line: str


def operator_that_raised(error: BaseException, fn: Callable[..., Any]) -> FailedOperator | None:
    """The operator of ``fn``'s module (a generated wrapper's ``call``) on whose line
    ``error`` passed last, or None where the error passed through no such line."""
    filename = _source_file(fn)
    if filename is None:
        return None
    line = None
    traceback = error.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code.co_filename == filename:
            line = linecache.getline(filename, traceback.tb_lineno).strip()
        traceback = traceback.tb_next
    if not line:
        return None
    name = _operator_named(line)
    return FailedOperator(name, line) if name is not None else None


def _source_file(fn: Callable[..., Any]) -> str | None:
    function = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(function, "__code__", None)
    return code.co_filename if code is not None else None


def _operator_named(line: str) -> str | None:
    found = _OPERATOR_CALL.search(line)
    if found is not None:
        if found.group(3) is not None:
            return f"aten::{found.group(3)}"
        return f"{found.group(1)}::{found.group(2)}"
    extern = _EXTERN_KERNEL.search(line)
    return f"aten::{extern.group(1)}" if extern is not None else None
