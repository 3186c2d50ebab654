"""What an export directory looks like, and whether a path is one, without torch: the command
line says it before torch's import (seconds), and the export reader
(``deploy.manifest.read_manifest``) says it in the same words."""

from __future__ import annotations

import os

MANIFEST = "inductor_xpugraph.json"
WHAT_AN_EXPORT_IS = (
    "an export is the directory inductor_xpugraph.deploy.export(fn, inputs, path) writes at "
    f"path: its manifest, {MANIFEST}, beside the compiled graphs (artifact/ or artifact.bin, "
    "and training/ or training.bin where it has them)"
)


def not_an_export(path: str | os.PathLike[str]) -> str:
    """Why ``path`` is not an export directory (nothing there, a file, a directory without a
    manifest), and what one looks like; "" where it is a directory holding a manifest, whose
    fields ``read_manifest`` checks."""
    path = os.fspath(path)
    if not os.path.exists(path):
        found = "nothing is there"
    elif not os.path.isdir(path):
        is_manifest = os.path.basename(path) == MANIFEST
        found = "it is the manifest of one: give its directory" if is_manifest else "it is a file"
    elif not os.path.isfile(os.path.join(path, MANIFEST)):
        found = f"the directory holds no {MANIFEST}"
    else:
        return ""
    return f"{path} is not an inductor_xpugraph export directory: {found}; {WHAT_AN_EXPORT_IS}"
