"""Ours against upstream's CUDA Graph Trees in one process, their calls alternating.

The host's speed differs from one process to the next by up to a quarter on the GPU machines,
so a host-bound client compares processes more than implementations in a fresh-process
table. Here one client is built twice from one seed, one copy compiled with this package
enabled and one with stock reduce-overhead, each through an entry function of its own (Dynamo
caches compiled code per code object, so the copies never share it), and their synchronized
calls alternate. Clients: ``real_clients.py``'s whose calls can be paired, and
``workloads.py``'s small models (``*_small``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import real_clients  # noqa: E402
import workloads  # noqa: E402

BLOCK = 20  # calls per block for the spread of the ratio
WARMUP_CALLS = 10  # compile, warm up, record, and settle


def call_ours(fn, *args):
    return fn(*args)


def call_upstream(fn, *args):
    return fn(*args)


class Side(measure.Variant):
    """One side of the pair: everything it compiles goes through its own entry function."""

    def compile(self, fn: Callable, **options) -> Callable:
        entry = torch.compile(call_ours if self.ours else call_upstream, mode="reduce-overhead")
        return lambda *args: entry(fn, *args)


def small(name: str) -> real_clients.Client:
    def build(variant: measure.Variant, batch: int) -> Callable[[], str]:
        model, (x,) = workloads.model_and_inputs(name, variant.device)
        return real_clients.inference(variant, workloads.first_output(model), x)

    return real_clients.Client(build, batch=1, calls=0)


PAIRABLE = ("adamw", "train_two_shapes", "resnet18_b8", "resnet18_b64", "bert_b1", "bert_b16")
CLIENTS = {
    **{name: real_clients.CLIENTS[name] for name in PAIRABLE},
    **{f"{name}_small": small(name) for name in workloads.MODELS},
}


def run_client(name: str, calls: int, ours: str) -> dict:
    import inductor_xpugraph

    client = CLIENTS[name]
    sides: dict[str, tuple[Side, Callable[[], str]]] = {}
    warm_results: dict[str, str] = {}  # after the same number of calls on each side
    for side_name in (ours, "upstream"):
        # Code is generated at the first call: each copy compiles (and warms up) while its
        # implementation is the one registered for cuda.
        side = Side(side_name, "cuda").select()
        call = client.build(side, client.batch)
        for _ in range(WARMUP_CALLS):
            warm_results[side_name] = call()
        sides[side_name] = side, call
    inductor_xpugraph.disable("cuda")
    times: dict[str, list[float]] = {side_name: [] for side_name in sides}
    for _ in range(calls):
        for side_name, (_, call) in sides.items():
            start = time.perf_counter()
            call()
            times[side_name].append(time.perf_counter() - start)
    mine, theirs = times[ours], times["upstream"]
    blocks = [
        statistics.median(theirs[i : i + BLOCK]) / statistics.median(mine[i : i + BLOCK])
        for i in range(0, calls - BLOCK + 1, BLOCK)
    ]
    return {
        "client": name, "calls": calls,
        "ours_ms": statistics.median(mine) * 1e3, "upstream_ms": statistics.median(theirs) * 1e3,
        "speedup": statistics.median(theirs) / statistics.median(mine),
        "block_speedup_min": min(blocks), "block_speedup_max": max(blocks),
        # After the warmup calls: a long training run may drift apart in the last digits,
        # as kernels that accumulate with atomics need not add in one order.
        "results_equal": warm_results[ours] == warm_results["upstream"],
        "graphs": {side_name: side.counters() for side_name, (side, _) in sides.items()},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="*", default=list(CLIENTS), choices=list(CLIENTS))
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--strategy", choices=("checkpointing", "owned"), default="checkpointing")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import inductor_xpugraph

    ours = "ours" if args.strategy == "checkpointing" else "ours_portable"
    print(measure.header(f"Paired, ours with {args.strategy}", "cuda"))
    print("| client | ours ms | upstream ms | speedup | per-block range | results equal | graphs |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for name in args.clients:
        row = run_client(name, args.calls, ours)
        rows.append(row)
        print(
            f"| {name} | {row['ours_ms']:.3f} | {row['upstream_ms']:.3f} | {row['speedup']:.3f}x "
            f"| {row['block_speedup_min']:.2f}-{row['block_speedup_max']:.2f}x "
            f"| {row['results_equal']} | {row['graphs']} |",
            flush=True,
        )
        measure.write_json(args.out, {"strategy": args.strategy, "rows": rows})
        inductor_xpugraph.reset()
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
