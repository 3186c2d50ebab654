"""An export is run only as it was made: file digests, the private copy load reads, signing.

The manifest records the SHA-256 of every file of the export. ``load`` copies those files to
a private directory, checks each against its digest, and refuses the export, before torch's
loader reads anything, if one was changed or removed; the loader then reads only that copy
(it writes compiled kernels and locks into the directory it loads, so a file added to the
export is never read either). Against someone who also rewrites the digests, an export can
be signed: an HMAC-SHA256 of the manifest (which holds every digest) with a key given to
``export`` and ``load`` (or ``INDUCTOR_XPUGRAPH_EXPORT_KEY``).
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .manifest import MANIFEST, ArtifactError

KEY_ENV = "INDUCTOR_XPUGRAPH_EXPORT_KEY"


def key_from(key: bytes | str | None) -> bytes | None:
    """The signing key as bytes: ``key``, else ``INDUCTOR_XPUGRAPH_EXPORT_KEY``; None without."""
    if key is None:
        key = os.environ.get(KEY_ENV) or None
    return key.encode() if isinstance(key, str) else key


def check_signature(path: Path, manifest: dict[str, Any], key: bytes | str | None) -> None:
    """With a key (given, or from the environment), refuse an export whose manifest is not
    signed with it."""
    key_bytes = key_from(key)
    if key_bytes is None:
        return
    signature = manifest.get("signature")
    if not isinstance(signature, str):
        raise ArtifactError(f"{path} is not signed, and a key was given: refusing it")
    if not hmac.compare_digest(signature, signature_of(manifest, key_bytes)):
        raise ArtifactError(
            f"{path}: its manifest's signature does not match the key given (made with "
            f"another key, or edited after export): refusing it"
        )


def signature_of(manifest: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA256 of the manifest without its signature, in a canonical JSON form."""
    unsigned = {field: value for field, value in manifest.items() if field != "signature"}
    canonical = json.dumps(unsigned, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, canonical, hashlib.sha256).hexdigest()


def verified_private_copy(path: Path, manifest: dict[str, Any]) -> Path:
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
    difference = file_differences(manifest["files"], file_digests(private))
    if difference is not None:
        raise ArtifactError(
            f"{path} differs from what was exported ({difference}); nothing of it was "
            f"loaded. Export it again."
        )
    return private


def file_differences(recorded: dict[str, str], found: dict[str, str]) -> str | None:
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


def file_digests(path: Path) -> dict[str, str]:
    """SHA-256 of every file of an export but its manifest, by path relative to it."""
    return {
        file.relative_to(path).as_posix(): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in sorted(path.rglob("*"))
        if file.is_file() and file.name != MANIFEST
    }
