"""Exporting: ``fn`` compiled for its example inputs with graphs on, saved with a manifest.

The compile is Inductor's ``standalone_compile`` of the traced function (``tracing``), told
which inputs are static (the weights: graphs read them in place, as a compiled module's
parameters) and with graphs on: the generated wrappers carry our capture and replay calls,
and so does every artifact saved from them.

Inference and training graphs. A standalone compile is AOTAutograd without Dynamo's guards.
AOTAutograd traces a joint forward and backward when an example input requires grad and grad
mode is on (a model's parameters do), and the runtime wrapper of such a graph runs it under
``enable_grad()`` whatever the caller's grad mode, building autograd history from every
input that requires grad. ``torch.compile`` never runs it under ``no_grad``: grad mode is one
of Dynamo's guards, so a call under ``no_grad`` compiles an inference graph. A loaded export
has no guards. With the training graphs alone, a serving loop under ``no_grad`` ran the
training forward: its outputs required grad (``CompiledFunctionBackward``), the tree waited
for a backward that never came and recorded a new graph at every call, and under
``inference_mode`` autograd refused to save the loop's inference tensors for backward.

So an export holds an inference graph always (compiled under ``no_grad``), and the training
graphs where AOTAutograd makes them (an example input requires grad, and ``export`` runs
with grad on); ``load`` picks per call by the rule AOTAutograd picks by at compile time
(``loading``). Why not the training forward with its inputs detached, for a call under
``no_grad``: it would still compute and save activations for a backward that never runs,
in graph memory held at every call, and it is not the graph ``torch.compile`` would run
there; the inference graph is, with Inductor free to fuse and reuse buffers across what
the backward would have read. Why not export only the graph of ``export``'s own grad mode:
the same function is served and fine-tuned, and the README's example exports with grad on
then serves under ``no_grad``. The cost: a second compile at export and its files, only for
an export whose example inputs require grad (one made under ``no_grad``, or with no input
requiring grad, holds the inference graph alone).

Inductor's caches must be on: ``standalone_compile`` saves its artifact from the cache
entries its compile writes, so ``export`` refuses to start when they are forced off
(``TORCHINDUCTOR_FORCE_DISABLE_CACHES``, which the environment forces over any
``config.patch``), saying what to do instead.
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import config
from .._version import __version__
from ..codegen import disable, enable, enabled_devices
from .inputs import InputSignature
from .integrity import file_digests, key_from, signature_of
from .manifest import (
    CONSTANTS,
    FORMATS,
    MANIFEST,
    MANIFEST_VERSION,
    TRAINING,
    graphified_calls,
    wrapper_sources,
)
from .tracing import lift_tensor_constants, traced_with_fake_tensors


def export(
    fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    path: str | Path,
    *,
    format: str = "unpacked",
    key: bytes | str | None = None,
    static_inputs: Sequence[int] = (),
) -> Path:
    """Compile ``fn`` for ``example_inputs`` with graphs on, and save it to directory ``path``.

    ``fn`` is an ``fx.GraphModule`` or a function traceable by ``make_fx`` with fake tensors
    (tensor ops only, no reads of tensor values).
    ``static_inputs``: positions of inputs the caller passes at the same address in every
    call (the weights): graphs read them in place, as they read a compiled module's
    parameters, where every other tensor input is copied into the graph at each call. A
    tensor at another address there makes the loaded function record again (and run
    un-graphed if that keeps happening, see ``config.rerecord_limit``).
    With ``key`` (or ``INDUCTOR_XPUGRAPH_EXPORT_KEY``), the manifest is signed with an
    HMAC-SHA256 that ``load(..., key=...)`` checks.
    The export holds an inference graph, run by calls under ``torch.no_grad()`` or
    ``torch.inference_mode()``, and, where an example input requires grad and grad mode is
    on here, the training graphs, run by calls with grad on and an input requiring grad.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {format!r}")
    _check_caches_are_on()
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"inductor_xpugraph.export: {path} exists and is not empty")
    example_inputs = list(example_inputs)
    static = _checked_static_inputs(static_inputs, example_inputs)
    signature = InputSignature.of(example_inputs)
    device_type = _device_type_of(example_inputs)
    # Tensor constants become inputs after the caller's, at fixed addresses (load passes
    # them): those of a graph given (before tracing it with fake tensors, which cannot read
    # real ones), then those the tracing made (tensors the function creates).
    gm, constants = lift_tensor_constants(fn) if isinstance(fn, torch.fx.GraphModule) else (fn, [])
    gm = traced_with_fake_tensors(gm, [*example_inputs, *constants])
    gm, made = lift_tensor_constants(gm)
    constants += made
    if constants:
        first = len(example_inputs)
        static = (*static, *range(first, first + len(constants)))
        example_inputs = [*example_inputs, *constants]
    # What AOTAutograd makes of the example inputs as given: training graphs where one
    # requires grad and grad mode is on (the joint forward and backward).
    training = torch.is_grad_enabled() and any(
        isinstance(value, torch.Tensor) and value.requires_grad for value in example_inputs
    )
    # Each compile gets a graph of its own: a compile may change the graph it is given.
    with _enabled(device_type), config.patch(_export_static_inputs=static):
        training_artifact = None
        if training:
            training_artifact = _standalone_compiled(copy.deepcopy(gm), example_inputs, static)
        with torch.no_grad():
            inference_artifact = _standalone_compiled(copy.deepcopy(gm), example_inputs, static)
    path.mkdir(parents=True, exist_ok=True)
    wrappers = _saved(inference_artifact, path / FORMATS[format], format)
    if training_artifact is not None:
        try:
            wrappers += _saved(training_artifact, path / TRAINING[format], format)
        except RuntimeError as error:
            if "no aot_autograd artifacts" not in str(error):
                raise
            # torch 2.11's AOTAutograd cache keeps no entry for these training graphs (seen
            # on cuda), so standalone_compile cannot save them.
            training = False
            warnings.warn(
                f"inductor_xpugraph.export: torch {torch.__version__} saves no training graphs "
                f"for this function (standalone_compile: {str(error).splitlines()[0][:120]}); "
                f"the export holds its inference graph only, which every call runs: outputs "
                f"never require grad",
                stacklevel=2,
            )
    if constants:
        torch.save(constants, path / CONSTANTS)
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "inductor_xpugraph": __version__,
        "torch": torch.__version__,
        "device_type": device_type,
        "format": format,
        "training": training,
        "graphs": [graph for source in wrappers for graph in graphified_calls(source)],
        "wrappers": wrappers,
        "constants": len(constants),
        "inputs": signature.entries,
        "files": file_digests(path),
    }
    key_bytes = key_from(key)
    if key_bytes is not None:
        manifest["signature"] = signature_of(manifest, key_bytes)
    (path / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return path


def _check_caches_are_on() -> None:
    """``standalone_compile`` saves its artifact from the cache entries its compile writes:
    with the caches forced off there are none, and torch fails only once the compile is
    done ("no artifact to save"). Forced by the environment, the setting cannot be patched
    over for the export's compile."""
    from torch._inductor import config as inductor_config

    if inductor_config.force_disable_caches:
        raise RuntimeError(
            "inductor_xpugraph.export: Inductor's caches are disabled "
            "(TORCHINDUCTOR_FORCE_DISABLE_CACHES or TORCH_COMPILE_FORCE_DISABLE_CACHES is set, "
            "or torch.compiler.config.force_disable_caches is True), and an export is saved "
            "from the cache entries its compile writes. Export without that setting; to keep "
            "earlier cache entries from being reused, point TORCHINDUCTOR_CACHE_DIR at an "
            "empty directory instead."
        )


def _standalone_compiled(
    gm: torch.fx.GraphModule, example_inputs: list[Any], static: tuple[int, ...]
) -> Any:
    """``standalone_compile`` of ``gm`` with graphs on, in the caller's grad mode (which
    decides between an inference graph and training graphs)."""
    from torch._inductor import standalone_compile

    return standalone_compile(
        gm,
        example_inputs,
        dynamic_shapes="from_example_inputs",
        options={
            "config_patches": {"triton.cudagraphs": True},
            "inner_compile": _compile_with_static_inputs(static),
        },
    )


def _saved(artifact: Any, target: Path, format: str) -> list[str]:
    """Save a compiled artifact at ``target`` in ``format``; its wrappers' source."""
    with tempfile.TemporaryDirectory() as unpacked:
        artifact.save(path=unpacked, format="unpacked")
        wrappers = wrapper_sources(Path(unpacked))
        if format == "unpacked":
            shutil.copytree(unpacked, target)
    if format == "binary":
        artifact.save(path=str(target), format="binary")
    return wrappers


def _compile_with_static_inputs(static: tuple[int, ...]) -> Callable[..., Any]:
    """Inductor's ``compile_fx_inner``, told that the export's static inputs are static, as
    Dynamo tells it of a module's parameters. A standalone compile knows of none, so Inductor
    checked every input's alignment at each call (about 0.5 µs each: 70 µs for ResNet-18's
    123 inputs on an H100 host); the graphs check the static ones when they record instead
    (``GraphedCallable``). A backward graph's static inputs are Inductor's own."""
    from torch._inductor.compile_fx import compile_fx_inner

    def inner_compile(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        if not kwargs.get("is_backward"):
            known = kwargs.get("static_input_idxs") or ()
            kwargs["static_input_idxs"] = sorted({*known, *static})
        return compile_fx_inner(gm, example_inputs, **kwargs)

    return inner_compile


def _checked_static_inputs(positions: Sequence[int], example_inputs: list[Any]) -> tuple:
    static = []
    for position in positions:
        if isinstance(position, bool) or not isinstance(position, int):
            raise ValueError(
                f"inductor_xpugraph.export: static_inputs holds {position!r}, not an input "
                "position (an int)"
            )
        if not 0 <= position < len(example_inputs):
            raise ValueError(
                f"inductor_xpugraph.export: static input {position} is out of range: there "
                f"are {len(example_inputs)} example inputs"
            )
        if not isinstance(example_inputs[position], torch.Tensor):
            kind = type(example_inputs[position]).__name__
            raise ValueError(
                f"inductor_xpugraph.export: static input {position} is a {kind}, not a tensor"
            )
        static.append(position)
    return tuple(sorted(set(static)))


def _device_type_of(example_inputs: Sequence[Any]) -> str:
    types = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    accelerators = types - {"cpu"}
    if not types or len(accelerators) > 1:
        raise ValueError(
            f"inductor_xpugraph.export: example inputs must hold tensors of one device "
            f"(plus cpu), got {sorted(types)}"
        )
    return accelerators.pop() if accelerators else "cpu"


@contextlib.contextmanager
def _enabled(device_type: str) -> Iterator[None]:
    was_enabled = device_type in enabled_devices()
    enable(device_type)
    try:
        yield
    finally:
        if not was_enabled:
            disable(device_type)
