"""Loading an export: checked against this process and against what was exported, then the
graph each call needs.

``load`` refuses, with an ``ArtifactError`` saying why, an export that is missing, corrupt,
signed with another key (or unsigned when a key is given), made by another inductor_xpugraph
or torch, compiled for a device this process lacks, or edited after it was made; torch's
loader then reads a verified private copy (``integrity``). The callable it returns checks
each call's inputs (``inputs``) and runs the training graphs when grad mode is on and an
input requires grad, the inference graph otherwise: AOTAutograd's own rule for which graph
to trace, applied per call as Dynamo's grad-mode guard would (why an export holds both:
``exporting``). A call under ``torch.no_grad()`` or ``torch.inference_mode()`` therefore
builds no autograd history and replays one graph.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from .inputs import InputSignature
from .integrity import check_signature, verified_private_copy
from .manifest import CONSTANTS, FORMATS, TRAINING, ArtifactError, read_manifest


def load(path: str | Path, *, key: bytes | str | None = None) -> Callable[..., Any]:
    """The compiled callable of an export, after checking it can run in this process.

    With ``key`` (or ``INDUCTOR_XPUGRAPH_EXPORT_KEY``), only an export whose manifest was
    signed with that key loads: the manifest holds every file's digest, so nothing of an
    export made or edited by someone without the key runs.
    """
    path = Path(path)
    manifest = read_manifest(path)
    check_signature(path, manifest, key)
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
    names = [
        artifact.name,
        *([TRAINING[manifest["format"]]] if manifest["training"] else []),
    ]
    for name in names:
        if not (path / name).exists():
            raise ArtifactError(f"{path} is incomplete: {name} is missing")
    private = verified_private_copy(path, manifest)
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
