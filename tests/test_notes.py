"""Named notes (``Note [Title]``) are defined once, in the docstring of the module that carries
them out, and every reference to one names a note that exists and, where it names a module,
the module that holds it (docs/design.md lists them)."""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = REPO_ROOT / "inductor_xpugraph"
# Notes of PyTorch's own sources that ours cite.
TORCH_NOTES = {"XPU Stream priorities"}
NOTE = re.compile(r"Note \[([^\]]+)\]")
# What may follow a reference to name the module holding the note: `` in ``handed_out`` ``,
# `` in `trees/kept_state.py` ``, or a table cell of docs/design.md.
NAMED_MODULE = re.compile(r"^`?\s*(?:in|\|)\s*`{1,2}([\w./]+?)(?:\.py)?`{1,2}")


def _definitions() -> dict[str, list[Path]]:
    """Note title -> the package modules whose docstring starts a paragraph with it (a line
    at column 0 that is the title, or the title and a colon)."""
    defined: dict[str, list[Path]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for line in path.read_text().splitlines():
            match = NOTE.match(line)
            if match and line[match.end() : match.end() + 1] in ("", ":"):
                defined.setdefault(match.group(1), []).append(path)
    return defined


def _references() -> list[tuple[Path, str, str | None]]:
    """(file, note title, module it names or None) for every reference in the package, the
    docs, the README and the tests, with line breaks inside a reference joined."""
    files = [*PACKAGE.rglob("*.py"), *(REPO_ROOT / "docs").glob("*.md"), REPO_ROOT / "README.md"]
    files += [p for p in (REPO_ROOT / "tests").rglob("*.py") if p != Path(__file__).resolve()]
    found = []
    for path in sorted(files):
        # One line per paragraph: a reference wrapped over lines (in a docstring or a
        # comment) reads as on one line.
        text = re.sub(r"\s*\n\s*(?:#:?)?\s*", " ", path.read_text())
        for match in NOTE.finditer(text):
            named = NAMED_MODULE.match(text[match.end() : match.end() + 80])
            found.append((path, match.group(1), named.group(1) if named else None))
    return found


def test_each_note_is_defined_once():
    twice = {title: paths for title, paths in _definitions().items() if len(paths) > 1}
    assert not twice, twice


def test_every_note_referred_to_is_defined():
    defined = _definitions()
    missing = {
        (str(path.relative_to(REPO_ROOT)), title)
        for path, title, _ in _references()
        if title not in defined and title not in TORCH_NOTES
    }
    assert not missing, sorted(missing)


def test_a_reference_that_names_a_module_names_the_one_holding_the_note():
    defined = _definitions()
    wrong = []
    for path, title, module in _references():
        if module is None or title not in defined:
            continue
        holder = defined[title][0]
        if re.split(r"[./]", module)[-1] != holder.stem:
            wrong.append((str(path.relative_to(REPO_ROOT)), title, module, holder.stem))
    assert not wrong, wrong


def test_design_lists_every_note_of_the_package():
    design = (REPO_ROOT / "docs" / "design.md").read_text()
    assert not [title for title in _definitions() if f"`Note [{title}]`" not in design]
