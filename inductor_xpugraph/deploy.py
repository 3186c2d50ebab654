"""Precompiled wrappers that keep their graphs: export once, load in a serving process, inspect.

Our capture and replay calls live in the generated wrapper's source, so they survive
``torch._inductor.standalone_compile``: the artifact it saves holds that source, and loading it
anywhere runs the wrapper, whose own ``import inductor_xpugraph.trees`` brings the runtime
(upstream's loader switches Inductor's own CUDA graphs off on this path; ours stay).

An export is a directory:

    <dir>/artifact/ or <dir>/artifact.bin    standalone_compile(...).save(format=...): the
                                             inference graph
    <dir>/training/ or <dir>/training.bin    the same for the training graphs (forward and
                                             backward), where the export has them
    <dir>/inductor_xpugraph.json             the manifest: versions, device, format, the
                                             graphs the wrappers capture and their source

``export(fn, example_inputs, dir)`` writes one, with the SHA-256 of each file in the manifest;
``load(dir)`` checks the manifest against this process (versions, device present), copies the
files to a private directory checking each digest (an export edited after it was made is
refused before anything of it runs), and returns the compiled callable loaded from the copy;
``describe(dir)`` (``python -m inductor_xpugraph inspect <dir>``) prints what it holds;
``wrapper_modules(dir)`` lists an unpacked export's generated modules, which run directly
(``python <module>.py``) time graph replays through Inductor's benchmark harness.
``torch._inductor.CompiledArtifact.load(path=<dir>/artifact, format="unpacked")`` alone works
too, without these checks.

An export is compiled for its example inputs' sizes, strides, dtypes and devices (and the
values of number inputs), as a graph is captured for one set of them: the loaded callable
checks every call's inputs against them and raises ``ValueError`` naming the first that
differs. Without the check, a weight passed at its address with another shape would be read
by the graph with the old one, and a smaller input broadcast into its buffer, silently.
Calls like the last one that passed are checked in C++ (``InputSignature``). (Symbolic sizes
would not help: a graph replays one size, and the tree cannot see sizes read inside the
wrapper.)

Inference and training: a standalone compile is AOTAutograd without Dynamo's guards. AOTAutograd
traces a joint forward and backward when an example input requires grad and grad mode is on
(a model's parameters do), and the runtime wrapper of such a graph runs it under
``enable_grad()`` whatever the caller's grad mode, building autograd history from every input
that requires grad. ``torch.compile`` never runs it under ``no_grad``: grad mode is one of
Dynamo's guards, so a call under ``no_grad`` compiles an inference graph. A loaded export has
no guards, so a serving loop under ``no_grad`` ran the training forward: its outputs required
grad (with ``CompiledFunctionBackward``), the tree waited for a backward that never came and
recorded a new graph at every call, and under ``inference_mode`` autograd refused to save the
loop's inference tensors for backward. So an export holds an inference graph always (compiled
under ``no_grad``), and the training graphs where AOTAutograd would make them (an example
input requires grad, export runs with grad on); ``load`` picks per call by AOTAutograd's own
rule, as Dynamo's guard would: the training graphs when grad mode is on and an input requires
grad, the inference graph otherwise. The inference graph, not the training forward with
detached inputs: the forward would still save its activations for a backward that never
runs, in graph memory held for every call, and the inference graph lets Inductor fuse and
reuse buffers as a ``torch.compile`` under ``no_grad`` does. An export made under ``no_grad``
(or with no input requiring grad) holds only the inference graph, as before; the cost of
the other is a second compile at export, and its files.

Inductor's caches must be on: ``standalone_compile`` saves its artifact from the cache
entries the compile writes, so ``export`` refuses to start under
``TORCHINDUCTOR_FORCE_DISABLE_CACHES`` (``torch.compiler.config.force_disable_caches``, which
the environment forces over any ``config.patch``).
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import hashlib
import hmac
import json
import operator
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from . import config
from ._version import __version__
from .codegen import disable, enable, enabled_devices

MANIFEST = "inductor_xpugraph.json"
RUNTIME_IMPORT = "import inductor_xpugraph.trees"
# 2: "files", the SHA-256 of every file of the export; 3: "constants", tensors the traced
# function made, saved in CONSTANTS and appended to each call by ``load``; 4: "inputs", what
# the export was specialized on (``InputSignature``); 5: "training", whether the export holds
# training graphs (TRAINING) beside its inference graph (FORMATS)
MANIFEST_VERSION = 5
CONSTANTS = "constants.pt"
FORMATS = {"unpacked": "artifact", "binary": "artifact.bin"}
TRAINING = {"unpacked": "training", "binary": "training.bin"}
KEY_ENV = "INDUCTOR_XPUGRAPH_EXPORT_KEY"


class ArtifactError(RuntimeError):
    """An export that cannot be loaded here: missing, corrupt, or built for another setup."""


class InputSignature:
    """The caller's inputs an export was compiled for: each tensor's shape, strides, dtype and
    device, each number's value (other objects are not checked). ``check`` runs at every
    call of a loaded export, before anything else, and says whether a tensor input requires
    grad (``load`` picks the training or the inference graph by it).

    The check in Python (``_check_in_python``) decides. It costs about 0.4 µs per tensor, so
    once a call passes it, a C++ ``TensorGuards`` of that call's tensors (Dynamo's: sizes,
    strides, dtype, device, requires_grad, dispatch keys) answers for the next calls whose
    tensors match it exactly, at about 0.05 µs per tensor. It accepts a subset of what the
    Python check accepts; anything it does not accept goes back to the Python check."""

    def __init__(self, entries: list[dict[str, Any] | None]) -> None:
        self.entries = entries
        self._tensors = [i for i, entry in enumerate(entries) if entry and "shape" in entry]
        self._numbers = [i for i, entry in enumerate(entries) if entry and "value" in entry]
        tensors = [entries[i] for i in self._tensors]
        self._expected_numbers = [entries[i]["value"] for i in self._numbers]
        self._expected = (
            [(torch.Size(e["shape"]), getattr(torch, e["dtype"])) for e in tensors],
            [tuple(e["stride"]) for e in tensors],
            [torch.device(e["device"]) for e in tensors],
            self._expected_numbers,
        )
        self._only_tensors = len(self._tensors) == len(entries)
        self._same_as_verified: Any = None  # a TensorGuards of the last call that passed
        self._verified_requires_grad = False  # whether one of its tensors requires grad

    @staticmethod
    def of(example_inputs: Sequence[Any]) -> InputSignature:
        def entry(value: Any) -> dict[str, Any] | None:
            if isinstance(value, torch.Tensor):
                return {
                    "shape": list(value.shape),
                    "stride": list(value.stride()),
                    "dtype": str(value.dtype).removeprefix("torch."),
                    "device": str(value.device),
                }
            if isinstance(value, (bool, int, float)):
                return {"value": value}
            return None

        return InputSignature([entry(value) for value in example_inputs])

    def check(self, args: Sequence[Any]) -> bool:
        """Raise ``ValueError`` unless ``args`` are what the export was compiled for; else
        whether one of their tensors requires grad (the guard checks ``requires_grad`` too,
        so a call it accepts has the last verified call's answer)."""
        if self._same_as_verified is not None and len(args) == len(self.entries):
            tensors = args if self._only_tensors else [args[i] for i in self._tensors]
            try:
                if self._same_as_verified.check(*tensors) and (
                    self._only_tensors or [args[i] for i in self._numbers] == self._expected_numbers
                ):
                    return self._verified_requires_grad
            except TypeError:  # a tensor's place holds something else
                pass
        self._check_in_python(args)
        tensors = [args[i] for i in self._tensors]
        self._same_as_verified = _guard_of(tensors)
        self._verified_requires_grad = any(tensor.requires_grad for tensor in tensors)
        return self._verified_requires_grad

    def _check_in_python(self, args: Sequence[Any]) -> None:
        try:
            if len(args) == len(self.entries):
                tensors = [args[i] for i in self._tensors]
                found = (
                    list(map(_SHAPE_AND_DTYPE, tensors)),
                    list(map(torch.Tensor.stride, tensors)),
                    list(map(_DEVICE, tensors)),
                    [args[i] for i in self._numbers],
                )
                if found == self._expected:
                    return
        except (AttributeError, TypeError):  # a tensor's place holds something else
            pass
        raise ValueError(self._mismatch(args))

    def _mismatch(self, args: Sequence[Any]) -> str:
        advice = (
            "an export is compiled for its example inputs' shapes, strides, dtypes and "
            "devices: export once for each set of inputs it is called with"
        )
        if len(args) != len(self.entries):
            return (
                f"inductor_xpugraph.deploy: called with {len(args)} inputs; the export takes "
                f"{len(self.entries)} ({advice})"
            )
        for i, entry in enumerate(self.entries):
            if entry is None:
                continue
            wanted = _describe_input(entry)
            given = InputSignature.of([args[i]]).entries[0]
            if given is None or _describe_input(given) != wanted:
                got = _describe_input(given) if given else f"a {type(args[i]).__name__}"
                return (
                    f"inductor_xpugraph.deploy: input {i} is {got}; the export was compiled "
                    f"for {wanted} ({advice})"
                )
        return f"inductor_xpugraph.deploy: the inputs differ from the export's ({advice})"


# Private (tests/test_torch_private_apis.py lists it); without it every call takes the
# Python check.
try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:
    _TensorGuards = None


def _guard_of(tensors: list[torch.Tensor]) -> Any:
    """A ``TensorGuards`` that accepts exactly these tensors' metadata (None without one)."""
    if _TensorGuards is None:
        return None
    try:
        return _TensorGuards(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        )
    except Exception:  # a tensor it cannot describe: the Python check answers every call
        return None


_SHAPE_AND_DTYPE = operator.attrgetter("shape", "dtype")
_DEVICE = operator.attrgetter("device")


def _describe_input(entry: dict[str, Any]) -> str:
    if "value" in entry:
        return f"the number {entry['value']!r}"
    shape, stride, dtype = tuple(entry["shape"]), tuple(entry["stride"]), entry["dtype"]
    article = "an" if dtype[0] in "aeiou" else "a"  # an int64, a float32
    return f"{article} {dtype} tensor on {entry['device']}, shape {shape}, strides {stride}"


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
    gm, constants = _lift_tensor_constants(fn) if isinstance(fn, torch.fx.GraphModule) else (fn, [])
    gm = _traced_with_fake_tensors(gm, [*example_inputs, *constants])
    gm, made = _lift_tensor_constants(gm)
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
    with _enabled(device_type), config.patch(_export_static_inputs=static):
        with torch.no_grad():
            inference_artifact = _standalone_compiled(gm, example_inputs, static)
        training_artifact = _standalone_compiled(gm, example_inputs, static) if training else None
    path.mkdir(parents=True, exist_ok=True)
    wrappers = _saved(inference_artifact, path / FORMATS[format], format)
    if training_artifact is not None:
        wrappers += _saved(training_artifact, path / TRAINING[format], format)
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
        "files": _file_digests(path),
    }
    key_bytes = _key(key)
    if key_bytes is not None:
        manifest["signature"] = _signature(manifest, key_bytes)
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
        wrappers = _wrapper_sources(Path(unpacked))
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


def _traced_with_fake_tensors(fn: Callable[..., Any], example_inputs: list[Any]):
    """``fn`` as a graph traced with fake tensors: ``standalone_compile`` finds its shape
    environment there, and without one torch 2.15 bypasses the cache its artifact is made
    from ("CompiledArtifact has no artifact to serialize"). A graph module that already
    carries fake values with a shape environment (Dynamo's, ``make_fx(...,
    tracing_mode="fake"/"symbolic")``) is kept as it is (``export`` then specializes it on
    the example inputs); one traced with real tensors carries fake values without one, and
    is traced again."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import make_fx

    if isinstance(fn, torch.fx.GraphModule) and any(
        isinstance(node.meta.get("val"), FakeTensor)
        and node.meta["val"].fake_mode.shape_env is not None
        for node in fn.graph.nodes
        if node.op == "placeholder"
    ):
        gm = fn
    else:
        try:
            gm = make_fx(fn, tracing_mode="fake")(*example_inputs)
        except NotImplementedError as error:
            if "argument of type" not in str(error):
                raise
            # fx met an object it cannot put in a graph: a returned cache object, typically
            raise ValueError(
                f"inductor_xpugraph.export: fn returns or builds something that is not a "
                f"tensor ({error}). An export returns tensors (one, or a tuple, list or dict of "
                f"them): return those you need, e.g. out.last_hidden_state, or, for a Hugging "
                f"Face model, call it with use_cache=False so that it returns no cache object."
            ) from error
        except Exception as error:
            if "FakeTensor" not in str(error):
                raise
            reason = "reads a tensor that is not one of its inputs (a weight?)"
            raise ValueError(_WEIGHTS_AS_INPUTS.format(reason=reason)) from error
    return gm


def _lift_tensor_constants(
    gm: torch.fx.GraphModule,
) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """``gm`` (a copy, where it has any) with each tensor constant (a tensor the function
    made, such as ``torch.tensor(-1e4)``, or a weight of a graph traced with real tensors)
    made an input after the others, and their values in that order.

    ``standalone_compile`` makes them inputs of the artifact anyway, so that a loaded export
    would fail on its caller's arguments; here they are saved with the export and ``load``
    passes them (at fixed addresses: captured in place, never copied)."""
    from torch._guards import detect_fake_mode

    found = [
        node
        for node in gm.graph.nodes
        if node.op == "get_attr" and isinstance(getattr(gm, node.target, None), torch.Tensor)
    ]
    if not found:
        return gm, []
    graph, copied = torch.fx.Graph(), {}
    graph.output(graph.graph_copy(gm.graph, copied))
    owner, gm = gm, torch.fx.GraphModule(gm, graph)  # the caller's module stays as it was
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    fake_mode = detect_fake_mode([node.meta.get("val") for node in placeholders])
    constants = [getattr(owner, node.target).detach() for node in found]
    last = placeholders[-1] if placeholders else None
    for index, (original, value) in enumerate(zip(found, constants)):
        node = copied[original]
        with graph.inserting_after(last) if last else graph.inserting_before(node):
            lifted = graph.placeholder(f"constant_{index}")
        lifted.meta = dict(node.meta)
        if fake_mode is not None:
            lifted.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
        node.replace_all_uses_with(lifted)
        graph.erase_node(node)
        delattr(gm, node.target)
        last = lifted
    gm.recompile()
    return gm, constants


_WEIGHTS_AS_INPUTS = (
    "inductor_xpugraph.export: fn {reason}. An export takes every tensor it reads as an input: "
    "pass the weights in example_inputs (and to the loaded function), e.g. "
    "torch.func.functional_call(model, params, (x,)) with params among the inputs, and name "
    "their positions in static_inputs so that graphs read them in place."
)


def load(path: str | Path, *, key: bytes | str | None = None) -> Callable[..., Any]:
    """The compiled callable of an export, after checking it can run in this process.

    With ``key`` (or ``INDUCTOR_XPUGRAPH_EXPORT_KEY``), only an export whose manifest was
    signed with that key loads: the manifest holds every file's digest, so nothing of an
    export made or edited by someone without the key runs.
    """
    path = Path(path)
    manifest = read_manifest(path)
    key_bytes = _key(key)
    if key_bytes is not None:
        signature = manifest.get("signature")
        if not isinstance(signature, str):
            raise ArtifactError(f"{path} is not signed, and a key was given: refusing it")
        if not hmac.compare_digest(signature, _signature(manifest, key_bytes)):
            raise ArtifactError(
                f"{path}: its manifest's signature does not match the key given (made with "
                f"another key, or edited after export): refusing it"
            )
    for package, built_with, here in (
        ("inductor_xpugraph", manifest["inductor_xpugraph"], __version__),
        ("torch", manifest["torch"], torch.__version__),
    ):
        if built_with != here:
            raise ArtifactError(
                f"{path} was exported with {package} {built_with}; this process has {here}. "
                f"Export it again with this version."
            )
    device_type = manifest["device_type"]
    if device_type != "cpu" and not getattr(torch, device_type).is_available():
        raise ArtifactError(
            f"{path} was compiled for {device_type}, but torch.{device_type}.is_available() "
            f"is False in this process"
        )
    artifact = path / FORMATS[manifest["format"]]
    names = [artifact.name, *([TRAINING[manifest["format"]]] if manifest["training"] else [])]
    for name in names:
        if not (path / name).exists():
            raise ArtifactError(f"{path} is incomplete: {name} is missing")
    private = _verified_private_copy(path, manifest)
    from torch._inductor import CompiledArtifact

    def loaded(name: str) -> Any:
        try:
            return CompiledArtifact.load(path=str(private / name), format=manifest["format"])
        except Exception as error:
            raise ArtifactError(f"{path / name} could not be loaded (corrupt?): {error}") from error

    inference = loaded(artifact.name)
    training = loaded(TRAINING[manifest["format"]]) if manifest["training"] else None
    try:
        constants = torch.load(private / CONSTANTS) if manifest["constants"] else []
    except Exception as error:
        raise ArtifactError(
            f"{path / CONSTANTS} could not be loaded (corrupt?): {error}"
        ) from error
    check_inputs = InputSignature(manifest["inputs"]).check

    def exported(*args: Any) -> Any:
        """The export's function: the caller's inputs checked against those it was compiled
        for, then the graph AOTAutograd's rule picks (training where grad mode is on and an
        input requires grad, inference otherwise) called with the constants after them."""
        requires_grad = check_inputs(args)
        if training is not None and requires_grad and torch.is_grad_enabled():
            return training(*args, *constants)
        return inference(*args, *constants)

    return exported


def read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise ArtifactError(f"{path} is not an inductor_xpugraph export (no such directory)")
    manifest_path = path / MANIFEST
    if not manifest_path.exists():
        raise ArtifactError(f"{path} is not an inductor_xpugraph export (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError as error:
        raise ArtifactError(f"{manifest_path} is corrupt: {error}") from None
    version = manifest.get("manifest_version") if isinstance(manifest, dict) else None
    if version != MANIFEST_VERSION:
        raise ArtifactError(
            f"{manifest_path} has manifest version {version!r}; this inductor_xpugraph "
            f"({__version__}) reads version {MANIFEST_VERSION}"
        )
    fault = _manifest_fault(manifest)
    if fault is not None:
        raise ArtifactError(f"{manifest_path} is corrupt: {fault}")
    return manifest


def _key(key: bytes | str | None) -> bytes | None:
    if key is None:
        key = os.environ.get(KEY_ENV) or None
    return key.encode() if isinstance(key, str) else key


def _signature(manifest: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA256 of the manifest without its signature, in a canonical JSON form."""
    unsigned = {field: value for field, value in manifest.items() if field != "signature"}
    canonical = json.dumps(unsigned, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def _verified_private_copy(path: Path, manifest: dict[str, Any]) -> Path:
    """A copy of the files the export recorded, checked against their SHA-256, that torch's
    loader then reads: nothing edited after export, and nothing added to the export (the
    loader writes compiled kernels and locks into the directory it loads), is ever run.
    Kept for the life of the process (the loader may read kernels lazily)."""
    private = Path(tempfile.mkdtemp(prefix="inductor_xpugraph_load_"))
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    for name in manifest["files"]:
        if (path / name).is_file():
            (private / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path / name, private / name)
    difference = _file_differences(manifest["files"], _file_digests(private))
    if difference is not None:
        raise ArtifactError(
            f"{path} differs from what was exported ({difference}); nothing of it was "
            f"loaded. Export it again."
        )
    return private


def _file_differences(recorded: dict[str, str], found: dict[str, str]) -> str | None:
    """Which recorded files are changed or missing in ``found`` (name -> SHA-256), or None."""
    changed = sorted(name for name in recorded if name in found and found[name] != recorded[name])
    removed = sorted(name for name in recorded if name not in found)
    if not changed and not removed:
        return None
    return "; ".join(
        f"{label}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
        for label, names in (("changed", changed), ("removed", removed))
        if names
    )


def _file_digests(path: Path) -> dict[str, str]:
    """SHA-256 of every file of an export but its manifest, by path relative to it."""
    return {
        file.relative_to(path).as_posix(): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in sorted(path.rglob("*"))
        if file.is_file() and file.name != MANIFEST
    }


# What each manifest field holds: its type, and the values allowed where they are few.
_MANIFEST_FIELDS: dict[str, tuple[type, tuple[Any, ...] | None]] = {
    "inductor_xpugraph": (str, None),
    "torch": (str, None),
    "device_type": (str, ("cpu", "cuda", "xpu")),
    "format": (str, tuple(FORMATS)),
    "training": (bool, None),
    "graphs": (list, None),
    "wrappers": (list, None),
    "files": (dict, None),
    "constants": (int, None),
    "inputs": (list, None),
}
_GRAPH_FIELDS = {
    "name": str,
    "phase": str,
    "device": str,
    "static_inputs": list,
    "mutated_inputs": list,
}


def _manifest_fault(manifest: dict[str, Any]) -> str | None:
    """What is wrong with a parsed manifest (of this MANIFEST_VERSION), or None."""
    for field, (kind, allowed) in _MANIFEST_FIELDS.items():
        if field not in manifest:
            return f"the field {field!r} is missing"
        value = manifest[field]
        if not isinstance(value, kind):
            return f"{field!r} is {value!r}, not a {kind.__name__}"
        if allowed is not None and value not in allowed:
            return f"{field!r} is {value!r}, not one of {list(allowed)}"
    for index, graph in enumerate(manifest["graphs"]):
        if not isinstance(graph, dict):
            return f"graphs[{index}] is {graph!r}, not an object"
        for field, kind in _GRAPH_FIELDS.items():
            if not isinstance(graph.get(field), kind):
                return f"graphs[{index}][{field!r}] is {graph.get(field)!r}, not a {kind.__name__}"
    if not all(isinstance(source, str) for source in manifest["wrappers"]):
        return "'wrappers' holds something other than source text"
    for index, entry in enumerate(manifest["inputs"]):
        if not _input_entry_is_valid(entry):
            return f"inputs[{index}] is {entry!r}, not an input's description"
    return None


def _input_entry_is_valid(entry: Any) -> bool:
    """An ``InputSignature`` entry: None, a number's value, or a tensor's description."""
    if entry is None:
        return True
    if not isinstance(entry, dict):
        return False
    if set(entry) == {"value"}:
        return isinstance(entry["value"], (bool, int, float))
    return (
        set(entry) == {"shape", "stride", "dtype", "device"}
        and all(isinstance(n, int) for n in [*entry["shape"], *entry["stride"]])
        and isinstance(getattr(torch, str(entry["dtype"]), None), torch.dtype)
        and _parses_as_device(entry["device"])
    )


def _parses_as_device(name: Any) -> bool:
    try:
        torch.device(name)
    except (RuntimeError, TypeError):
        return False
    return True


def describe(path: str | Path, *, source: bool = True) -> str:
    """What an export holds: versions, device, the graphs it captures, the wrapper source."""
    manifest = read_manifest(Path(path))
    lines = [
        f"{path}: {manifest['format']} standalone_compile artifact for {manifest['device_type']}",
        f"  exported with inductor_xpugraph {manifest['inductor_xpugraph']}, "
        f"torch {manifest['torch']}",
        f"  graphs captured and replayed ({len(manifest['graphs'])}):",
    ]
    if manifest["training"]:
        lines.insert(
            2,
            f"  inference graph in {FORMATS[manifest['format']]}, run by calls under no_grad "
            f"or inference_mode; training graphs in {TRAINING[manifest['format']]}, run by "
            f"calls with grad on and an input requiring grad",
        )
    for graph in manifest["graphs"]:
        lines.append(
            f"    {graph['name']}: {graph['phase']} on {graph['device']}, "
            f"static inputs {graph['static_inputs']}, mutated {graph['mutated_inputs']}"
        )
    if not manifest["graphs"]:
        lines.append("    none: the wrapper runs un-graphed (see the record_skip reasons below)")
    inputs = manifest["inputs"]
    lines.append(f"  compiled for {len(inputs)} inputs (load checks every call against them):")
    shown = 8
    for i, entry in enumerate(inputs[:shown]):
        lines.append(f"    {i}: {_describe_input(entry) if entry else 'any object'}")
    if len(inputs) > shown:
        lines.append(f"    ... and {len(inputs) - shown} more")
    if manifest["constants"]:
        lines.append(
            f"  constants: {manifest['constants']} tensors the function made, in {CONSTANTS}; "
            f"load passes them after the caller's arguments"
        )
    difference = _file_differences(manifest["files"], _file_digests(Path(path)))
    if difference is not None:
        lines.append(
            f"  files differ from what was exported ({difference}): load refuses this export"
        )
    else:
        lines.append(f"  files: {len(manifest['files'])}, each as exported (SHA-256)")
    lines.append(f"  signed: {'yes' if 'signature' in manifest else 'no'}")
    with contextlib.suppress(ArtifactError):
        for module in wrapper_modules(path):
            lines.append(f"  run directly to time replays: python {module}")
    if source:
        # What load runs: the wrapper files of an unpacked export (the manifest's copy for a
        # binary one, whose artifact packs them).
        unpacked = manifest["format"] == "unpacked"
        directories = _artifact_directories(Path(path), manifest) if unpacked else []
        wrappers = [source for directory in directories for source in _wrapper_sources(directory)]
        origin = "from the export's files" if wrappers else "the manifest's copy"
        for index, wrapper in enumerate(wrappers or manifest["wrappers"]):
            lines += ["", f"# ---- wrapper source {index} ({origin}) ----", wrapper]
    return "\n".join(lines)


def graphified_calls(source: str) -> list[dict[str, Any]]:
    """The ``graphify(...)`` calls of a generated wrapper, with their baked-in metadata."""
    graphs = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "graphify"
        ):
            fields = {kw.arg: _literal(kw.value) for kw in node.keywords}
            fields["callable"] = ast.unparse(node.args[0]) if node.args else None
            graphs.append(fields)
    return graphs


def _literal(node: ast.expr) -> Any:
    # Tuples may hold `*range(a, b)` (how the templates compact index runs).
    if isinstance(node, ast.Tuple):
        values: list[Any] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                call = element.value
                assert isinstance(call, ast.Call) and ast.unparse(call.func) == "range"
                values.extend(range(*[ast.literal_eval(arg) for arg in call.args]))
            else:
                values.append(ast.literal_eval(element))
        return values
    return ast.literal_eval(node)


def wrapper_modules(path: str | Path) -> list[Path]:
    """The generated wrapper modules of an unpacked export, to run as scripts.

    ``python <module>.py [--times N --repeat M]`` runs the benchmark harness Inductor appends
    to every wrapper: it times ``call``, which the module has already wrapped with
    ``graphify``, so after the warmup and the capture every timed call is a graph replay.
    The inference graph's modules come first, then the training graphs' where it has them.
    A binary export holds its modules inside ``artifact.bin``: export with
    ``format="unpacked"`` to run them.
    """
    path = Path(path)
    manifest = read_manifest(path)
    if manifest["format"] != "unpacked":
        raise ArtifactError(
            f"{path} is a {manifest['format']} export: its wrapper modules are packed inside "
            f"{FORMATS[manifest['format']]}. Export with format='unpacked' to run them directly."
        )
    modules = []
    for artifact in _artifact_directories(path, manifest):
        if not artifact.is_dir():
            raise ArtifactError(f"{path} is incomplete: {artifact.name} is missing")
        found = _wrapper_files(artifact)
        if not found:
            raise ArtifactError(
                f"{artifact} holds no wrapper module that imports inductor_xpugraph"
            )
        modules += found
    return modules


def _artifact_directories(path: Path, manifest: dict[str, Any]) -> list[Path]:
    """An unpacked export's artifact directories: the inference graph's, then the training
    graphs' where it has them."""
    names = [FORMATS["unpacked"], *([TRAINING["unpacked"]] if manifest["training"] else [])]
    return [path / name for name in names]


def _wrapper_files(directory: Path) -> list[Path]:
    return [file for file in sorted(directory.rglob("*.py")) if RUNTIME_IMPORT in file.read_text()]


def _wrapper_sources(directory: Path) -> list[str]:
    return [file.read_text() for file in _wrapper_files(directory)]


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
