"""Where do the first calls of a real client go? cProfile over the first calls (compile,
warmup, record) of one ``real_clients.py`` client and variant, in this process.

    PYTHONPATH=. python3 benchmarks/investigations/first_calls_profile.py \
        adamw_compiled_step ours [--calls 3]

Prints each call's time and the functions with the most cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import real_clients  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("client", choices=list(real_clients.CLIENTS))
    parser.add_argument("variant", choices=real_clients.VARIANTS)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    variant = real_clients.Variant(args.variant, args.device)
    variant.select()
    fn, batch, _ = real_clients.CLIENTS[args.client]
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    times, result, _ = fn(variant, batch, args.calls)
    profiler.disable()
    print(
        f"{args.client} {args.variant}: calls {[round(t, 2) for t in times]} s, "
        f"{result}, {time.perf_counter() - start:.1f} s in all"
    )
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(45)


if __name__ == "__main__":
    main()
