"""Soak: does a long-running process stay flat? Each variant in a fresh process, three phases:
``replays`` of a small graph, ``training`` steps of an MLP with AdamW, and ``churn``, rounds
of a process that swaps models (each builds and compiles a new MLP, trains and infers 5 times,
then deletes it and calls ``torch._dynamo.reset()`` and ``gc.collect()``, and no tree reset).

The caller keeps only its latest result, as loops do. Samples (after a synchronize and
``gc.collect()``: resident host memory, Python objects, device memory allocated and reserved,
our pool) are taken every tenth of a phase, the first after 3 calls (warmup and record; for
churn, 3 rounds). Reported: the growth per 10,000 calls (per round for churn) from the first
sample to the last, and over the second half alone, once the allocators' arenas have settled:
a leak grows there too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import workloads  # noqa: E402

VARIANTS = ("upstream", "ours", "ours_portable")
PHASES = ("replays", "training", "churn")
SAMPLES = 10


def sample(device: str) -> dict[str, float]:
    import inductor_xpugraph

    measure.synchronize(device)
    gc.collect()
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    module = None if device == "cpu" else torch.get_device_module(device)
    return {
        "rss_mib": rss / 2**20,
        "objects": len(gc.get_objects()),
        "device_mib": module.memory_allocated() / 2**20 if module else 0.0,
        "reserved_mib": module.memory_reserved() / 2**20 if module else 0.0,
        "pool_mib": inductor_xpugraph.stats()["pool_bytes"] / 2**20,
    }


def soak(call, calls: int, device: str, per: int = 10_000) -> dict:
    """``call`` ``calls`` times after 3 calls (warmup and record; churn: the rounds that fill
    the caches), sampled SAMPLES+1 times; the growth per ``per`` calls."""
    for _ in range(3):
        call()
    samples = [sample(device)]
    start = time.perf_counter()
    for _ in range(SAMPLES):
        for _ in range(calls // SAMPLES):
            call()
        samples.append(sample(device))
    done = calls // SAMPLES * SAMPLES
    first, middle, last = samples[0], samples[SAMPLES // 2], samples[-1]  # SAMPLES is even
    return {
        "calls": done, "seconds": time.perf_counter() - start, "last": last,
        "growth": {k: (last[k] - first[k]) * per / done for k in last},
        "late_growth": {k: (last[k] - middle[k]) * per / (done / 2) for k in last},
    }  # fmt: skip


def swap_model(variant: measure.Variant) -> None:
    """One round of churn: a new model compiled, trained, run, deleted; Dynamo reset."""
    model = workloads.mlp(variant.device)
    compiled = variant.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device=variant.device)
    for _ in range(5):
        compiled(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        for _ in range(5):
            out = compiled(x)
    assert torch.isfinite(out).all()
    del model, compiled, optimizer, x, out
    torch._dynamo.reset()
    gc.collect()


def run_variant(args) -> dict:
    variant = measure.Variant(args.child, args.device).select()
    torch.manual_seed(0)
    small = variant.compile(lambda x: (x * 2 + 1).relu())
    x = torch.randn(1024, device=args.device)
    model = workloads.mlp(args.device, width=256, layers=2)
    compiled = variant.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randn(32, 256, device=args.device)
    out = None

    def replay():
        nonlocal out
        out = small(x)

    def train():
        nonlocal out
        out = compiled(batch).square().mean()
        out.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    row = {"variant": args.child}
    if "replays" in args.phases:
        row["replays"] = soak(replay, args.replays, args.device)
    if "training" in args.phases:
        row["training"] = soak(train, args.steps, args.device)
    if "churn" in args.phases:
        del small, compiled, model, opt
        torch._dynamo.reset()
        row["churn"] = soak(lambda: swap_model(variant), args.rounds, args.device, per=1)
    row["graphs"] = variant.counters()
    return row


def report(rows: list[dict], device: str) -> None:
    print(measure.header("Soak", device))
    print("Growth per 10,000 calls (churn: per round), whole phase / second half.")
    keys = (("rss_mib", ".2f"), ("objects", ".0f"), ("device_mib", ".3f"),
            ("reserved_mib", ".3f"), ("pool_mib", ".3f"))  # fmt: skip
    print("| variant | phase | calls | s | RSS MiB | objects | device MiB | reserved MiB "
          "| pool MiB | at end: RSS, device, reserved MiB |")  # fmt: skip
    print("|---" * 10 + "|")
    for row in rows:
        if "error" in row:
            print(f"| {row['variant']} | error: {row['error']} |" + " |" * 8)
            continue
        for phase in [p for p in PHASES if p in row]:
            r = row[phase]
            whole, late = r["growth"], r["late_growth"]
            cells = [f"{whole[k]:+{spec}} / {late[k]:+{spec}}" for k, spec in keys]
            end = r["last"]
            at_end = f"{end['rss_mib']:.0f}, {end['device_mib']:.1f}, {end['reserved_mib']:.1f}"
            head = f"| {row['variant']} | {phase} | {r['calls']} | {r['seconds']:.1f} | "
            print(head + " | ".join(cells) + f" | {at_end} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=20, help=f"churn rounds (≥ {SAMPLES})")
    parser.add_argument("--phases", nargs="*", default=list(PHASES), choices=PHASES)
    parser.add_argument("--device", default=measure.default_device())
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.replays, args.steps, args.rounds) < SAMPLES:
        parser.error(f"--replays, --steps and --rounds take at least {SAMPLES}")
    if args.child:
        print(json.dumps(run_variant(args)))
        return
    rows = []
    for variant in [v for v in args.variants if args.device == "cuda" or v != "upstream"]:
        argv = [os.path.abspath(__file__), "--child", variant, "--device", args.device]
        argv += ["--replays", str(args.replays), "--steps", str(args.steps)]
        argv += ["--rounds", str(args.rounds), "--phases", *args.phases]
        rows.append({"variant": variant, **measure.in_fresh_process(argv)})
        measure.write_json(args.out, rows)
    report(rows, args.device)


if __name__ == "__main__":
    main()
