"""Latency of one call against its floors, pipelined and synchronized (README.md lists the
variants and options).

Each (workload, variant) runs in ``--runs`` fresh processes, the variants taking turns so that
a host whose speed drifts moves them all alike. A process builds its variant, times its first
two calls (synchronized), makes 20 more calls (past warmup and record), then times both modes
(``measure.per_call_us``) and reports its peak memory. The floors: ``gpu_busy`` (the device
time of a call's kernels), ``hand_replay`` (Inductor's code captured by hand in one CUDA
graph: an input copy and a replay, no Dynamo, no tree) and ``hand_replay_4th_graph`` (the
same after three throwaway graphs: from a process's fourth graph on, kernels idle longer
between each other, docs/latency.md). Deployed variants export in one process and load in the
measured one. ``--breakdown`` peels ours' call layer by layer: the whole call,
``GraphedCallable`` (the tree), ``Recording.replay``, its ``launch`` (the input copy and
``graph.replay()``), and the whole call with Dynamo's guards skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import workloads  # noqa: E402

VARIANTS = (
    "gpu_busy", "hand_replay", "hand_replay_4th_graph", "inductor", "upstream", "ours",
    "ours_portable", "ours_deploy", "upstream_deploy",
)  # fmt: skip
CUDA_ONLY = ("gpu_busy", "hand_replay", "hand_replay_4th_graph", "upstream", "upstream_deploy")
HAND_CAPTURED = ("hand_replay", "hand_replay_4th_graph")
DEPLOYED = ("ours_deploy", "upstream_deploy")
DEPLOYABLE = ("add_one", *workloads.MODELS)  # every tensor an input: no closed-over weights
WARM_CALLS = 20  # past warmup and record before anything is timed
FLOORS = ("gpu_busy", "hand_replay", "hand_replay_4th_graph", "upstream")
# The implementation registered in a variant's process (the others: Inductor, no graphs).
IMPLEMENTATION = {"upstream": "upstream", "ours": "ours", "ours_portable": "ours_portable"}


def deployable(workload: str, device: str) -> tuple[Any, list, int]:
    """The workload as a function of (weights, then inputs), its example arguments in that
    order, and how many of them are weights."""
    if workload == "add_one":
        return (lambda x: x + 1), [torch.randn(16, device=device)], 0
    model, inputs = workloads.model_and_inputs(workload, device)
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}

    def fn(*args):
        out = torch.func.functional_call(model, dict(zip(state, args)), args[len(state) :])
        return out if isinstance(out, torch.Tensor) else out[0]

    return fn, [*state.values(), *inputs], len(state)


def export_child(args) -> None:
    """Export the workload for ``args.variant`` to ``args.export_path`` (its own process)."""
    import inductor_xpugraph

    inductor_xpugraph.disable(args.device)
    fn, example, weights = deployable(args.workload, args.device)
    with torch.no_grad():
        if args.variant == "ours_deploy":
            from inductor_xpugraph.deploy import export

            export(fn, example, args.export_path, static_inputs=range(weights))
        else:
            from torch._inductor import standalone_compile
            from torch.fx.experimental.proxy_tensor import make_fx

            traced, options = make_fx(fn)(*example), {"config_patches": {"triton.cudagraphs": True}}
            if any(node.op == "get_attr" for node in traced.graph.nodes):  # its loader fails
                raise SystemExit("standalone_compile cannot load a graph with traced constants")
            artifact = standalone_compile(traced, example, options=options)
            artifact.save(path=args.export_path, format="unpacked")
    print(json.dumps({"exported": args.export_path}))


def load_exported(variant: str, path: str, workload: str, device: str):
    if variant == "ours_deploy":
        from inductor_xpugraph.deploy import load

        loaded = load(path)
    else:
        from torch._inductor import CompiledArtifact

        loaded = CompiledArtifact.load(path=path, format="unpacked")
    _, example, weights = deployable(workload, device)

    def step(*inputs):  # the same weights in every call
        with torch.no_grad():
            return loaded(*example[:weights], *inputs)

    return step, tuple(example[weights:])


def hand_replay(make_step, inputs: tuple) -> Any:
    """Inductor's default-mode code captured by hand in one graph; a call copies its inputs
    into the captured ones and replays."""
    step = make_step(torch.compile)
    static = [t.clone() for t in inputs]
    for _ in range(3):
        step(*static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(*static)

    def replay(*args):
        for dst, src in zip(static, args):
            dst.copy_(src)
        graph.replay()
        return out

    return replay


def build_step(args) -> tuple[Any, tuple, measure.Variant, list[float]]:
    """The variant's callable and inputs, past warmup and record; and its first two calls'
    seconds (synchronized)."""
    variant_name, device = args.variant, args.device
    variant = measure.Variant(IMPLEMENTATION.get(variant_name, "inductor"), device).select()
    make_step, make_inputs = workloads.WORKLOADS[args.workload](device)
    inputs = make_inputs()  # one set for every timed call (decode: one position)
    if variant_name in DEPLOYED:
        step, inputs = load_exported(variant_name, args.export_path, args.workload, device)
    elif variant_name in HAND_CAPTURED:
        for _ in range(3 if variant_name == "hand_replay_4th_graph" else 0):
            graph = torch.cuda.CUDAGraph()  # throwaway: this process's next graph is its 4th
            with torch.cuda.graph(graph):
                inputs[0] + 1
            graph.replay()
            del graph
        step = hand_replay(make_step, inputs)
    else:
        step = make_step(variant.compile)
    first_two = []
    for _ in range(2):
        start = time.perf_counter()
        step(*inputs)
        measure.synchronize(device)
        first_two.append(time.perf_counter() - start)
    for _ in range(WARM_CALLS):
        step(*inputs)
    measure.synchronize(device)
    return step, inputs, variant, first_two


def gpu_busy_us(step, inputs, calls: int) -> float:
    """Device time of the kernels (and copies) of one call, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step(*inputs)
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    busy = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == cuda)
    return busy / calls


def breakdown(step, inputs, calls: int, repeats: int, device: str) -> dict[str, Any]:
    """Ours, synchronized, peeled layer by layer (when a call is one graph)."""
    from torch._dynamo.mutation_guard import GenerationTracker

    from inductor_xpugraph.trees.graphed_callable import GraphedCallable
    from inductor_xpugraph.trees.per_thread import all_trees

    seen = []
    original = GraphedCallable.__call__
    GraphedCallable.__call__ = lambda self, a: seen.append((self, list(a))) or original(self, a)
    try:
        step(*inputs)
    finally:
        GraphedCallable.__call__ = original
    if len(seen) != 1:
        return {"n/a": f"a call runs {len(seen)} graphed callables"}
    ((graphed, call_args),) = seen
    (tree,) = [tree for tree in all_trees() if tree.nodes()]
    recording = tree.current.recording

    def graphed_new_generation():
        GenerationTracker.generation += 1
        graphed(list(call_args))  # a replay consumes its argument list

    layers = {
        "call": lambda: step(*inputs),
        "GraphedCallable": graphed_new_generation,
        "Recording.replay": lambda: recording.replay(list(call_args)),
        "Recording.launch": lambda: recording.launch(list(call_args)),
    }
    timed = {
        name: measure.per_call_us(fn, calls, repeats, device, True) for name, fn in layers.items()
    }
    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):  # set once, as a user would
        timed["call, guards skipped"] = measure.per_call_us(
            layers["call"], calls, repeats, device, True
        )
    return timed


def child(args) -> None:
    memory = measure.DeviceMemory(args.device).start()
    step, inputs, variant, first_two = build_step(args)
    row: dict[str, Any] = {"first_ms": first_two[0] * 1e3, "second_ms": first_two[1] * 1e3}
    if args.variant == "gpu_busy":
        row["busy_us"] = gpu_busy_us(step, inputs, args.calls)
    else:
        for mode, synchronized in (("pipelined", False), ("synchronized", True)):
            timing = (args.calls, args.repeats, args.device, synchronized)
            row[mode] = measure.per_call_us(lambda: step(*inputs), *timing)
    if args.breakdown and args.variant == "ours":
        row["breakdown"] = breakdown(step, inputs, args.calls, args.repeats, args.device)
    row.update(memory.mib())
    loaded_ours = args.variant == "ours_deploy"
    row["graphs"] = (measure.Variant("ours", args.device) if loaded_ours else variant).counters()
    print(json.dumps(row))


def run_workload(args, workload: str) -> dict[str, list[dict]]:
    """``--runs`` rounds of one fresh process per variant (``gpu_busy``: one process)."""
    script = os.path.abspath(__file__)
    common = ["--device", args.device, "--calls", str(args.calls), "--repeats", str(args.repeats)]
    common += ["--breakdown"] if args.breakdown else []
    variants = [v for v in args.variants if v not in DEPLOYED or workload in DEPLOYABLE]
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as exports:
        for variant in [v for v in variants if v in DEPLOYED]:
            path = os.path.join(exports, variant)
            exported = measure.in_fresh_process(
                [script, "--child", workload, variant, path, "--export", *common]
            )
            runs[variant] = [exported] if "error" in exported else []
        for round_ in range(args.runs):
            for variant in variants:
                failed = any("error" in r for r in runs[variant])
                if failed or (variant == "gpu_busy" and round_ > 0):
                    continue
                path = os.path.join(exports, variant)
                argv = [script, "--child", workload, variant, path, *common]
                runs[variant].append(measure.in_fresh_process(argv))
                print(json.dumps({workload: {variant: runs[variant][-1]}}), flush=True)
    return runs


def values(runs: list[dict], key: str) -> list[float]:
    return [r[key] for r in runs if r.get(key) is not None]


def report(results: dict[str, dict[str, list[dict]]], device: str) -> None:
    print(measure.header("Latency, µs per call, median of the processes (min–max)", device))
    variants = [v for v in VARIANTS if any(v in r for r in results.values())]
    tables = {"pipelined": FLOORS, "synchronized": FLOORS, "first calls and peak memory": ()}
    for mode, floors in tables.items():
        print(f"\n### {mode}\n")
        header = ["workload", *variants, *(f"ours / {floor}" for floor in floors)]
        print("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
        for workload, by_variant in results.items():
            cells, medians = [], {}
            for variant in variants:
                runs = by_variant.get(variant, [])
                times = values(runs, "busy_us" if variant == "gpu_busy" else mode)
                errors = [r["error"] for r in runs if "error" in r]
                if not runs or errors:
                    cells.append(f"error: {errors[0]}" if errors else "-")
                elif not floors:  # first two calls (ms) and peak allocated / reserved (MiB)
                    keys = ("first_ms", "second_ms", "peak_mib", "peak_reserved_mib")
                    first, second, peak, reserved = (
                        f"{statistics.median(v):.0f}" if (v := values(runs, k)) else "-"
                        for k in keys
                    )
                    cells.append(f"{first} + {second} ms, {peak} / {reserved} MiB")
                else:
                    medians[variant] = statistics.median(times)
                    cells.append(measure.median_range(times))
            cells += [
                f"{medians['ours'] / medians[f]:.2f}" if "ours" in medians and f in medians else "-"
                for f in floors
            ]
            print(f"| {workload} | " + " | ".join(cells) + " |")
    for workload, by_variant in results.items():
        layers = next((r["breakdown"] for r in by_variant.get("ours", []) if "breakdown" in r), {})
        if layers:
            timed = ", ".join(
                f"{k} {v:.1f}" if isinstance(v, float) else f"{k}: {v}" for k, v in layers.items()
            )
            print(f"\n{workload}, ours synchronized, by layer (µs, first process): {timed}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add, names = parser.add_argument, list(workloads.WORKLOADS)
    add("--workloads", nargs="*", default=names, choices=names)
    add("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    add("--device", default=measure.default_device())
    add("--calls", type=int, default=200)
    add("--repeats", type=int, default=11)
    add("--runs", type=int, default=3, help="fresh processes per variant")
    add("--breakdown", action="store_true")
    add("--out", default=None)
    add("--child", nargs=3, metavar=("WORKLOAD", "VARIANT", "EXPORT"), help=argparse.SUPPRESS)
    add("--export", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.workload, args.variant, args.export_path = args.child
        (export_child if args.export else child)(args)
        return
    args.variants = [v for v in args.variants if args.device == "cuda" or v not in CUDA_ONLY]
    results: dict[str, dict[str, list[dict]]] = {}
    for workload in args.workloads:
        results[workload] = run_workload(args, workload)
        measure.write_json(args.out, results)
    report(results, args.device)


if __name__ == "__main__":
    main()
