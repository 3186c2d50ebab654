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
``GraphedCallable`` (the tree), ``Recording.replay``, the input copy plus ``graph.replay()``,
and the whole call with Dynamo's guards skipped.
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
    "ours_portable", "ours_deploy", "upstream_deploy", "ours_module_guards_skipped",
)  # fmt: skip
CUDA_ONLY = ("gpu_busy", "hand_replay", "hand_replay_4th_graph", "upstream", "upstream_deploy")
HAND_CAPTURED = ("hand_replay", "hand_replay_4th_graph")
DEPLOYED = ("ours_deploy", "upstream_deploy")
DEPLOYABLE = ("add_one", *workloads.MODELS)  # every tensor an input: no closed-over weights
WARM_CALLS = 20  # past warmup and record before anything is timed
FLOORS = ("gpu_busy", "hand_replay", "hand_replay_4th_graph", "upstream")
# The implementation registered in a variant's process (the others: Inductor, no graphs).
IMPLEMENTATION = {
    "upstream": "upstream", "ours": "ours", "ours_portable": "ours_portable",
    "ours_module_guards_skipped": "ours",
}  # fmt: skip


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

            options = {"config_patches": {"triton.cudagraphs": True}}
            artifact = standalone_compile(make_fx(fn)(*example), example, options=options)
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


def instantiate_throwaway_graphs(count: int) -> None:
    """Capture, replay once and destroy ``count`` graphs of one ``x + 1`` each."""
    x = torch.zeros(16, device="cuda")
    for _ in range(count):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x + 1
        graph.replay()
        torch.cuda.synchronize()
        del graph


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
        if variant_name == "hand_replay_4th_graph":
            instantiate_throwaway_graphs(3)
        step = hand_replay(make_step, inputs)
    elif variant_name == "ours_module_guards_skipped":
        # mode="reduce-overhead" spelled as its options, which may carry the filter
        options = {"triton.cudagraphs": True, "triton.cudagraph_trees": True}
        options["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
        step = make_step(lambda fn: torch.compile(fn, options=options))
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
        call = lambda: step(*inputs)  # noqa: E731
        for mode, synchronized in (("pipelined", False), ("synchronized", True)):
            row[mode] = measure.per_call_us(
                call, args.calls, args.repeats, args.device, synchronized
            )
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
                [script, "--export", workload, variant, path, *common]
            )
            runs[variant] = [exported] if "error" in exported else []
        for round_ in range(args.runs):
            for variant in variants:
                failed = any("error" in r for r in runs[variant])
                if failed or (variant == "gpu_busy" and round_ > 0):
                    continue
                path = os.path.join(exports, variant)
                argv = [script, "--child", workload, variant, "--export-path", path, *common]
                runs[variant].append(measure.in_fresh_process(argv))
                print(json.dumps({workload: {variant: runs[variant][-1]}}), flush=True)
    return runs


def spread(runs: list[dict], key: str) -> tuple[float, float, float] | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return (statistics.median(values), min(values), max(values)) if values else None


def report(results: dict[str, dict[str, list[dict]]], device: str) -> None:
    print(measure.header("Latency, µs per call, median of the processes (min–max)", device))
    variants = [v for v in VARIANTS if any(v in r for r in results.values())]
    for mode in ("pipelined", "synchronized"):
        print(f"\n### {mode}\n")
        ratios = [f"ours / {floor}" for floor in FLOORS]
        print("| workload | " + " | ".join(variants + ratios) + " |")
        print("|---" * (len(variants) + len(ratios) + 1) + "|")
        for workload, by_variant in results.items():
            cells, medians = [], {}
            for variant in variants:
                runs = by_variant.get(variant, [])
                stat = spread(runs, "busy_us" if variant == "gpu_busy" else mode)
                errors = [r["error"] for r in runs if "error" in r]
                if stat is None:
                    cells.append(f"error: {errors[0]}" if errors else "-")
                    continue
                medians[variant] = stat[0]
                cells.append(f"{stat[0]:.1f} ({stat[1]:.1f}–{stat[2]:.1f})")
            cells += [
                f"{medians['ours'] / medians[f]:.2f}" if "ours" in medians and f in medians else "-"
                for f in FLOORS
            ]
            print(f"| {workload} | " + " | ".join(cells) + " |")
    print("\n### first two calls (ms, median) and peak MiB allocated / reserved (median)\n")
    print("| workload | " + " | ".join(variants) + " |")
    print("|---" * (len(variants) + 1) + "|")
    for workload, by_variant in results.items():
        cells = []
        for variant in variants:
            runs = [r for r in by_variant.get(variant, []) if "first_ms" in r]
            if not runs:
                cells.append("-")
                continue
            values = [
                spread(runs, key)
                for key in ("first_ms", "second_ms", "peak_mib", "peak_reserved_mib")
            ]
            first, second, peak, reserved = (f"{v[0]:.0f}" if v else "-" for v in values)
            cells.append(f"{first} + {second} ms, {peak} / {reserved} MiB")
        print(f"| {workload} | " + " | ".join(cells) + " |")
    for workload, by_variant in results.items():
        for run in by_variant.get("ours", []):
            if "breakdown" in run:
                layers = ", ".join(
                    f"{k} {v:.1f}" if isinstance(v, float) else f"{k}: {v}"
                    for k, v in run["breakdown"].items()
                )
                print(f"\n{workload}, ours synchronized, by layer (µs, first process): {layers}")
                break


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workloads", nargs="*", default=list(workloads.WORKLOADS), choices=workloads.WORKLOADS
    )
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--device", default=measure.default_device())
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per variant")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--export", nargs=3, metavar=("WORKLOAD", "VARIANT", "PATH"), help=argparse.SUPPRESS
    )
    parser.add_argument("--export-path", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child or args.export:
        args.workload, args.variant = (args.child or args.export)[:2]
        if args.export:
            args.export_path = args.export[2]
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
