"""Per-call host time of tiny and launch-bound graphs: eager, Inductor, upstream trees, ours.

Run on the GPU machine from the repository root:

    PYTHONPATH=. python3 benchmarks/overhead.py [--device cuda] [--out results.json]

Each variant is compiled fresh (``torch._dynamo.reset()``), called until it is replaying,
then timed as the median over repeats of N back-to-back calls followed by one synchronize,
divided by N (host-timed: what a user's loop sees). "raw graph" is the floor: the same
compiled Inductor code captured by hand in one torch.cuda.CUDAGraph, replayed after a
``copy_`` of the input.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import inductor_xpugraph


def add_one(x):
    return x + 1


def softmax_chain(x, weights):
    for w in weights:
        x = torch.softmax(x @ w, dim=-1)
    return x


def workloads(device):
    torch.manual_seed(0)
    weights = [torch.randn(64, 64, device=device) * 0.1 for _ in range(32)]
    return {
        "x + 1 (16 floats)": (add_one, lambda: (torch.randn(16, device=device),)),
        "32 x (matmul 64^2 + softmax), batch 4": (
            lambda x: softmax_chain(x, weights),
            lambda: (torch.randn(4, 64, device=device),),
        ),
    }


def per_call_us(fn, inputs, sync, calls=200, repeats=15):
    for _ in range(20):
        fn(*inputs)
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*inputs)
        sync()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def compiled(fn, mode, ours):
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    if ours:
        inductor_xpugraph.enable(DEVICE)
    else:
        inductor_xpugraph.disable(DEVICE)
    return torch.compile(fn, mode=mode)


def raw_graph(fn, inputs):
    """The floor: Inductor's compiled code, captured by hand in one graph."""
    torch._dynamo.reset()
    inductor_xpugraph.disable(DEVICE)
    compiled_fn = torch.compile(fn)
    static = [t.clone() for t in inputs]
    for _ in range(3):
        compiled_fn(*static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled_fn(*static)

    def replay(*args):
        static[0].copy_(args[0])
        graph.replay()
        return out

    return replay


def main():
    global DEVICE
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    DEVICE = args.device
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    rows = []
    for name, (fn, make_inputs) in workloads(DEVICE).items():
        inputs = make_inputs()
        row = {"workload": name}
        row["eager"] = per_call_us(fn, inputs, sync)
        row["inductor"] = per_call_us(compiled(fn, None, ours=False), inputs, sync)
        row["upstream reduce-overhead"] = per_call_us(
            compiled(fn, "reduce-overhead", ours=False), inputs, sync
        )
        row["ours"] = per_call_us(compiled(fn, "reduce-overhead", ours=True), inputs, sync)
        row["ours stats"] = inductor_xpugraph.stats()
        if DEVICE == "cuda":
            row["raw graph"] = per_call_us(raw_graph(fn, inputs), inputs, sync)
        rows.append(row)
    columns = ["eager", "inductor", "upstream reduce-overhead", "ours", "raw graph"]
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    print(f"device: {name}, torch {torch.__version__}")
    print("| workload | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for row in rows:
        cells = [f"{row[c]:.1f} µs" if c in row else "-" for c in columns]
        print(f"| {row['workload']} | " + " | ".join(cells) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
