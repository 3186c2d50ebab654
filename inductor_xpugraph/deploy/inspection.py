"""What an export holds, for a person (``python -m inductor_xpugraph inspect <dir>``) and for
running its generated modules directly.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from .inputs import describe_input
from .integrity import file_differences, file_digests
from .manifest import (
    CONSTANTS,
    FORMATS,
    TRAINING,
    ArtifactError,
    artifact_directories,
    read_manifest,
    wrapper_files,
    wrapper_sources,
)


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
        lines.append(f"    {i}: {describe_input(entry) if entry else 'any object'}")
    if len(inputs) > shown:
        lines.append(f"    ... and {len(inputs) - shown} more")
    if manifest["constants"]:
        lines.append(
            f"  constants: {manifest['constants']} tensors the function made, in {CONSTANTS}; "
            f"load passes them after the caller's arguments"
        )
    difference = file_differences(manifest["files"], file_digests(Path(path)))
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
        directories = artifact_directories(Path(path), manifest) if unpacked else []
        wrappers = [source for directory in directories for source in wrapper_sources(directory)]
        origin = "from the export's files" if wrappers else "the manifest's copy"
        for index, wrapper in enumerate(wrappers or manifest["wrappers"]):
            lines += ["", f"# ---- wrapper source {index} ({origin}) ----", wrapper]
    return "\n".join(lines)


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
    for artifact in artifact_directories(path, manifest):
        if not artifact.is_dir():
            raise ArtifactError(f"{path} is incomplete: {artifact.name} is missing")
        found = wrapper_files(artifact)
        if not found:
            raise ArtifactError(
                f"{artifact} holds no wrapper module that imports inductor_xpugraph"
            )
        modules += found
    return modules
