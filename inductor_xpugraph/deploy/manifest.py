"""An export's files and manifest: the directory's layout, what the manifest holds, and
reading it back (every field checked before anything of the export is used).

    <dir>/artifact/ or <dir>/artifact.bin    standalone_compile(...).save(format=...): the
                                             inference graph
    <dir>/training/ or <dir>/training.bin    the same for the training graphs (forward and
                                             backward), where the export has them
    <dir>/constants.pt                       tensors the traced function made, if any
    <dir>/inductor_xpugraph.json             the manifest: versions, device, format, the
                                             inputs compiled for, the graphs the wrappers
                                             capture and their source, every file's SHA-256

The graphs are read from the generated wrappers' own ``graphify(...)`` calls, whose keyword
arguments carry the metadata baked in at codegen.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import torch

from .._export_directory import MANIFEST, not_an_export
from .._version import __version__

RUNTIME_IMPORT = "import inductor_xpugraph.trees"
# 2: "files", the SHA-256 of every file of the export; 3: "constants", tensors the traced
# function made, saved in CONSTANTS and appended to each call by ``load``; 4: "inputs", what
# the export was specialized on (``InputSignature``); 5: "training", whether the export holds
# training graphs (TRAINING) beside its inference graph (FORMATS)
MANIFEST_VERSION = 5
CONSTANTS = "constants.pt"
# Where each format keeps the inference graph's artifact, and the training graphs'.
FORMATS = {"unpacked": "artifact", "binary": "artifact.bin"}
TRAINING = {"unpacked": "training", "binary": "training.bin"}


class ArtifactError(RuntimeError):
    """An export that cannot be loaded here: missing, corrupt, or built for another setup."""


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the export at ``path``, every field checked (``ArtifactError`` else)."""
    why_not = not_an_export(path)
    if why_not:
        raise ArtifactError(why_not)
    manifest_path = path / MANIFEST
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


def artifact_directories(path: Path, manifest: dict[str, Any]) -> list[Path]:
    """An unpacked export's artifact directories: the inference graph's, then the training
    graphs' where it has them."""
    names = [
        FORMATS["unpacked"],
        *([TRAINING["unpacked"]] if manifest["training"] else []),
    ]
    return [path / name for name in names]


def wrapper_files(directory: Path) -> list[Path]:
    """The generated wrapper modules under an unpacked artifact: those importing our runtime."""
    return [file for file in sorted(directory.rglob("*.py")) if RUNTIME_IMPORT in file.read_text()]


def wrapper_sources(directory: Path) -> list[str]:
    """The source of each of ``wrapper_files(directory)``."""
    return [file.read_text() for file in wrapper_files(directory)]
