"""The documentation's examples run, and do what the text says they do.

The rule, for README.md and docs/*.md:

- Every ```python block is runnable, unless its fence reads ```python no-run (code that needs an
  xpu or cuda device, torchrun, or is generated code shown as an example). A no-run block must
  still be valid Python.
- A runnable block runs as written, on its own: a reader may copy it alone. One whose fence
  reads ```python continues goes on from the runnable block before it, in the same namespace,
  as a reader would type both into one session. Blocks run on the CPU emulator, each page's in
  order: a block enables the device it uses itself (``inductor_xpugraph.enable("cpu")``), as a
  user must; nothing is enabled for it.
- A ```text output block right after a runnable block is what that block prints. Its output must
  match, with doctest's ELLIPSIS (``...`` stands for any text) and NORMALIZE_WHITESPACE.
- Other blocks (```bash, ```text) are never run.

All pages run in one child process (one import of torch), each from a fresh runtime: a working
directory of its own, ``torch._dynamo.reset()``, ``inductor_xpugraph.reset()``, and the settings
and enabled devices the process started with.
"""

from __future__ import annotations

import dataclasses
import doctest
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
README_LINE_LIMIT = 350


@dataclasses.dataclass
class Block:
    info: str  # the fence's words: "python", "python no-run", "text output", "bash"
    code: str
    line: int  # of the opening fence, 1-based

    @property
    def runnable(self) -> bool:
        return self.info in ("python", "python continues")


def blocks_of(page: Path) -> list[Block]:
    blocks, current, lines = [], None, []
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if current is None and line.startswith("```"):
            current, lines = Block(line[3:].strip(), "", number), []
        elif current is not None and line.rstrip() == "```":
            current.code = "\n".join(lines) + "\n"
            blocks.append(current)
            current = None
        elif current is not None:
            lines.append(line)
    assert current is None, f"{page.name}:{current.line}: a code block is not closed"
    return blocks


@dataclasses.dataclass
class Example:
    code: str
    line: int
    continues: bool  # goes on from the example before, in its namespace
    expected: str | None  # the ```text output block after it, if any


def examples_of(page: Path) -> list[Example]:
    examples: list[Example] = []
    previous: Block | None = None
    for block in blocks_of(page):
        if block.info == "text output":
            assert previous is not None and previous.runnable and examples[-1].expected is None, (
                f"{page.name}:{block.line}: an output block must follow a runnable python block"
            )
            examples[-1].expected = block.code
        elif block.runnable:
            continues = block.info == "python continues"
            assert examples or not continues, f"{page.name}:{block.line}: continues nothing"
            examples.append(Example(block.code, block.line, continues, None))
        previous = block
    return examples


def _name(page: Path) -> str:
    return str(page.relative_to(REPO_ROOT))


RUNNABLE_PAGES = [page for page in PAGES if examples_of(page)]

# Runs in the child: every page's examples, each page from a fresh runtime.
_CHILD = r"""
import contextlib, io, json, os, sys, traceback
import torch
import inductor_xpugraph
from inductor_xpugraph import config

plan_path, result_path, work = sys.argv[1], sys.argv[2], sys.argv[3]
plan = json.load(open(plan_path))
initial_devices = inductor_xpugraph.enabled_devices()
initial_config = config.get_config_copy()
results = {}
for page, examples in plan.items():
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    for device in inductor_xpugraph.enabled_devices():
        if device not in initial_devices:
            inductor_xpugraph.disable(device)
    for device in initial_devices:
        inductor_xpugraph.enable(device)
    config.load_config(initial_config)
    directory = os.path.join(work, page.replace("/", "-"))
    os.makedirs(directory)
    os.chdir(directory)
    outcomes = results[page] = []
    for number, example in enumerate(examples):
        if not example["continues"]:
            namespace = {"__name__": "__docs__"}
        path = os.path.join(directory, f"example_{number}.py")
        with open(path, "w") as file:
            file.write(example["code"])
        stdout = io.StringIO()
        try:
            with contextlib.redirect_stdout(stdout):
                exec(compile(example["code"], path, "exec"), namespace)
            outcomes.append({"stdout": stdout.getvalue(), "error": None})
        except BaseException:
            outcomes.append({"stdout": stdout.getvalue(), "error": traceback.format_exc()})
json.dump(results, open(result_path, "w"))
"""


def run_examples(directory: Path, pages: list[Path], **env: str) -> dict:
    """Run ``pages``' examples in one child process (``env`` added to its environment); per
    page, each example's printed output and error, in order."""
    directory.mkdir(parents=True, exist_ok=True)
    plan = {
        _name(page): [
            {"code": e.code, "line": e.line, "continues": e.continues} for e in examples_of(page)
        ]
        for page in pages
    }
    (directory / "plan.json").write_text(json.dumps(plan))
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("INDUCTOR_XPUGRAPH_")}
    child_env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    child_env.update(env)
    paths = [str(directory / name) for name in ("plan.json", "out", "run")]
    command = [sys.executable, "-c", _CHILD, *paths]
    proc = subprocess.run(command, env=child_env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((directory / "out").read_text())


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every runnable page's examples, run in one child process."""
    return run_examples(tmp_path_factory.mktemp("docs"), RUNNABLE_PAGES)


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=_name)
def test_each_runnable_example_runs_and_prints_what_the_page_says(page, outcomes):
    examples, results = examples_of(page), outcomes[_name(page)]
    checker, flags = doctest.OutputChecker(), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    for example, result in zip(examples, results):
        where = f"{_name(page)}:{example.line}"
        assert result["error"] is None, f"{where} raised:\n{result['error']}"
        if example.expected is not None:
            assert checker.check_output(example.expected, result["stdout"], flags), (
                f"{where} printed:\n{result['stdout']}\nwhere the page says:\n{example.expected}"
            )
    assert len(results) == len(examples)


# What names a graph's source line in an example's output: ``x.py:12 in f``, or ``... in f``.
SOURCE_LINE = re.compile(r"(?:\.py:\d+|\.\.\.) in [\w<>]+")
PAGES_NAMING_LINES = [
    page
    for page in RUNNABLE_PAGES
    if any(SOURCE_LINE.search(e.expected or "") for e in examples_of(page))
]


@pytest.mark.slow
def test_examples_naming_source_lines_name_the_same_on_a_warm_cache(tmp_path):
    """Run twice in fresh processes with Inductor's caches on, one cache for both (the second
    run hits it): each example that names a source line prints what the page says both
    times, and the same lines (``trees.source_lines``)."""
    cache = str(tmp_path / "inductor-cache")
    runs = [
        run_examples(tmp_path / run, PAGES_NAMING_LINES, TORCHINDUCTOR_CACHE_DIR=cache)
        for run in ("cold", "warm")
    ]
    checker, flags = doctest.OutputChecker(), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    assert PAGES_NAMING_LINES
    for page in PAGES_NAMING_LINES:
        for number, example in enumerate(examples_of(page)):
            if not SOURCE_LINE.search(example.expected or ""):
                continue
            cold, warm = (run[_name(page)][number] for run in runs)
            where = f"{_name(page)}:{example.line}"
            assert cold["error"] is None and warm["error"] is None, where
            assert checker.check_output(example.expected, warm["stdout"], flags), (
                f"{where}, warm, printed:\n{warm['stdout']}\nwhere the page says:\n"
                f"{example.expected}"
            )
            lines = [SOURCE_LINE.findall(run["stdout"]) for run in (cold, warm)]
            assert lines[0] == lines[1], where


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_no_run_examples_are_valid_python(page):
    for block in blocks_of(page):
        if block.info == "python no-run":
            compile(block.code, f"{_name(page)}:{block.line}", "exec")
        known = ("python", "python continues", "python no-run", "text output", "text", "bash")
        assert block.info in known, f"{_name(page)}:{block.line}: unknown fence ```{block.info}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_links_lead_to_files_and_headings_that_exist(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{_name(page)}: link to {target}: no such file"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{_name(page)}: link to {target}: no such heading"


def test_the_readme_gives_the_setup_commands_as_ci_runs_them():
    readme = (REPO_ROOT / "README.md").read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    test_command = next(line for line in ci.splitlines() if line.startswith("pip install"))
    assert test_command in readme
    demo_command = (
        'pip install torch==2.13.0 "setuptools>=64" && '
        'pip install --no-build-isolation -e ".[demo]" && python -m inductor_xpugraph demo'
    )
    assert demo_command in readme


def test_the_readme_lists_every_key_of_stats():
    import inductor_xpugraph

    readme = (REPO_ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `stats()` |"))
    listed = re.findall(r"`(\w+)`", row.split("counters:", 1)[1])
    assert listed == list(inductor_xpugraph.stats())


def test_the_readme_stays_short():
    lines = len((REPO_ROOT / "README.md").read_text().splitlines())
    assert lines <= README_LINE_LIMIT, f"README.md has {lines} lines (limit {README_LINE_LIMIT})"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_the_documentation_tells_no_development_history(page):
    text = page.read_text()
    for pattern in (r"\bsessions? \d", r"\bthis session\b", r"\buntil (commit )?[0-9a-f]{7}\b"):
        match = re.search(pattern, text, flags=re.I)
        assert match is None, f"{_name(page)}: {match.group(0)!r}"
