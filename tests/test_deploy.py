"""Precompiled exports keep their graphs in a fresh process that only imports torch."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph.deploy import MANIFEST, ArtifactError, export, graphified_calls, load

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2 + 1


def example_inputs():
    torch.manual_seed(0)
    return [torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 4)]


@pytest.fixture(scope="module", params=["unpacked", "binary"])
def exported(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "mlp"
    inductor_xpugraph.disable("cpu")
    export(mlp, example_inputs(), path, format=request.param)
    assert "cpu" not in inductor_xpugraph.enabled_devices()  # export restores registration
    return path


def run_fresh(code: str, path) -> subprocess.CompletedProcess:
    env = dict(os.environ, INDUCTOR_XPUGRAPH_DEVICES="", PYTHONPATH=REPO)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_export_loads_in_a_torch_only_process_and_replays_without_compiling(exported):
    manifest = json.loads((exported / MANIFEST).read_text())
    artifact = exported / ("artifact" if manifest["format"] == "unpacked" else "artifact.bin")
    proc = run_fresh(
        f"""
        import json, sys, torch
        from torch._dynamo.utils import counters
        from torch._inductor import CompiledArtifact
        fn = CompiledArtifact.load(path={str(artifact)!r}, format={manifest["format"]!r})
        torch.manual_seed(0)
        x, w1, w2 = torch.randn(8, 16), torch.randn(16, 16), torch.randn(16, 4)
        for _ in range(4):
            out = fn(x, w1, w2)
            out = out[0] if isinstance(out, (list, tuple)) else out
            torch.testing.assert_close(out, torch.relu(x @ w1) @ w2 + 1)
        import inductor_xpugraph  # already imported by the wrapper itself
        compiles = counters["inductor"]["fxgraph_cache_miss"]
        print(json.dumps({{"stats": inductor_xpugraph.stats(), "compiles": compiles}}))
        """,
        exported,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["stats"]["records"] == 1 and result["stats"]["replays"] >= 2
    assert result["compiles"] == 0


def test_load_checks_the_export_and_returns_a_graphed_callable(exported):
    inductor_xpugraph.reset()
    fn = load(exported)
    inputs = example_inputs()
    for _ in range(3):
        out = fn(*inputs)
        out = out[0] if isinstance(out, (list, tuple)) else out
        torch.testing.assert_close(out, mlp(*inputs))
    assert inductor_xpugraph.stats()["replays"] >= 1


def test_manifest_lists_the_graphs_the_wrapper_captures(exported):
    manifest = json.loads((exported / MANIFEST).read_text())
    (graph,) = manifest["graphs"]
    assert graph["device"].startswith("cpu") and graph["phase"] == "inference"
    assert graph["static_inputs"] == [] or all(isinstance(i, int) for i in graph["static_inputs"])
    assert manifest["inductor_xpugraph"] == inductor_xpugraph.__version__


def test_inspect_cli_prints_graphs_and_wrapper_source(exported):
    proc = run_fresh(
        "import sys, runpy; sys.argv = ['x', 'inspect', sys.argv[1]]; "
        "runpy.run_module('inductor_xpugraph', run_name='__main__')",
        exported,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "graphs captured and replayed (1)" in proc.stdout
    assert "_graph_trees.graphify(" in proc.stdout


def edited_copy(exported, tmp_path, edit):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    edit(copy, manifest)
    if (copy / MANIFEST).exists() and manifest is not None:
        (copy / MANIFEST).write_text(json.dumps(manifest))
    return copy


def test_load_of_a_missing_export_says_so(tmp_path):
    with pytest.raises(ArtifactError, match="no such directory"):
        load(tmp_path / "nothing")


def test_load_of_a_corrupt_manifest_says_so(exported, tmp_path):
    copy = edited_copy(exported, tmp_path, lambda d, m: None)
    (copy / MANIFEST).write_text("{not json")
    with pytest.raises(ArtifactError, match="is corrupt"):
        load(copy)


def test_load_of_an_export_from_another_version_says_which(exported, tmp_path):
    copy = edited_copy(exported, tmp_path, lambda d, m: m.update(inductor_xpugraph="0.0.1"))
    with pytest.raises(ArtifactError, match="exported with inductor_xpugraph 0.0.1"):
        load(copy)


def test_load_for_a_device_not_present_says_so(exported, tmp_path):
    copy = edited_copy(exported, tmp_path, lambda d, m: m.update(device_type="xpu"))
    with pytest.raises(ArtifactError, match=r"torch.xpu.is_available\(\) is False"):
        load(copy)


def test_load_of_an_export_missing_its_artifact_says_so(exported, tmp_path):
    import shutil

    def remove_artifact(directory, manifest):
        target = directory / ("artifact" if manifest["format"] == "unpacked" else "artifact.bin")
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    copy = edited_copy(exported, tmp_path, remove_artifact)
    with pytest.raises(ArtifactError, match="is incomplete"):
        load(copy)


def test_graphify_calls_are_read_with_compacted_index_runs():
    source = (
        "call = _graph_trees.graphify(call, device='cuda:0', static_inputs=(0, *range(2, 5)), "
        "mutated_inputs=(), phase='forward', name='0_forward:call')"
    )
    (graph,) = graphified_calls(source)
    assert graph["static_inputs"] == [0, 2, 3, 4] and graph["phase"] == "forward"
