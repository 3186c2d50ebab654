"""Where does the host time of a synchronized training step go? cProfile over the steady
state of one ``paired.py`` client, for ours or upstream's trees (one side per process).

    PYTHONPATH=. python3 benchmarks/investigations/host_profile.py ours|upstream \
        [--client adamw] [--calls 200]

Prints the functions with the most own time, and the total per step of this package's
(``inductor_xpugraph``) or upstream's (``torch/_inductor/cudagraph_trees.py``) functions.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from paired import CLIENTS, WARMUP_CALLS, _compiled_for  # noqa: E402

import inductor_xpugraph  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("side", choices=("ours", "upstream"))
    parser.add_argument("--client", default="adamw", choices=list(CLIENTS))
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    (inductor_xpugraph.enable if args.side == "ours" else inductor_xpugraph.disable)("cuda")
    step = CLIENTS[args.client](_compiled_for(args.side))
    for _ in range(WARMUP_CALLS):
        step()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.calls):
        step()
    profiler.disable()
    stats = pstats.Stats(profiler)
    tree_files = (
        ("inductor_xpugraph",) if args.side == "ours" else ("cudagraph_trees", "cudagraph_utils")
    )
    tree_time = sum(
        tt
        for (file, _, _), (_, _, tt, _, _) in stats.stats.items()
        if any(f in file for f in tree_files)
    )
    total = sum(tt for (_, _, _), (_, _, tt, _, _) in stats.stats.items())
    print(
        f"{args.side} {args.client}: host {total / args.calls * 1e6:.0f} us/step under the "
        f"profiler, of which the tree's own functions {tree_time / args.calls * 1e6:.0f} us"
    )
    stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
