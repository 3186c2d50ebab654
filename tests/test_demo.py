"""The README's main job, ``python -m inductor_xpugraph demo``, run as a user runs it: in a
fresh process, on the CPU emulator (``--device cpu``, so that a GPU machine checks the same);
what it shows of the generated code; and what the install's extras bring."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inductor_xpugraph.__main__ import difference_from_eager, graph_tree_lines
from inductor_xpugraph.codegen.eligibility import GraphPlan, GraphTarget
from inductor_xpugraph.codegen.render import render
from inductor_xpugraph.trees.node import Phase
from inductor_xpugraph.trees.recording_policy import RecordingSettings

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_shows_generated_graph_calls_and_graphs_replaying(tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path),
    )
    command = [
        sys.executable,
        "-m",
        "inductor_xpugraph",
        "demo",
        "--device",
        "cpu",
        "--layers",
        "2",
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = proc.stdout
    assert "_graph_trees.graphify(" in out  # the generated wrapper's lines
    assert "Results: the graphed model's output equals eager's within rtol=atol=0.0001" in out
    assert "records: 1" in out and "fallbacks: 0" in out
    assert "1 warmup, 1 record, 10 replays" in out  # the sampling loop stays graphed
    assert "report: 8 recordings" in out and "0 fallbacks" in out  # the training loop


def test_a_difference_from_eager_is_said_in_one_line_and_none_where_the_outputs_agree():
    graphed, eager = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0])
    difference = difference_from_eager(graphed, eager)
    assert difference.startswith("Tensor-likes are not close!") and "\n" not in difference
    assert difference_from_eager(eager, eager.clone()) == ""


GENERATED = """\
def call(args):
    pass


# -- graph tree (inductor_xpugraph) ----------------------------------------
# `call`: static (not copied) inputs 0, 1, 3; copied input 2; mutated none.
import inductor_xpugraph.trees as _graph_trees
call = _graph_trees.graphify(call, device='cpu:0', static_inputs=(0, 1, 3), input_names={
    0: 'arg0_1',
    1: 'arg1_1',
    3: 'arg3_1',
})
# Inductor keeps this module for the life of the process and frees `runner.partitions` with the
runner.partitions.append(call.release_handle(globals()))


if __name__ == "__main__":
    pass
"""


def test_the_demo_shows_each_graphify_call_on_one_line_with_its_first_two_names():
    assert graph_tree_lines(GENERATED).splitlines()[-1] == (
        "call = _graph_trees.graphify(call, device='cpu:0', static_inputs=(0, 1, 3), "
        "input_names={0: 'arg0_1', 1: 'arg1_1', ... 1 more})"
    )


def graphify_call(source):
    target = GraphTarget("call", static_inputs=(0,), copied_inputs=(1,), mutated_inputs=())
    plan = GraphPlan("cpu:0", Phase.INFERENCE, (target,), None, source)
    context = dict(
        plan=plan,
        device="cpu:0",
        phase="inference",
        module_label="0_inference",
        recording=RecordingSettings(),
    )
    return render("graphify.py.j2", target=target, **context)


def test_a_graphify_call_names_no_source_line_when_inductor_kept_none():
    assert "source=" not in graphify_call(None)
    assert "source='model.py:3 in forward'" in graphify_call("model.py:3 in forward")


def extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return {
        extra: [re.split(r"[^\w.-]", requirement)[0] for requirement in requirements]
        for extra, requirements in project["optional-dependencies"].items()
    }


def test_the_demo_and_test_extras_bring_numpy_so_that_torch_does_not_warn_at_import():
    assert "numpy" in extras()["demo"] and "numpy" in extras()["test"]


def test_the_test_extra_installs_every_package_a_cpu_test_skips_without():
    skipped_without = set()
    for test_file in (REPO_ROOT / "tests").rglob("*.py"):
        skipped_without |= set(re.findall(r'importorskip\("(\w+)"', test_file.read_text()))
    skipped_without.discard("tomllib")  # the standard library's (extras(), above)
    # torchvision: only a cuda test imports it, and its wheels pin one torch release.
    assert skipped_without - set(extras()["test"]) == {"torchvision"}
