"""Where the host time of one replayed call goes: ``x + 1`` on 16 floats, layer by layer.

    PYTHONPATH=. python3 benchmarks/replay_path.py [--device cuda] [--calls 2000] [--repeats 21]

Each row times N back-to-back calls + one synchronize (median over repeats, µs per call),
peeling one layer off the row above it:

- ``torch.compile``: the compiled function with our trees (Dynamo's guards, AOTAutograd's
  wrapper, the tree), every call a new generation, as in ``compare.py``;
- ``GraphedCallable``: our callable called directly with the input list, every call a new
  generation (what the tree costs: generation, node lookup, checks, hand-out);
- ``Recording.replay``: the node's replay alone (input copy, graph launch, output tensors);
- ``copy + graph.replay``: the input copy and the graph launch, nothing else (the floor);
- ``inductor (no graphs)``: the same function compiled without graphs, for scale.

On ``--device cpu`` the graphs are the CPU emulator's, whose replay re-runs the kernel on the
host: only the differences between the upper rows mean anything there.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from torch._dynamo.mutation_guard import GenerationTracker

import inductor_xpugraph
from inductor_xpugraph.trees.graphed_callable import GraphedCallable
from inductor_xpugraph.trees.per_thread import all_trees


def per_call_us(fn, calls: int, repeats: int, synchronize) -> float:
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    device = args.device
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    x = torch.randn(16, device=device)

    inductor_xpugraph.enable(device)
    ours = torch.compile(lambda x: x + 1, mode="reduce-overhead")
    for _ in range(3):  # warmup, record, replay
        ours(x)
    (graphed,) = [obj for obj in gc.get_objects() if type(obj) is GraphedCallable]
    (tree,) = all_trees()
    (node,) = tree.nodes()
    recording = node.recording
    # No torch._dynamo.reset() here: it would free ``ours``'s compiled graph, and with it
    # the recording (a different function compiles apart anyway).
    inductor_xpugraph.disable(device)
    plain = torch.compile(lambda x: x + 1)
    plain(x)

    def graphed_new_generation():
        GenerationTracker.generation += 1
        graphed([x])

    (buffer,) = recording.input_buffers
    rows = {
        "torch.compile (ours)": lambda: ours(x),
        "GraphedCallable": graphed_new_generation,
        "Recording.replay": lambda: recording.replay([x]),
        "copy + graph.replay": lambda: (buffer.copy_(x), recording.graph.replay()),
        "inductor (no graphs)": lambda: plain(x),
    }
    print(f"x + 1 on 16 floats, {device}, torch {torch.__version__}; µs per call (median)")
    times = {
        name: per_call_us(fn, args.calls, args.repeats, synchronize) for name, fn in rows.items()
    }
    for name, us in times.items():
        print(f"  {name:24s} {us:7.2f}")
    print(
        f"  tree (GraphedCallable − Recording.replay): "
        f"{times['GraphedCallable'] - times['Recording.replay']:.2f} µs; "
        f"replay bookkeeping (Recording.replay − copy + graph.replay): "
        f"{times['Recording.replay'] - times['copy + graph.replay']:.2f} µs; "
        f"Dynamo + AOT wrapper (torch.compile − GraphedCallable): "
        f"{times['torch.compile (ours)'] - times['GraphedCallable']:.2f} µs"
    )
    print(f"  stats: {inductor_xpugraph.stats()}")


if __name__ == "__main__":
    main()
