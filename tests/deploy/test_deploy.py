"""Precompiled code keeps its graphs in a fresh process that only imports torch.

Four ways to ship compiled code: our export (``standalone_compile`` artifacts),
``torch.compile(...).aot_compile`` + ``save_compiled_function``, the mega-cache
(``save_cache_artifacts``), and the generated wrapper module run as a script.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import uuid

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph.deploy import (
    MANIFEST,
    ArtifactError,
    describe,
    export,
    graphified_calls,
    load,
    wrapper_modules,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def run_fresh(code: str, path, **env_overrides) -> subprocess.CompletedProcess:
    env = {**os.environ, "INDUCTOR_XPUGRAPH_DEVICES": "", "PYTHONPATH": REPO, **env_overrides}
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


def test_a_loaded_export_reads_its_previous_output_passed_back_in(tmp_path):
    """Calls of a loaded artifact move no torch.compile counter: a callable met again starts
    the next step (``restart_if_repeated``), and its output passed back in is read as an
    input there too (Note [Outputs passed back in])."""

    def cell(x, w):
        return torch.tanh(x @ w)

    torch.manual_seed(0)
    x, w = torch.randn(8, 16), torch.randn(16, 16) * 0.3
    inductor_xpugraph.disable("cpu")
    export(cell, [x, w], tmp_path / "cell")
    inductor_xpugraph.reset()
    fn = load(tmp_path / "cell")
    state, expected = x, x
    for _ in range(5):
        out = fn(state, w)
        state = out[0] if isinstance(out, (list, tuple)) else out
        expected = cell(expected, w)
    torch.testing.assert_close(state, expected)
    stats = inductor_xpugraph.stats()
    assert stats["records"] == 1 and stats["replays"] >= 3, stats


def test_manifest_lists_the_graphs_the_wrapper_captures(exported):
    manifest = json.loads((exported / MANIFEST).read_text())
    (graph,) = manifest["graphs"]
    assert graph["device"].startswith("cpu") and graph["phase"] == "inference"
    assert graph["static_inputs"] == [] or all(isinstance(i, int) for i in graph["static_inputs"])
    assert manifest["inductor_xpugraph"] == inductor_xpugraph.__version__


def test_static_inputs_of_an_export_are_read_in_place_and_a_new_weight_records_again(
    tmp_path,
):
    """Weights named in ``static_inputs`` are captured where they are (not copied): the
    wrapper says so, an in-place update reaches the next replay, and a weight at another
    address makes the loaded function record again rather than read the old one."""
    inductor_xpugraph.disable("cpu")
    export(mlp, example_inputs(), tmp_path / "mlp", static_inputs=(2, 1))
    (graph,) = json.loads((tmp_path / "mlp" / MANIFEST).read_text())["graphs"]
    assert graph["static_inputs"] == [1, 2]
    inductor_xpugraph.reset()
    fn = load(tmp_path / "mlp")
    x, w1, w2 = example_inputs()
    for _ in range(3):
        (out,) = fn(x, w1, w2)
    torch.testing.assert_close(out, mlp(x, w1, w2))
    w1.mul_(0.5)  # in place: the same address
    (out,) = fn(x, w1, w2)
    torch.testing.assert_close(out, mlp(x, w1, w2))
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["rerecords"]) == (1, 0), stats
    w1_elsewhere = w1.clone()
    (out,) = fn(x, w1_elsewhere, w2)
    torch.testing.assert_close(out, mlp(x, w1_elsewhere, w2))
    assert inductor_xpugraph.stats()["rerecords"] == 1


@pytest.mark.parametrize(
    "position, given, message",
    [
        (0, torch.randn(6, 16), "input 0 is a float32 tensor on cpu, shape (6, 16)"),
        (0, torch.randn(1, 16), "shape (1, 16)"),  # copying it would broadcast, silently
        (0, torch.randn(8, 16, dtype=torch.float64), "input 0 is a float64 tensor"),
        (1, "view", "input 1 is a float32 tensor on cpu, shape (32, 8)"),  # the same address
        (2, torch.randn(4, 16).t(), "strides (1, 16)"),
        (2, 3, "input 2 is the number 3"),
    ],
)
def test_a_loaded_export_called_with_inputs_it_was_not_compiled_for_raises_naming_them(
    tmp_path, position, given, message
):
    """An export is compiled (and its graph captured) for its example inputs. A weight
    passed at its address as another shape would be read with the old one by the graph, a
    smaller input would be broadcast into the graph's buffer: each raises instead, before
    anything runs, naming the input, and the next right call replays."""
    inductor_xpugraph.disable("cpu")
    export(mlp, example_inputs(), tmp_path / "mlp", static_inputs=(1, 2))
    inductor_xpugraph.reset()
    fn = load(tmp_path / "mlp")
    inputs = example_inputs()
    for _ in range(3):
        fn(*inputs)
    wrong = list(inputs)
    wrong[position] = inputs[1].view(32, 8) if isinstance(given, str) else given
    stats = inductor_xpugraph.stats()
    with pytest.raises(ValueError, match=re.escape(message)):
        fn(*wrong)
    assert inductor_xpugraph.stats() == stats  # nothing ran
    (out,) = fn(*inputs)
    torch.testing.assert_close(out, mlp(*inputs))
    assert inductor_xpugraph.stats()["replays"] == stats["replays"] + 1


def test_a_loaded_export_accepts_inputs_that_differ_only_in_what_it_was_not_compiled_for(
    exported,
):
    """The check looks at shapes, strides, dtypes and devices: a batch made under
    ``torch.inference_mode()`` (other dispatch keys than the example's) is accepted, before
    and after calls with ordinary tensors, and gives the same result."""
    fn = load(exported)
    inputs = example_inputs()
    with torch.inference_mode():
        batch = inputs[0].clone()
    for x in (inputs[0], batch, inputs[0], batch):
        out = fn(x, *inputs[1:])
        out = out[0] if isinstance(out, (list, tuple)) else out
        torch.testing.assert_close(out, mlp(*inputs))


def test_a_loaded_export_called_with_too_few_inputs_says_how_many_it_takes(exported):
    fn = load(exported)
    with pytest.raises(ValueError, match="called with 2 inputs; the export takes 3"):
        fn(*example_inputs()[:2])


@pytest.mark.parametrize(
    "positions, message",
    [((3,), "out of range: there are 3"), (("1",), "not an input position"), ((True,), "(an int)")],
)
def test_export_refuses_static_inputs_that_are_not_input_positions(tmp_path, positions, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        export(mlp, example_inputs(), tmp_path / "mlp", static_inputs=positions)
    assert not (tmp_path / "mlp").exists()  # nothing written


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


def test_export_of_a_function_reading_a_weight_says_to_pass_it_as_an_input(tmp_path):
    linear = torch.nn.Linear(16, 4)
    with pytest.raises(ValueError, match="pass the weights in example_inputs"):
        export(lambda x: linear(x), example_inputs()[:1], tmp_path / "closure")
    assert not (tmp_path / "closure").exists()


def test_export_with_caches_forced_off_says_to_export_with_them_on(tmp_path):
    """``standalone_compile`` saves an artifact from the cache entries its compile writes:
    with ``TORCHINDUCTOR_FORCE_DISABLE_CACHES`` (which no ``config.patch`` overrides) there are
    none, and torch failed after the compile ("no artifact to save"). Export refuses before
    compiling, saying what to do, and writes nothing."""
    proc = run_fresh(
        """
        import sys, torch
        from inductor_xpugraph.deploy import export
        try:
            export(lambda x: x + 1, [torch.randn(3)], sys.argv[1])
        except RuntimeError as error:
            print(error)
        """,
        tmp_path / "add_one",
        TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "caches are disabled" in proc.stdout
    assert "TORCHINDUCTOR_CACHE_DIR at an empty directory" in proc.stdout
    assert not (tmp_path / "add_one").exists()


class _Cache:
    """An object a model returns beside its tensors (as Hugging Face models return a cache)."""

    def __init__(self, tensor):
        self.tensor = tensor


def test_export_of_a_function_returning_a_non_tensor_says_to_return_tensors(tmp_path):
    def fn(x):
        return x + 1, _Cache(x * 2)

    with pytest.raises(ValueError, match="returns or builds something that is not a tensor"):
        export(fn, [torch.randn(3)], tmp_path / "fn")
    assert not (tmp_path / "fn").exists()  # nothing written


def test_a_graph_traced_with_its_weights_exports_them_and_load_passes_them(tmp_path):
    """A graph traced with real tensors holds the weights as constants; ``standalone_compile``
    would make them inputs the caller does not pass. The export saves them and lifts them
    to static inputs after the caller's; ``load`` passes them. The caller's graph module is
    left as it was."""
    from torch.fx.experimental.proxy_tensor import make_fx

    linear = torch.nn.Linear(16, 4)
    x = example_inputs()[0]
    with torch.no_grad():
        traced = make_fx(lambda x: linear(x))(x)
    export(traced, [x], tmp_path / "linear")
    assert sum(node.op == "get_attr" for node in traced.graph.nodes) == 2
    manifest = json.loads((tmp_path / "linear" / MANIFEST).read_text())
    assert manifest["constants"] == 2 and manifest["graphs"][0]["static_inputs"] == [1, 2]
    inductor_xpugraph.reset()
    fn = load(tmp_path / "linear")
    with torch.no_grad():
        for _ in range(3):
            (out,) = fn(x)
        torch.testing.assert_close(out, linear(x))
    assert inductor_xpugraph.stats()["replays"] >= 1


def test_a_tensor_the_function_makes_is_exported_with_it(tmp_path):
    def scaled(x):
        return x * torch.tensor([1.0, 2.0, 3.0, 4.0]) - 1

    x = torch.randn(8, 4)
    export(scaled, [x], tmp_path / "scaled")
    assert "constants: 1 tensors" in describe(tmp_path / "scaled", source=False)
    (out,) = load(tmp_path / "scaled")(x)
    torch.testing.assert_close(out, scaled(x))


def test_an_export_whose_constants_were_edited_is_refused(tmp_path):
    def shifted(x):
        return x + torch.tensor([1.0, 2.0])

    export(shifted, [torch.randn(2)], tmp_path / "shifted")
    torch.save([torch.tensor([5.0, 5.0])], tmp_path / "shifted" / "constants.pt")
    with pytest.raises(ArtifactError, match="constants.pt"):
        load(tmp_path / "shifted")


def test_load_of_a_missing_export_says_so_and_what_an_export_is(tmp_path):
    with pytest.raises(ArtifactError, match="not an inductor_xpugraph export directory") as raised:
        load(tmp_path / "nothing")
    assert "nothing is there; an export is the directory" in str(raised.value)


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


def test_export_tells_inductor_its_static_inputs(tmp_path, monkeypatch):
    """Else Inductor checks every weight's alignment at every call of the loaded function
    (a standalone compile knows no static inputs; Dynamo tells it of a module's)."""
    from torch._inductor import compile_fx
    from torch._inductor.utils import fresh_cache

    told = []
    real = compile_fx.compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        told.append(tuple(kwargs.get("static_input_idxs") or ()))
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", spy)
    inductor_xpugraph.disable("cpu")
    with fresh_cache():  # a cache hit (an earlier export of `mlp`) would compile nothing
        export(mlp, example_inputs(), tmp_path / "mlp", static_inputs=(1, 2))
    assert told == [(1, 2)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a cuda device")
def test_a_loaded_export_given_a_weight_at_an_odd_address_raises_and_the_next_call_replays(
    tmp_path,
):
    """Inductor is told that the weights are static, as it is of a compiled module's
    parameters, so it no longer checks their alignment at each call; the graph checks them
    on every call that does not replay, before anything runs."""
    inputs = [t.cuda() for t in example_inputs()]
    export(mlp, inputs, tmp_path / "mlp", static_inputs=(1, 2))
    (graph,) = json.loads((tmp_path / "mlp" / MANIFEST).read_text())["graphs"]
    assert graph["aligned_inputs"] == [1, 2]
    inductor_xpugraph.reset()
    fn = load(tmp_path / "mlp")
    x, w1, w2 = inputs
    for _ in range(3):
        fn(x, w1, w2)
    odd = torch.empty(16 * 16 + 1, device="cuda")[1:].view(16, 16).copy_(w1)
    with pytest.raises(ValueError, match=r"input 1 \(.*\) at an address that is not a multiple"):
        fn(x, odd, w2)
    (out,) = fn(x, w1, w2)
    torch.testing.assert_close(out, mlp(x, w1, w2))
    assert inductor_xpugraph.stats()["records"] == 1


def test_graphify_calls_are_read_with_compacted_index_runs():
    source = (
        "call = _graph_trees.graphify(call, device='cuda:0', static_inputs=(0, *range(2, 5)), "
        "mutated_inputs=(), phase='forward', name='0_forward:call')"
    )
    (graph,) = graphified_calls(source)
    assert graph["static_inputs"] == [0, 2, 3, 4] and graph["phase"] == "forward"


def test_wrapper_modules_of_a_binary_export_say_to_export_unpacked(exported, tmp_path):
    copy = edited_copy(exported, tmp_path, lambda d, m: m.update(format="binary"))
    with pytest.raises(ArtifactError, match="format='unpacked'"):
        wrapper_modules(copy)


# ---- the other ways to ship compiled code ------------------------------------------------
# Each runs the loading side in a fresh process that imports torch only (plus, for the
# mega-cache, the extension: see that test), checks numerics against eager, and prints one
# JSON line: our counters, and Inductor's FX-cache counters (a miss is a compile).

GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a cuda device"),
]
DEPLOY_DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=GPU)]

# Defines `mlp`, `inputs` (seeded, on `device`) and `check(fn)`: four calls, each compared with
# eager, then the JSON report. Prepended to the code of every fresh process below.
FRESH_PRELUDE = """
import json, sys, torch
from torch._dynamo.utils import counters
device = {device!r}
def mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2 + 1
torch.manual_seed(0)
inputs = [torch.randn(*shape, device=device) for shape in ((8, 16), (16, 16), (16, 4))]
def check(fn, calls=4):
    for _ in range(calls):
        out = fn(*inputs)
        out = out[0] if isinstance(out, (list, tuple)) else out
        torch.testing.assert_close(out, mlp(*inputs))
def report():
    import inductor_xpugraph
    print(json.dumps({{
        "stats": inductor_xpugraph.stats(),
        "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
        "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
        "aot_autograd_hits": counters["aot_autograd"]["autograd_cache_hit"],
    }}))
"""


def run_fresh_on(device: str, code: str, path, **env) -> dict:
    proc = run_fresh(FRESH_PRELUDE.format(device=device) + textwrap.dedent(code), path, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(params=DEPLOY_DEVICES)
def deploy_device(request):
    """The device to compile for, with graphs on here; restores the registration after."""
    was_enabled = request.param in inductor_xpugraph.enabled_devices()
    inductor_xpugraph.enable(request.param)
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    yield request.param
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    if not was_enabled:
        inductor_xpugraph.disable(request.param)


def device_inputs(device):
    torch.manual_seed(0)
    return [torch.randn(*shape, device=device) for shape in ((8, 16), (16, 16), (16, 4))]


def assert_replayed_without_compiling(result, calls=4):
    # First call warms up, the second captures, every later one replays.
    assert result["stats"]["records"] == 1, result
    assert result["stats"]["replays"] == calls - 2, result
    assert result["fx_misses"] == 0, result


@pytest.mark.slow
def test_aot_compiled_function_loads_in_a_torch_only_process_and_replays(deploy_device, tmp_path):
    inputs = device_inputs(deploy_device)
    # torch 2.11 attaches `.aot_compile` only with this flag on (2.13: on by default).
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled = torch.compile(mlp, mode="reduce-overhead", fullgraph=True)
        aot = compiled.aot_compile((tuple(inputs), {}))
    aot.save_compiled_function(str(tmp_path / "mlp.aot"))

    result = run_fresh_on(
        deploy_device,
        """
        with open(sys.argv[1], "rb") as file:
            fn = torch.compiler.load_compiled_function(file)
        check(fn)
        report()
        """,
        tmp_path / "mlp.aot",
    )
    assert_replayed_without_compiling(result)


# The program both processes of the cache-artifact test compile.
PROGRAM = """import torch


def mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2 + 1
"""


def _module_from(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_cache_artifacts_hit_in_a_fresh_process_with_the_extension_enabled(
    deploy_device, tmp_path, monkeypatch
):
    # The FX/AOTAutograd cache keys hold the uuid of every device's registered pass, ours
    # included, so the loading process must enable the extension for the same devices as the
    # saving one (here: INDUCTOR_XPUGRAPH_DEVICES) before torch.compile looks the graph up;
    # otherwise it misses and compiles a stock wrapper (see test_cache.py). A cache-key tag of
    # this test's own keeps the graph's entries out of the loader's cache directory (the
    # session's, where its kernels are already built), and the compile here writes its entries
    # into an empty directory: the loader can only hit through the artifacts.
    # Both processes compile the same program: the keys hold where the graph comes from
    # (``trees.source_lines``), its files by name, so it may lie in another directory there.
    tag = f"test_deploy-{uuid.uuid4().hex}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    inputs = device_inputs(deploy_device)
    (tmp_path / "saved").mkdir()
    (tmp_path / "loaded").mkdir()
    for where in ("saved", "loaded"):
        (tmp_path / where / "program.py").write_text(PROGRAM)
    program = _module_from(tmp_path / "saved" / "program.py")
    with torch.compiler.config.patch(cache_key_tag=tag):
        compiled = torch.compile(program.mlp, mode="reduce-overhead")
        for _ in range(3):
            compiled(*inputs)
        artifacts, info = torch.compiler.save_cache_artifacts()
    torch._dynamo.reset()
    assert inductor_xpugraph.stats()["replays"] == 1 and info.inductor_artifacts
    devices = ",".join(inductor_xpugraph.enabled_devices())
    (tmp_path / "mega").write_bytes(artifacts)
    monkeypatch.undo()

    result = run_fresh_on(
        deploy_device,
        """
        with open(sys.argv[1], "rb") as file:
            torch.compiler.load_cache_artifacts(file.read())
        import inductor_xpugraph  # enables INDUCTOR_XPUGRAPH_DEVICES
        import os
        sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "loaded"))
        from program import mlp
        check(torch.compile(mlp, mode="reduce-overhead"))
        report()
        """,
        tmp_path / "mega",
        TORCH_COMPILE_CACHE_KEY_TAG=tag,
        INDUCTOR_XPUGRAPH_DEVICES=devices,
    )
    assert_replayed_without_compiling(result)
    assert result["fx_hits"] == 1 and result["aot_autograd_hits"] == 1


@pytest.fixture(scope="module", params=DEPLOY_DEVICES)
def unpacked_export(request, tmp_path_factory):
    inputs = device_inputs(request.param)
    return export(mlp, inputs, tmp_path_factory.mktemp("module") / "mlp", format="unpacked")


@pytest.mark.slow
def test_wrapper_module_run_as_a_script_times_graph_replays(unpacked_export):
    (module,) = wrapper_modules(unpacked_export)
    # What `python <module>.py --times 3 --repeat 2` runs, then our counters.
    result = run_fresh_on(
        "cpu",  # the prelude's inputs are not used: the harness makes its own
        """
        import runpy
        sys.argv = [sys.argv[1], "--times", "3", "--repeat", "2"]
        runpy.run_path(sys.argv[0], run_name="__main__")
        report()
        """,
        module,
    )
    assert_replayed_without_compiling(result, calls=3 * 2)
    assert result["stats"]["warmups"] == 1


def test_describe_of_an_unpacked_export_names_the_module_to_run(unpacked_export):
    (module,) = wrapper_modules(unpacked_export)
    assert f"run directly to time replays: python {module}" in describe(unpacked_export)


@pytest.mark.parametrize(
    "fault, edit",
    [
        ("'torch' is missing", lambda m: m.pop("torch")),
        ("'format' is 'zip', not one of", lambda m: m.update(format="zip")),
        ("'device_type' is 'tpu', not one of", lambda m: m.update(device_type="tpu")),
        ("'graphs' is None, not a list", lambda m: m.update(graphs=None)),
        ("'training' is 'yes', not a bool", lambda m: m.update(training="yes")),
        ("graphs\\[0\\]\\['name'\\] is None", lambda m: m["graphs"][0].update(name=None)),
        ("manifest version '1'", lambda m: m.update(manifest_version="1")),
        ("inputs\\[1\\] is", lambda m: m["inputs"][1].update(dtype="float99")),
    ],
)
def test_every_manifest_fault_is_an_artifact_error_from_load_and_inspect(
    exported, tmp_path, fault, edit
):
    copy = edited_copy(exported, tmp_path, lambda d, m: edit(m))
    with pytest.raises(ArtifactError, match=fault):
        load(copy)
    with pytest.raises(ArtifactError, match=fault):
        describe(copy)


def test_an_export_edited_after_export_is_refused_before_anything_runs(exported, tmp_path):
    marker = tmp_path / "injected_code_ran"

    def inject(directory, manifest):
        if manifest["format"] == "unpacked":  # code a wrapper would run at import
            wrapper = wrapper_modules(directory)[0]
            wrapper.write_text(f"open({str(marker)!r}, 'w').close()\n" + wrapper.read_text())
        else:  # one byte of the packed artifact
            packed = directory / "artifact.bin"
            data = bytearray(packed.read_bytes())
            data[len(data) // 2] ^= 0xFF
            packed.write_bytes(bytes(data))

    copy = edited_copy(exported, tmp_path, inject)
    with pytest.raises(ArtifactError, match="differs from what was exported .changed: artifact"):
        load(copy)
    assert not marker.exists()


def test_one_byte_of_a_cache_entry_changed_is_refused_before_anything_loads(exported, tmp_path):
    if json.loads((exported / MANIFEST).read_text())["format"] != "unpacked":
        pytest.skip("a binary export is one file (its flipped byte: the test above)")
    edited = []

    def flip_a_byte_of_a_cache_entry(directory, manifest):
        entries = sorted(
            path
            for kind in ("aotautograd", "fxgraph")
            for path in (directory / "artifact" / kind).rglob("*")
            if path.is_file()
        )
        data = bytearray(entries[0].read_bytes())
        data[len(data) // 2] ^= 0x01
        entries[0].write_bytes(bytes(data))
        edited.append(entries[0].relative_to(directory).as_posix())

    copy = edited_copy(exported, tmp_path, flip_a_byte_of_a_cache_entry)
    with pytest.raises(ArtifactError, match="differs from what was exported") as refused:
        load(copy)
    assert edited[0] in str(refused.value)


KEY = "serving-key-0"


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    path = tmp_path_factory.mktemp("signed") / "mlp"
    export(mlp, example_inputs(), path, key=KEY)
    return path


def test_a_signed_export_loads_with_its_key(signed):
    fn = load(signed, key=KEY)
    torch.testing.assert_close(fn(*example_inputs())[0], mlp(*example_inputs()))


def test_the_key_can_come_from_the_environment(signed, tmp_path, monkeypatch):
    monkeypatch.setenv("INDUCTOR_XPUGRAPH_EXPORT_KEY", "another-key")
    with pytest.raises(ArtifactError, match="does not match the key"):
        load(signed)


def test_a_signed_export_is_refused_with_another_key(signed):
    with pytest.raises(ArtifactError, match="does not match the key"):
        load(signed, key="another-key")


def test_an_unsigned_export_is_refused_when_a_key_is_given(exported):
    with pytest.raises(ArtifactError, match="is not signed"):
        load(exported, key=KEY)


def test_a_signed_export_with_an_edited_manifest_is_refused_before_anything_runs(signed, tmp_path):
    """Code injected into a wrapper, with the manifest's digest updated to match it."""
    import hashlib

    marker = tmp_path / "injected_code_ran"

    def inject(directory, manifest):
        wrapper = wrapper_modules(directory)[0]
        wrapper.write_text(f"open({str(marker)!r}, 'w').close()\n" + wrapper.read_text())
        name = wrapper.relative_to(directory).as_posix()
        manifest["files"][name] = hashlib.sha256(wrapper.read_bytes()).hexdigest()

    copy = edited_copy(signed, tmp_path, inject)
    with pytest.raises(ArtifactError, match="does not match the key"):
        load(copy, key=KEY)
    assert not marker.exists()
    load(copy)  # without a key only the digests are checked: they match, the code runs
    assert marker.exists()


def test_inspect_shows_the_wrapper_that_will_run_and_whether_files_changed(exported, tmp_path):
    assert "each as exported (SHA-256)" in describe(exported)

    def edit(directory, manifest):
        if manifest["format"] == "unpacked":
            wrapper = wrapper_modules(directory)[0]
            wrapper.write_text("# edited after export\n" + wrapper.read_text())
        else:
            (directory / "artifact.bin").write_bytes(b"garbage")

    report = describe(edited_copy(exported, tmp_path, edit))
    assert "files differ from what was exported (changed: artifact" in report
    assert "load refuses this export" in report
    if "unpacked" in report.splitlines()[0]:
        assert "# edited after export" in report  # the files' source, not the manifest's
