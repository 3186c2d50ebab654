"""How many graphs a process has instantiated changes how fast every graph replays.

    PYTHONPATH=. python3 benchmarks/investigations/graph_count_gaps.py \
        [--workload resnet18] [--graphs 5]

Captures the workload's default-mode Inductor code by hand in one ``torch.cuda.CUDAGraph``
(``latency.py``'s ``hand_replay``), then instantiates throwaway graphs one by one (each holds
one ``x + 1``, is replayed once and destroyed) and, before the first and after each, profiles
50 pipelined replays of that same first graph (``graph_gaps.report_gaps``: device span, busy
and idle time per call, median gap between consecutive kernels).

On one NVIDIA H200 (torch 2.11.0+cu130) the median gap is 0.10-0.13 µs while the process
has instantiated at most three graphs, and 0.42-0.45 µs from the fourth on, for every graph
of the process, including those instantiated before; kept or destroyed, empty or not, in a
pool of their own or a shared one, in "global" or "thread_local" capture mode, all the same.
ResNet-18's replay then idles about 20 µs more per call (32.5 against 13.1). The gap does
not come back down. (The count is of the graphs this script made; torch may have made one
while compiling.) Our tree and upstream's instantiate more than three graphs in any process:
this, not the code Inductor compiles under reduce-overhead, is where the trees' extra device
idle time comes from.

CUDA only.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import graph_gaps  # noqa: E402
import latency  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="resnet18", choices=latency.WORKLOADS)
    parser.add_argument("--graphs", type=int, default=5, help="throwaway graphs, one by one")
    args = parser.parse_args()
    step, inputs = latency.build_step(args.workload, "hand_replay", "cuda", None)
    for made in range(args.graphs + 1):
        if made:
            latency.instantiate_throwaway_graphs(1)
        graph_gaps.report_gaps(
            f"{args.workload} hand replay, process graphs instantiated: {made + 1}",
            lambda: step(*inputs),
        )


if __name__ == "__main__":
    main()
