"""``inductor_xpugraph.report()``: the trees as data, text and a picture, with source lines.

Runs on the CPU emulator (real Inductor compiles); the picture needs matplotlib (the test extra).
"""

import inspect

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph.diagnostics.report_records import CallableState, NodeState
from inductor_xpugraph.trees.stats import EventKind

pytestmark = pytest.mark.usefixtures("device")


def line_of(fn, text: str) -> int:
    """The line number of the first line of ``fn`` containing ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def loss_with_a_graph_break(model, x):
    hidden = model[1](model[0](x))
    torch._dynamo.graph_break()
    return model[2](hidden).square().mean()


def mutate_a_plain_input(x):
    x.add_(1)  # not a parameter, buffer or graph output: not capturable
    return x * 2


def train(device, model, batches):
    compiled = torch.compile(loss_with_a_graph_break, mode="reduce-overhead")
    for batch in batches:
        compiled(model, torch.randn(batch, 16, device=device)).backward()
        for p in model.parameters():
            p.grad = None


def test_a_training_loop_with_a_break_two_sizes_a_rerecord_and_a_skip(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)
    ).to(device)
    train(device, model, [8] * 4 + [12] * 4)
    layer = torch.nn.Linear(8, 8).to(device)
    compiled_layer = torch.compile(layer, mode="reduce-overhead")
    x = torch.randn(2, 8, device=device)
    with torch.no_grad():
        for _ in range(3):
            compiled_layer(x)
        kept = layer.weight  # a new weight tensor: the graph records a variant for it
        layer.weight = torch.nn.Parameter(torch.randn_like(kept))
        compiled_layer(x)
    skipping = torch.compile(mutate_a_plain_input, mode="reduce-overhead")
    for _ in range(3):
        skipping(torch.randn(4, device=device))

    report = inductor_xpugraph.report()

    (tree,) = report.trees
    forwards = [n for n in tree.roots if "loss_with_a_graph_break" in (n.source or "")]
    # One root per size (a static and a dynamic graph); each path: the forward before the
    # break, the forward after it, then the two backwards in reverse order.
    assert len(forwards) == 2 and {n.sizes for n in forwards} == {(), (12,)}
    for root in forwards:
        path = [node.phase for node in root.walk()]
        assert path[:4] == ["forward", "forward", "backward", "backward"]
        assert root.state is NodeState.REPLAYING and root.replays >= 1
        assert root.source.endswith(f":{line_of(loss_with_a_graph_break, 'model[1]')} in "
                                    "loss_with_a_graph_break")  # fmt: skip
        assert root.output_bytes > 0
    # The re-record: the layer's graph has a second variant, for the new weight.
    variants = [n for n in report.nodes() if n.variants == 2]
    assert len(variants) == 2 and {n.variant for n in variants} == {0, 1}
    rerecords = [e for e in report.events if e.kind is EventKind.RERECORD]
    assert rerecords and "new addresses" in rerecords[0].reason
    # The skip names the function and the line it comes from.
    (skip,) = [e for e in report.events if e.kind is EventKind.SKIP]
    assert "writes input 0 (" in skip.reason and skip.count >= 1
    assert skip.source.endswith(f":{line_of(mutate_a_plain_input, 'add_')} in mutate_a_plain_input")
    states = {c.graph: c.state for c in report.callables}
    assert CallableState.GRAPHED in states.values()
    text = str(report)
    assert "loss_with_a_graph_break" in text and "writes input 0 (" in text
    assert f"{tree.device}, thread" in text


def scale(x):
    return x * 2 + 1


def test_a_skip_at_codegen_names_the_function_and_its_source_line(device):
    with torch._inductor.config.patch({"triton.cudagraph_skip_dynamic_graphs": True}):
        compiled = torch.compile(scale, mode="reduce-overhead", dynamic=True)
        compiled(torch.randn(8, device=device))
    (skip,) = [e for e in inductor_xpugraph.report().events if e.kind is EventKind.SKIP]
    assert "symbolic shapes" in skip.reason
    assert skip.graph.endswith(":call")
    assert skip.source.endswith(f":{line_of(scale, 'x * 2')} in scale")


def cosine_of_scaled(x):
    return (x * 7.25).cos()


def same_body_elsewhere(x):
    return (x * 7.25).cos()


def test_a_function_with_the_same_body_elsewhere_names_its_own_line(device):
    """Inductor's compile caches key on the graph, not on where it came from; the package
    keys them on its source lines too (``trees.source_lines``): a function with the same body
    is not served the first one's module, and names its own line."""

    def sources():
        return [c.source or "" for c in inductor_xpugraph.report().callables]

    x = torch.randn(8, device=device)
    torch.compile(cosine_of_scaled, mode="reduce-overhead")(x)
    torch._dynamo.reset()  # frees the first compile's graph (and its callable, once unused)
    torch.compile(same_body_elsewhere, mode="reduce-overhead")(x)
    own = f":{line_of(same_body_elsewhere, 'cos()')} in same_body_elsewhere"
    assert sum(s.endswith(own) for s in sources()) == 1, sources()


def test_the_picture_is_written(device, tmp_path):
    pytest.importorskip("matplotlib")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)
    ).to(device)
    train(device, model, [8] * 4)
    for name in ("tree.png", "tree.svg"):
        inductor_xpugraph.report(tmp_path / name)
        assert (tmp_path / name).stat().st_size > 1000


def test_the_report_command_given_a_missing_script_says_so_in_one_line_and_exits_2(
    tmp_path, capsys
):
    from inductor_xpugraph import __main__

    missing = tmp_path / "missing.py"
    assert __main__.main(["report", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no report of nothing
    assert captured.err == f"error: cannot run {missing}: no such file\n"


def test_an_empty_process_reports_no_graphs(device):
    report = inductor_xpugraph.report()
    assert report.trees == () and "no graphs recorded" in str(report)


def test_each_thread_has_its_own_tree_in_the_report(device):
    """Trees are per thread: a thread that calls compiled code shows as a tree of its own."""
    import threading

    compiled = torch.compile(lambda x: (x * 5.5).tanh(), mode="reduce-overhead")
    main_inputs = [torch.randn(8, device=device) for _ in range(3)]
    worker_inputs = [torch.randn(8, device=device) for _ in range(3)]
    errors = []
    worked, reported = threading.Event(), threading.Event()

    def work():
        try:
            for x in worker_inputs:
                compiled(x)
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)
        worked.set()
        reported.wait()  # a thread's tree ends with the thread

    for x in main_inputs:
        compiled(x)
    worker = threading.Thread(target=work, name="report-worker")
    worker.start()
    worked.wait()
    report = inductor_xpugraph.report()
    reported.set()
    worker.join()
    assert not errors
    trees = {tree.thread: tree for tree in report.trees if tree.roots}
    assert {threading.current_thread().name, "report-worker"} <= set(trees)
    for thread in (threading.current_thread().name, "report-worker"):
        (root,) = trees[thread].roots
        assert root.replays >= 1  # recorded and replayed in each thread


def test_a_recording_is_traced_under_the_compile_that_made_its_graph(device, monkeypatch):
    """``TORCH_TRACE``/tlparse: each recording is a structured-trace artifact filed under the
    compile of its graph, beside Inductor's output for it."""
    from inductor_xpugraph.trees import trace as recording_trace

    traced = []
    trace = torch._logging.trace_structured

    def keeping(name, metadata_fn=dict, **kwargs):
        traced.append((metadata_fn(), kwargs))
        trace(name, metadata_fn, **kwargs)

    monkeypatch.setattr(torch._logging, "trace_structured", keeping)
    compiled = torch.compile(lambda x: (x * 3.75).exp(), mode="reduce-overhead")
    for _ in range(3):
        compiled(torch.randn(8, device=device))
    ours = [kw for metadata, kw in traced if metadata.get("name") == "inductor_xpugraph_recording"]
    assert len(ours) == 1
    if recording_trace._TRACE_TAKES_COMPILE_ID:
        assert str(ours[0]["compile_id"]) == "0/0"
