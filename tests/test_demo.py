"""The README's main job, ``python -m inductor_xpugraph demo``, run as a user runs it: in a
fresh process, on the CPU emulator (``--device cpu``, so that a GPU machine checks the same)."""

import os
import subprocess
import sys
from pathlib import Path

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
    assert "records: 1" in out and "fallbacks: 0" in out
    assert "1 warmup, 1 record, 10 replays" in out  # the sampling loop stays graphed
    assert "report: 8 recordings" in out and "0 fallbacks" in out  # the training loop
