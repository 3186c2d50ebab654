"""The C++ compiler Inductor's CPU kernels need, which the CPU emulator therefore needs: found as
Inductor looks for it, without compiling anything.

Inductor compiles each CPU kernel it generates from C++, with the first compiler of
``torch._inductor.config.cpp.cxx`` that runs (``torch._inductor.cpp_builder.get_cpp_compiler``).
That setting holds by default a ``None`` entry (g++ downloaded through conda, only where
``TORCH_INDUCTOR_INSTALL_GXX`` is set), then the ``CXX`` environment variable as torch's import
found it, else ``g++`` (``clang++`` on macOS). On Windows: ``CXX``, else ``cl``. Where none runs,
Inductor raises ``InvalidCxxCompiler`` from the first compile of a CPU kernel, deep inside
Dynamo: a long traceback, for what is an installation step. ``missing()`` says it in one line
up front, with the fix; ``is_missing_compiler(error)`` recognizes the error once it is raised,
and ``stopped()`` says it then.

The search looks each name up on ``PATH`` (``shutil.which``): Inductor runs ``<name>
--version`` instead, which finds the same programs; nothing is run or compiled here.
"""

from __future__ import annotations

import os
import shutil
import sys

SETTING = "torch._inductor.config.cpp.cxx"
NEEDED = (
    "the CPU emulator needs a C++ compiler: it runs Inductor's CPU kernels, which Inductor "
    "compiles from C++"
)
FIX = (
    "install one (g++: apt install g++, dnf install gcc-c++, or conda install -c conda-forge "
    "gxx), or name one in the CXX environment variable (read when torch is imported) or in "
    f"{SETTING}"
)


def candidates() -> list[str | None]:
    """The compilers Inductor tries, in its order (``None``: g++ downloaded through conda)."""
    if sys.platform == "win32":
        return [os.environ.get("CXX", "cl")]
    from torch._inductor import config

    cxx = config.cpp.cxx
    return list(cxx) if isinstance(cxx, (list, tuple)) else [cxx]


def found() -> str | None:
    """The compiler Inductor would use, as a path (or how it would get one), or None."""
    from torch._inductor import config

    if config.is_fbcode():
        return "fbcode's build toolchain"
    for candidate in candidates():
        if candidate is None:
            if sys.platform == "linux" and os.environ.get("TORCH_INDUCTOR_INSTALL_GXX"):
                conda = shutil.which(os.environ.get("CONDA_EXE") or "conda")
                if conda is not None:
                    return f"g++ through conda ({conda}; TORCH_INDUCTOR_INSTALL_GXX)"
            continue
        path = shutil.which(candidate)
        if path is not None:
            return path
    return None


def searched() -> str:
    """What Inductor looks for, in words: ``g++ (torch._inductor.config.cpp.cxx)``, with the
    ``CXX`` value where it named the compiler."""
    names = [name for name in candidates() if name is not None]
    source = "CXX" if sys.platform == "win32" else SETTING
    given = os.environ.get("CXX")
    if given is not None and given in names and sys.platform != "win32":
        source += f", from CXX={given!r}"
    return f"{', '.join(names) or 'nothing'} ({source})"


def missing() -> str:
    """One line where Inductor finds no C++ compiler: what needs one, what was looked for, and
    the fix; "" where it finds one."""
    if found() is not None:
        return ""
    return f"{NEEDED}; Inductor finds none: it looked for {searched()}. Fix: {FIX}"


def stopped() -> str:
    """One line for a run that Inductor's ``InvalidCxxCompiler`` stopped: why, and the fix."""
    return (
        "Inductor could not compile a CPU kernel: it finds no C++ compiler, which its CPU "
        f"kernels, and so the CPU emulator, need; it looked for {searched()}. Fix: {FIX}"
    )


def is_missing_compiler(error: BaseException) -> bool:
    """Whether ``error`` is, or was caused by, Inductor's ``InvalidCxxCompiler`` (Dynamo wraps
    it in ``InductorError``/``BackendCompilerFailed``, which keep it as ``inner_exception``)."""
    from torch._inductor.exc import InvalidCxxCompiler

    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        if isinstance(current, InvalidCxxCompiler):
            return True
        seen.add(id(current))
        pending += [
            getattr(current, "inner_exception", None),
            current.__cause__,
            current.__context__,
        ]
    return False
