"""Precompiled wrappers that keep their graphs: export once, load in a serving process, inspect.

Our capture and replay calls live in the generated wrapper's source, so they survive
``torch._inductor.standalone_compile``: the artifact it saves holds that source, and loading it
anywhere runs the wrapper, whose own ``import inductor_xpugraph.trees`` brings the runtime
(upstream's loader switches Inductor's own CUDA graphs off on this path; ours stay).

``export(fn, example_inputs, dir)`` compiles ``fn`` for its example inputs and writes an
export directory: the compiled artifacts (an inference graph, and training graphs where the
example inputs require grad), the constants the function made, and a manifest with the
SHA-256 of each file. ``load(dir)`` checks the export against this process and against its
digests (and signature, with a key), and returns the compiled callable: each call's inputs
are checked against those it was compiled for, and calls under ``torch.no_grad()`` or
``torch.inference_mode()`` run the inference graph. ``describe(dir)`` (``python -m
inductor_xpugraph inspect <dir>``) prints what an export holds; ``wrapper_modules(dir)`` lists
an unpacked export's generated modules, which run directly (``python <module>.py``) time
graph replays through Inductor's benchmark harness.
``torch._inductor.CompiledArtifact.load(path=<dir>/artifact, format="unpacked")`` alone loads
the inference graph too, without these checks.

The modules, in the order an export goes through them:
- ``tracing``: the function traced with fake tensors, its tensor constants made inputs;
- ``exporting``: the compile (why an export holds an inference graph beside its training
  graphs), the files written;
- ``manifest``: the directory's layout, the manifest's fields, reading it back;
- ``integrity``: file digests, the verified private copy torch's loader reads, signing;
- ``loading``: ``load``'s checks and the graph each call runs;
- ``inputs``: the inputs an export was compiled for, checked at every call;
- ``inspection``: ``describe`` and ``wrapper_modules``.
(``exporting`` and ``loading``, not ``export`` and ``load``: this package's ``export`` and
``load`` are the functions.)
"""

from .exporting import export
from .inputs import InputSignature
from .inspection import describe, wrapper_modules
from .integrity import KEY_ENV
from .loading import load
from .manifest import (
    CONSTANTS,
    FORMATS,
    MANIFEST,
    MANIFEST_VERSION,
    RUNTIME_IMPORT,
    TRAINING,
    ArtifactError,
    graphified_calls,
    read_manifest,
)

__all__ = [
    "CONSTANTS",
    "FORMATS",
    "KEY_ENV",
    "MANIFEST",
    "MANIFEST_VERSION",
    "RUNTIME_IMPORT",
    "TRAINING",
    "ArtifactError",
    "InputSignature",
    "describe",
    "export",
    "graphified_calls",
    "load",
    "read_manifest",
    "wrapper_modules",
]
