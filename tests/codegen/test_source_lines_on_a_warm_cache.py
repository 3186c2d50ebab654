"""The second run of a program names the source lines the first named.

Inductor's caches key on the graph, not on where it comes from; the package keys them on
the graph's source lines too (``trees.source_lines``), so a hit carries lines generated for
this very code. Each run is a fresh process sharing one cache directory, as two runs of a
user's script: a function with a graph break (two graphs, the second in Dynamo's resume
function) and a training step (a backward, compiled when ``backward()`` first runs).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """{padding}
import json
import torch
from torch._dynamo.utils import counters
import inductor_xpugraph

inductor_xpugraph.enable("cpu")


def forward(x):
    y = x.sin() * 2
    torch._dynamo.graph_break()
    return y.cos() + 1


def train_step(model, x):
    loss = model(x).relu().sum()
    loss.backward()


compiled = torch.compile(forward, mode="reduce-overhead")
for _ in range(3):
    compiled(torch.randn(8))
model = torch.nn.Linear(8, 8)
step = torch.compile(train_step, mode="reduce-overhead")
for _ in range(3):
    step(model, torch.randn(4, 8))
lines = {{c.graph: c.source for c in inductor_xpugraph.report().callables}}
hits = counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
print(json.dumps({{"lines": lines, "hits": hits}}))
"""


def run(program: Path, cache: Path, padding: int = 0) -> dict:
    program.write_text(PROGRAM.format(padding="\n" * padding))
    env = dict(
        os.environ,
        TORCHINDUCTOR_CACHE_DIR=str(cache),
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        INDUCTOR_XPUGRAPH_DEVICES="",
    )
    proc = subprocess.run(
        [sys.executable, str(program)],
        cwd=program.parent, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[dict]:
    """Cold, warm, and warm again with three lines added at the top of the script."""
    directory = tmp_path_factory.mktemp("program")
    program, cache = directory / "script.py", directory / "cache"
    return [run(program, cache), run(program, cache), run(program, cache, padding=3)]


def named_lines(result: dict) -> dict[str, tuple[str, int]]:
    """Each graph's function (a resume function without its line) and line in script.py."""
    found = {}
    for graph, source in result["lines"].items():
        match = re.fullmatch(r"script\.py:(\d+) in (\S+)", source or "")
        assert match, result["lines"]
        found[graph] = (re.sub(r"_at_\d+$", "", match[2]), int(match[1]))
    return found


def line_of(code: str, padding: int = 0) -> int:
    """The line of ``code`` in the program."""
    program = PROGRAM.format(padding="\n" * padding).splitlines()
    return next(i for i, text in enumerate(program, 1) if text.strip() == code)


def test_the_first_run_names_the_lines_of_the_compiled_code(runs):
    lines = set(named_lines(runs[0]).values())
    assert ("forward", line_of("y = x.sin() * 2")) in lines
    assert ("torch_dynamo_resume_in_forward", line_of("return y.cos() + 1")) in lines
    assert ("train_step", line_of("loss = model(x).relu().sum()")) in lines


def test_a_warm_cache_names_the_same_lines(runs):
    cold, warm, _ = runs
    assert warm["hits"] >= 1
    assert warm["lines"] == cold["lines"]


def test_an_edited_script_names_its_new_lines(runs):
    cold, _, edited = runs
    moved = {graph: (name, line + 3) for graph, (name, line) in named_lines(cold).items()}
    assert moved == named_lines(edited)
