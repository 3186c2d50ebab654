"""Latency of one call, pipelined and synchronized, for every variant (issue 20).

Run on the GPU machine from the repository root:

    PYTHONPATH=. python3 benchmarks/latency.py [--workloads gpt2 bert] [--runs 5] [--out r.json]

Two modes, the same calls:
- **pipelined**: ``--calls`` calls back to back and one synchronize: throughput, µs per call.
  The host runs ahead of the device; a variant at the device's busy time is at the limit.
- **synchronized**: each call followed by a synchronize, as a caller that reads the result
  (``.item()``, a stop-token check, a server answering a request): the host's work before the
  launch is on the critical path.

Variants, each (workload, variant) in a fresh process, ``--runs`` processes each, the
variants alternated:
- ``gpu_busy``: the device time of one call's kernels (profiler, Inductor's code), the floor
  of the pipelined mode;
- ``hand_replay``: Inductor's default-mode code captured by hand in one ``torch.cuda.CUDAGraph``;
  a call copies its inputs into the static buffers and replays, with no Dynamo guards and no
  tree: the floor of a graphed call, in a process with this one graph;
- ``hand_replay_4th_graph``: the same, in a process that first instantiated three throwaway
  graphs. On the H200 (torch 2.11.0+cu130), from a process's fourth graph instantiation on,
  every graph's kernels idle 0.42-0.45 µs between each other instead of 0.10-0.13 µs
  (docs/latency.md, "The fourth graph of a process"), whatever the graphs hold. A tree instantiates
  more than three (pool keepers, warmup probes, forward and backward), upstream's as well,
  so this is the floor a process with several graphs can reach;
- ``inductor``: ``torch.compile`` default mode, no graphs;
- ``upstream``: ``mode="reduce-overhead"``, Inductor's CUDA Graph Trees;
- ``ours`` (allocator checkpointing), ``ours_portable`` (owned outputs, xpu's strategy);
- ``ours_deploy``: ``inductor_xpugraph.deploy.export`` in one process, ``deploy.load`` in the
  measured one: no Dynamo. ``add_one`` and the models (``DEPLOYABLE``); a model is exported
  as a function of its weights and inputs, the weights named ``static_inputs``;
- ``ours_module_guards_skipped``: ours compiled with
  ``guard_filter_fn=torch.compiler.skip_guard_on_all_nn_modules_unsafe`` (Dynamo keeps no
  guard on nn.Module attributes: safe while they do not change after the first call).

A run reports the median over ``--repeats``; the table shows the median of the runs and their
spread (min–max), because host timings on a shared machine move.

``--breakdown`` adds, for ``ours``, the synchronized call peeled layer by layer (when the
workload compiles to one graph): the whole call; ``GraphedCallable`` called directly (the
tree, without Dynamo, AOTAutograd and Inductor's wrapper); ``Recording.replay`` (input copy,
launch, outputs); the input copy plus ``graph.replay()`` alone; and the whole call again
with Dynamo's guards skipped (``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``
around the loop).

On ``--device cpu`` (no transformers/torchvision needed for ``add_one``, ``softmax_chain``,
``decode``), ours runs on the CPU emulator: a check that the script runs, not timings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))
import compare  # noqa: E402  (the shared workloads and the hand-captured replay)

VARIANTS = (
    "gpu_busy", "hand_replay", "hand_replay_4th_graph", "inductor", "upstream", "ours",
    "ours_portable", "ours_deploy", "ours_module_guards_skipped",
)  # fmt: skip
CUDA_ONLY = ("gpu_busy", "hand_replay", "hand_replay_4th_graph", "upstream")
WARM_CALLS = 20  # past warmup and record before anything is timed


# -- workloads: (step, inputs); step(*inputs) is one call ------------------------------------


def _from_compare(name: str, **options: Any) -> Callable[[str], tuple[Callable, Callable]]:
    def workload(device: str):
        make_step, make_inputs, _ = compare.WORKLOADS[name](device, **options)
        return make_step, make_inputs

    return workload


def _inference(build: Callable[[str], Any], make_inputs: Callable[[str], tuple]):
    def workload(device: str):
        model, inputs = _model_and_inputs(build, make_inputs, device)

        def make_step(compile):
            compiled = compile(model)

            def step(*args):
                with torch.no_grad():
                    return compiled(*args)

            return step

        return make_step, lambda: inputs

    return workload


def _model_and_inputs(build: Callable[[str], Any], make_inputs: Callable[[str], tuple], device):
    torch.manual_seed(0)
    return build(device), make_inputs(device)


def _gpt2(device):
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=5000, n_positions=128)
    return GPT2Model(config).to(device).eval()


def _bert(device):
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512
    )
    return BertModel(config).to(device).eval()


def _resnet18(device):
    import torchvision

    return torchvision.models.resnet18(weights=None).to(device).eval()


# The models, for their workloads and for ``ours_deploy`` (weights passed as static inputs).
MODELS: dict[str, tuple[Callable[[str], Any], Callable[[str], tuple]]] = {
    "gpt2": (_gpt2, lambda d: (torch.randint(0, 5000, (1, 32), device=d),)),
    "resnet18": (_resnet18, lambda d: (torch.randn(1, 3, 64, 64, device=d),)),
    "bert": (_bert, lambda d: (torch.randint(0, 30000, (2, 48), device=d),)),
}
WORKLOADS = {
    "add_one": _from_compare("add_one"),
    "softmax_chain": _from_compare("softmax_chain"),
    # The same, its 32 weights marked static (the user's lever: they are not copied).
    "softmax_chain_static": _from_compare("softmax_chain", static_weights=True),
    **{name: _inference(*model) for name, model in MODELS.items()},
    "decode": _from_compare("decode"),  # 4 layers × 256, batch 1, static KV cache
}
# ``deploy.export`` needs every tensor as an input: functions without weights, and the
# models with theirs as static inputs (``_deployable_model``).
DEPLOYABLE = ("add_one", *MODELS)


def _deployable_model(workload: str, device: str) -> tuple[Callable, list, int]:
    """The model as a function of (its parameters and buffers, then its inputs), the example
    inputs in that order, and how many of them are weights."""
    model, inputs = _model_and_inputs(*MODELS[workload], device)
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}

    def fn(*args):
        out = torch.func.functional_call(model, dict(zip(state, args)), args[len(state) :])
        return out if isinstance(out, torch.Tensor) else out[0]

    return fn, [*state.values(), *inputs], len(state)


# -- one (workload, variant) in this process ---------------------------------------------------


def instantiate_throwaway_graphs(count: int) -> None:
    """Capture, replay once and destroy ``count`` graphs of one ``x + 1`` each.

    ``hand_replay_4th_graph`` makes three before its own capture: from a process's fourth
    graph instantiation on, every graph idles longer between kernels
    (docs/latency.md, "The fourth graph of a process").
    """
    x = torch.zeros(16, device="cuda")
    stream = torch.cuda.Stream()
    for _ in range(count):
        graph = torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            graph.capture_begin()
            x + 1
            graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
        del graph


def build_step(workload: str, variant: str, device: str, export_path: str | None):
    """The callable a variant times, past its warmup and record, and one set of inputs."""
    import inductor_xpugraph

    make_step, make_inputs = WORKLOADS[workload](device)
    inputs = make_inputs()  # one set for every timed call (decode: one position)
    if variant in ("hand_replay", "hand_replay_4th_graph"):
        if variant == "hand_replay_4th_graph":
            instantiate_throwaway_graphs(3)
        step = compare.raw_graph_step(make_step, lambda: inputs, device)
    elif variant == "ours_deploy":
        from inductor_xpugraph.deploy import load

        step = load(export_path)
        if workload in MODELS:  # the same weights in every call (static inputs)
            _, example, weights = _deployable_model(workload, device)
            loaded, inputs = step, tuple(example[weights:])

            def step(*args):
                with torch.no_grad():
                    return loaded(*example[:weights], *args)
    elif variant in ("inductor", "gpu_busy"):
        step = make_step(compare.compiler("inductor", device))
    elif variant == "ours_module_guards_skipped":
        # The user's lever over Dynamo's guards on nn.Module attributes (safe while the
        # model's attributes do not change after the first call).
        inductor_xpugraph.enable(device)
        options = {
            **compare.REDUCE_OVERHEAD_OPTIONS,
            "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
        }
        step = make_step(lambda fn: torch.compile(fn, options=options))
    else:
        inductor_xpugraph.config.allocator_checkpointing = variant != "ours_portable"
        step = make_step(compare.compiler("upstream" if variant == "upstream" else "ours", device))
    for _ in range(WARM_CALLS):
        step(*inputs)
    _synchronize(device)
    return step, inputs


def per_call_us(step, inputs, calls: int, repeats: int, device: str, synchronized: bool):
    sync = _synchronize
    samples = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        if synchronized:
            for _ in range(calls):
                step(*inputs)
                sync(device)
        else:
            for _ in range(calls):
                step(*inputs)
            sync(device)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def gpu_busy_us(step, inputs, calls: int) -> float:
    """Device time of the kernels (and copies) of one call, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step(*inputs)
        torch.cuda.synchronize()
    device_us = sum(
        event.self_device_time_total
        for event in prof.key_averages()
        if event.device_type == torch.autograd.DeviceType.CUDA
    )
    return device_us / calls


def breakdown(step, inputs, calls: int, repeats: int, device: str) -> dict[str, Any]:
    """``ours``, synchronized, peeled layer by layer (when a call is one graph)."""
    from torch._dynamo.mutation_guard import GenerationTracker

    from inductor_xpugraph.trees.per_thread import all_trees

    calls_seen = _graphed_calls_of(step, inputs)
    if len(calls_seen) != 1:
        return {"n/a": f"a call runs {len(calls_seen)} graphed callables"}
    ((graphed, call_args),) = calls_seen
    (tree,) = [tree for tree in all_trees() if tree.nodes()]
    recording = tree.current.recording

    def graphed_new_generation():
        GenerationTracker.generation += 1
        graphed(list(call_args))  # a replay consumes its argument list

    def copy_and_launch():
        recording._copy_inputs(list(call_args))
        recording.graph.replay()

    layers = {
        "call": lambda: step(*inputs),
        "GraphedCallable": graphed_new_generation,
        "Recording.replay": lambda: recording.replay(list(call_args)),
        "copy + graph.replay": copy_and_launch,
    }
    timed = {
        name: per_call_us(fn, (), calls, repeats, device, synchronized=True)
        for name, fn in layers.items()
    }
    # The lever a user has over Dynamo's guards, set once for the loop as a user would.
    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
        timed["call, guards skipped"] = per_call_us(
            lambda: step(*inputs), (), calls, repeats, device, synchronized=True
        )
    return timed


def _graphed_calls_of(step, inputs) -> list[tuple[Any, list[Any]]]:
    """The graphed callables one call of ``step`` runs, with the argument list of each."""
    from inductor_xpugraph.trees.graphed_callable import GraphedCallable

    seen = []
    original = GraphedCallable.__call__

    def spy(self, args):
        seen.append((self, list(args)))
        return original(self, args)

    GraphedCallable.__call__ = spy
    try:
        step(*inputs)
    finally:
        GraphedCallable.__call__ = original
    return seen


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def child(args) -> None:
    workload, variant, device = args.workload, args.variant, args.device
    step, inputs = build_step(workload, variant, device, args.export_path)
    row: dict[str, Any] = {"workload": workload, "variant": variant}
    if variant == "gpu_busy":
        row["busy_us"] = gpu_busy_us(step, inputs, args.calls)
    else:
        for mode, synchronized in (("pipelined", False), ("synchronized", True)):
            row[mode] = per_call_us(step, inputs, args.calls, args.repeats, device, synchronized)
    if args.breakdown and variant == "ours":
        row["breakdown"] = breakdown(step, inputs, args.calls, args.repeats, device)
    if variant.startswith("ours"):
        import inductor_xpugraph

        stats = inductor_xpugraph.stats()
        row["graphs"] = {k: stats[k] for k in ("records", "replays", "fallbacks", "skips")}
    print(json.dumps(row))


def export_child(args) -> None:
    """``ours_deploy``: trace the workload's step and export it (in its own process)."""
    import inductor_xpugraph
    from inductor_xpugraph.deploy import export

    inductor_xpugraph.disable(args.device)
    if args.workload in MODELS:
        fn, example, weights = _deployable_model(args.workload, args.device)
        with torch.no_grad():
            export(fn, example, args.export_path, static_inputs=range(weights))
    else:
        make_step, make_inputs = WORKLOADS[args.workload](args.device)
        export(make_step(lambda fn: fn), list(make_inputs()), args.export_path)
    print(json.dumps({"exported": args.export_path}))


def run_child(argv: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": tail[:300]}
    return json.loads(lines[-1])


def measure(args, workload: str, variants: list[str]) -> dict[str, list[dict]]:
    """``--runs`` rounds, each one fresh process per variant, the variants alternated so that
    a host whose speed drifts moves every variant alike (``gpu_busy``: one process)."""
    common = ["--device", args.device, "--calls", str(args.calls), "--repeats", str(args.repeats)]
    common += ["--breakdown"] if args.breakdown else []
    runs: dict[str, list[dict]] = {variant: [] for variant in variants}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "export")
        if "ours_deploy" in variants:
            if workload not in DEPLOYABLE:
                runs["ours_deploy"] = [{"error": "n/a: not exported"}]
            else:
                exported = run_child(["--export", workload, "--export-path", path, *common])
                if "error" in exported:
                    runs["ours_deploy"] = [exported]
        for round_ in range(args.runs):
            for variant in variants:
                failed_before = bool(runs[variant]) and "error" in runs[variant][0]
                if failed_before or (variant == "gpu_busy" and round_ > 0):
                    continue
                child = ["--child", workload, variant, "--export-path", path, *common]
                runs[variant].append(run_child(child))
                print(json.dumps({workload: {variant: runs[variant][-1]}}), flush=True)
    return runs


def summarize(runs: list[dict], key: str) -> tuple[float, float, float] | None:
    values = [r[key] for r in runs if key in r]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def report(results: dict[str, dict[str, list[dict]]], device: str) -> None:
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (emulator)"
    print(f"## Latency — {name}, torch {torch.__version__}; µs per call, median (min–max)")
    for mode in ("pipelined", "synchronized"):
        print(f"\n### {mode}\n")
        variants = [v for v in VARIANTS if any(v in r for r in results.values())]
        floors = ("gpu_busy", "hand_replay", "hand_replay_4th_graph", "upstream")
        ratios_header = " | ".join(f"ours / {floor}" for floor in floors)
        print("| workload | " + " | ".join(variants) + f" | {ratios_header} |")
        print("|---" * (len(variants) + 1 + len(floors)) + "|")
        for workload, by_variant in results.items():
            cells, medians = [], {}
            for variant in variants:
                runs = by_variant.get(variant, [])
                errors = [r["error"] for r in runs if "error" in r]
                stat = summarize(runs, "busy_us" if variant == "gpu_busy" else mode)
                if stat is None:
                    cells.append(f"error: {errors[0]}" if errors else "-")
                    continue
                medians[variant] = stat[0]
                cells.append(f"{stat[0]:.1f} ({stat[1]:.1f}–{stat[2]:.1f})")
            ratios = [
                f"{medians['ours'] / medians[floor]:.2f}"
                if "ours" in medians and floor in medians
                else "-"
                for floor in floors
            ]
            print(f"| {workload} | " + " | ".join(cells + ratios) + " |")
    for workload, by_variant in results.items():
        for run in by_variant.get("ours", []):
            if "breakdown" in run:
                layers = ", ".join(
                    f"{k} {v:.1f}" if isinstance(v, float) else f"{k}: {v}"
                    for k, v in run["breakdown"].items()
                )
                print(f"\n{workload}, ours synchronized, by layer (µs, first run): {layers}")
                break


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per variant")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--export", metavar="WORKLOAD", help=argparse.SUPPRESS)
    parser.add_argument("--export-path", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.workload, args.variant = args.child
        child(args)
        return
    if args.export:
        args.workload = args.export
        export_child(args)
        return
    variants = [v for v in args.variants if args.device == "cuda" or v not in CUDA_ONLY]
    results: dict[str, dict[str, list[dict]]] = {}
    for workload in args.workloads:
        results[workload] = measure(args, workload, variants)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=2)
    report(results, args.device)


if __name__ == "__main__":
    main()
