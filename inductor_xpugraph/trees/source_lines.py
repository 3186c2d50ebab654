"""Which line of the user's program a graph comes from, for events, logs and the report.

The wrapper codegen writes the line of the graph's first op (or of the op that prevents
capture) into the generated module (``source=``). That line is right when the module is
loaded by the compile that generated it. Inductor's compile caches key on the graph, not on
where it came from: left alone, a hit would serve a module that another program, or an
earlier version of this one, generated, with that program's line (an edited script's old line
numbers; a second function with the same body naming the first).

So the caches are keyed on where the graph comes from: ``graph_sources()``, the stack traces
Dynamo recorded for every op of the graph being compiled (files by name: the same program in
another directory or on another machine hits), goes into the package's cache-key pass
(``codegen.cache_key``), for the FX graph cache and AOTAutograd's alike. A backward
compiled later, outside Dynamo, gets the sources its forward's compile noted. A hit then
brings a module generated for these very lines, and the line it carries is used: the second
run names what the first named. Only a module loaded outside such a compile (a deployed
export, a graph Dynamo did not trace) takes its line from the stack instead: the innermost
frame of the user's code that led to this load, which is the compiled call, or the
``backward()`` that compiled a backward graph.
"""

from __future__ import annotations

import os
import re
import sys
import types
from typing import Any

from torch._dynamo.symbolic_convert import tls as _dynamo_tls
from torch._guards import CompileContext
from torch._inductor.graph import GraphLowering
from torch._inductor.virtualized import V

_STDLIB_DIR = os.path.dirname(os.path.realpath(os.__file__)) + os.sep


def format_source(path: str, line: int | str, function: str) -> str:
    """``path:line in function``, the path relative to the working directory below it."""
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    if not relative.startswith(".."):
        path = relative
    return f"{path}:{line} in {function.strip()}"


def source_at_load(generated: str | None) -> str | None:
    """The source line of a graph whose module is being loaded now (see the docstring)."""
    if isinstance(V.graph, GraphLowering):  # the compile that generated the module
        return generated
    if graph_sources() is not None:  # a cache hit keyed on these very lines
        return generated
    return user_frame_source()


# A frame's file in a stack trace, its directory apart: 'File "/a/b/x.py"' -> x.py.
_DIRECTORY = re.compile(r'File "(?:[^"]*[\\/])?([^"\\/]+)"')

# The sources noted for each compile, by compile id, for its backward compiled later.
_SOURCES_BY_COMPILE: dict[Any, str] = {}
_NOTED_COMPILES = 4096  # the oldest forgotten beyond this


def graph_sources() -> str | None:
    """Where the graph being compiled now comes from: the stack trace of each op of Dynamo's
    graph, in order (its files by name, lines, functions and code), or None outside a compile
    Dynamo traced. For a backward compiled after its forward, what the forward's compile
    noted (AOTAutograd compiles it under the forward's compile id)."""
    compile_id = CompileContext.current_compile_id()
    tx = getattr(_dynamo_tls, "current_tx", None)
    if tx is None:
        return _SOURCES_BY_COMPILE.get(compile_id) if compile_id is not None else None
    traces = [node.meta.get("stack_trace") or "" for node in tx.output.graph.nodes]
    # Files by name, not by directory: the same program elsewhere (another checkout, a
    # container, cache artifacts loaded on another machine) hits what it saved.
    sources = _DIRECTORY.sub(r'File "\1"', "\n".join(traces))
    if compile_id is not None:
        if len(_SOURCES_BY_COMPILE) >= _NOTED_COMPILES:
            del _SOURCES_BY_COMPILE[next(iter(_SOURCES_BY_COMPILE))]
        _SOURCES_BY_COMPILE[compile_id] = sources
    return sources


def user_frame_source() -> str | None:
    """The innermost frame on this thread's stack that is the user's code (not torch's,
    ours or the standard library's), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _is_library(frame):
            code = frame.f_code
            return format_source(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return None


def caller_source() -> str | None:
    """The innermost frame of the program itself: not torch's, ours, the standard
    library's, nor an installed package's (a model library calling the compiled code);
    ``user_frame_source()`` when every frame is one of those."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _is_library(frame) and not _is_installed(frame):
            code = frame.f_code
            return format_source(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return user_frame_source()


def _is_installed(frame: types.FrameType) -> bool:
    path = frame.f_code.co_filename
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


def _is_library(frame: types.FrameType) -> bool:
    """Torch (Inductor's generated modules included: they are named ``torch._inductor...``),
    this package, and the standard library (not what is installed beside it)."""
    module = frame.f_globals.get("__name__") or ""
    if module.split(".")[0] in ("torch", "inductor_xpugraph"):
        return True
    filename = frame.f_code.co_filename
    if filename.startswith("<frozen"):
        return True
    path = os.path.realpath(filename)
    return path.startswith(_STDLIB_DIR) and "site-packages" not in path


# One frame of an FX node's ``stack_trace``: 'File "x.py", line 12, in f\n    code'.
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)')


def user_source(stack_trace: str | None) -> str | None:
    """The innermost frame of a stack trace Dynamo recorded, as ``path:line in function``
    (the path relative to the working directory when it lies below it)."""
    frames = _FRAME.findall(stack_trace or "")
    if not frames:
        return None
    return format_source(*frames[-1])
