"""Device time per pipelined call, split into kernels and the idle gaps between them.

    PYTHONPATH=. python3 benchmarks/investigations/graph_gaps.py \
        --workload resnet18 --variant ours \
        [--capture-error-mode thread_local] [--hand-capture-ours-code]

``graph_kernels.py`` showed the same kernels, with the same device time, in the hand-captured
replay, upstream's trees and ours; yet pipelined, the trees' calls take longer. This profiles
50 pipelined calls of one variant (built as ``latency.py`` builds it, in this process), drops
the first fifth, and prints per call: the span from the first kernel to the last, the busy
time, the idle time, the median gap between consecutive kernels, and the largest gaps with
the kernels around them.

- ``--capture-error-mode`` changes the hand capture's ``torch.cuda.graph`` mode (the trees
  capture in ``"thread_local"``).
- ``--hand-capture-ours-code`` (with ``--variant ours``): then also captures, by hand in one
  ``torch.cuda.CUDAGraph`` outside the tree, the code our tree captured (the graphed
  callable's un-graphed function, with the arguments of its last warmup), and profiles its
  replay in the same process.

What it shows is explained by ``graph_count_gaps.py``: from a process's fourth graph
instantiation on, every graph idles about 0.35 µs more between kernels. The trees' graphs
run the same kernel nodes as the hand replay; compare them with ``latency.py``'s
``hand_replay_4th_graph``, not with a process that has a single graph.

CUDA only.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import latency  # noqa: E402

CALLS = 50


def report_gaps(label: str, step: Callable[[], Any]) -> None:
    for _ in range(30):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            step()
        torch.cuda.synchronize()
    kernels = sorted(
        (event.time_range.start, event.time_range.end, event.name)
        for event in prof.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    )
    kept = kernels[len(kernels) // 5 :]
    calls = CALLS * 4 / 5
    span = kept[-1][1] - kept[0][0]
    busy = sum(end - start for start, end, _ in kept)
    gaps = [
        (kept[i + 1][0] - kept[i][1], kept[i][2][:60], kept[i + 1][2][:60])
        for i in range(len(kept) - 1)
    ]
    print(
        f"{label}: span {span / calls:.1f} µs per call, busy {busy / calls:.1f}, idle "
        f"{(span - busy) / calls:.1f}, kernels {len(kept) / calls:.1f}; median gap "
        f"{statistics.median(g for g, _, _ in gaps):.2f} µs"
    )
    for gap, before, after in sorted(gaps, reverse=True)[:5]:
        print(f"  gap {gap:.1f} µs after {before} before {after}")


def hand_capture(fn: Callable[[list[Any]], Any], args: list[Any]) -> Callable[[], Any]:
    """``fn(args)`` captured in one graph by hand; a call copies nothing (the arguments are
    those of the last warmup, left in place) and replays."""
    with torch.no_grad():  # as the workloads call it (an inference graph)
        for _ in range(3):
            fn(list(args))
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(list(args))
    return graph.replay


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="resnet18", choices=latency.WORKLOADS)
    parser.add_argument("--variant", default="ours", choices=latency.VARIANTS)
    parser.add_argument("--capture-error-mode", default=None)
    parser.add_argument("--hand-capture-ours-code", action="store_true")
    args = parser.parse_args()
    if args.capture_error_mode:
        torch.cuda.graph = functools.partial(
            torch.cuda.graph, capture_error_mode=args.capture_error_mode
        )
    warmed: list[tuple[Callable, list[Any]]] = []
    if args.hand_capture_ours_code:
        from inductor_xpugraph.trees.backends.device_graphs import DeviceGraphBackend

        warmup = DeviceGraphBackend.warmup

        def noting_warmup(self, fn, fn_args):
            warmed.append((fn, list(fn_args)))  # before ``fn`` clears the list
            return warmup(self, fn, fn_args)

        DeviceGraphBackend.warmup = noting_warmup
    step, inputs = latency.build_step(args.workload, args.variant, "cuda", None)
    report_gaps(f"{args.workload} {args.variant}", lambda: step(*inputs))
    if warmed:
        fn, fn_args = warmed[-1]
        report_gaps(f"{args.workload} ours' code, captured by hand", hand_capture(fn, fn_args))


if __name__ == "__main__":
    main()
