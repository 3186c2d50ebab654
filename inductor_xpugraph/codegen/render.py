"""Render the jinja2 templates in ``inductor_xpugraph/templates`` into wrapper source."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jinja2

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters["pyrepr"] = repr
    env.filters["pytuple"] = _python_tuple
    env.filters["input_list"] = _input_list
    env.filters["pydict_lines"] = _python_dict_lines
    env.filters["comment"] = lambda text: str(text).replace("\n", "\n# ")
    return env


def _runs(indices: Any) -> list[tuple[int, int]]:
    """Sorted indices as (first, last) runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _python_tuple(indices: Any) -> str:
    """A tuple literal; runs of 3+ consecutive indices as ``*range(a, b)`` to stay short."""
    parts = []
    for first, last in _runs(indices):
        if last - first >= 2:
            parts.append(f"*range({first}, {last + 1})")
        else:
            parts.extend(str(i) for i in range(first, last + 1))
    if len(parts) == 1:
        return f"({parts[0]},)"
    return "(" + ", ".join(parts) + ")"


def _python_dict_lines(mapping: dict[Any, Any]) -> str:
    """A dict literal with one entry per line."""
    return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in mapping.items()) + "}"


def _input_list(indices: Any) -> str:
    runs = _runs(indices)
    if not runs:
        return "none"
    count = sum(last - first + 1 for first, last in runs)
    text = ", ".join(
        str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}" for a, b in runs
    )
    return ("input " if count == 1 else "inputs ") + text


def render(template: str, **context: Any) -> str:
    env = _environment()

    def graphify(target: Any) -> str:
        return env.get_template("graphify.py.j2").render(target=target, **context).strip()

    return env.get_template(template).render(graphify=graphify, **context)
