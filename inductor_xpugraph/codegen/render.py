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
    env.filters["pytuple"] = lambda values: repr(tuple(values))
    env.filters["input_list"] = _input_list
    env.filters["comment"] = lambda text: str(text).replace("\n", "\n# ")
    return env


def _input_list(indices: Any) -> str:
    indices = list(indices)
    if not indices:
        return "none"
    return ("input " if len(indices) == 1 else "inputs ") + ", ".join(map(str, indices))


def render(template: str, **context: Any) -> str:
    env = _environment()

    def graphify(target: Any) -> str:
        return env.get_template("graphify.py.j2").render(target=target, **context).strip()

    return env.get_template(template).render(graphify=graphify, **context)
