"""Soak: does a long-running process stay flat? 100,000 replays of a small graph, then 5,000
training steps (an MLP, AdamW), sampling host memory, Python objects and device memory.

Run from the repository root (each variant in a fresh process; cuda if present, else the CPU
emulator, where only ``ours`` runs):

    PYTHONPATH=. python3 benchmarks/soak.py [--replays 100000] [--steps 5000] [--out s.json]

The caller keeps only its latest result (``out = f(x)``), as loops do. Samples are taken every
tenth of each phase, after a synchronize and ``gc.collect()``. Reported per phase: the
growth per 10,000 calls between the first and the last sample (the first sample is taken
after warmup and record, so what is built once is not counted), and over the second half
alone (what is left once allocators' arenas have settled: a leak grows there too), of
resident host memory (RSS), ``len(gc.get_objects())``, device memory allocated (cuda) and our
graph pool bytes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import torch

VARIANTS = ("upstream", "ours", "ours_portable")
SAMPLES = 10


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def sample(device: str) -> dict:
    if device == "cuda":
        torch.cuda.synchronize()
    gc.collect()
    import inductor_xpugraph

    return {
        "rss_mib": rss_mib(),
        "objects": len(gc.get_objects()),
        "device_mib": torch.cuda.memory_allocated() / 2**20 if device == "cuda" else 0.0,
        "pool_mib": inductor_xpugraph.stats()["pool_bytes"] / 2**20,
    }


def soak(step, calls: int, device: str) -> dict:
    """Run ``step`` ``calls`` times after 3 calls of warmup and record; sample SAMPLES+1 times."""
    for _ in range(3):
        step()
    samples = [sample(device)]
    start = time.perf_counter()
    per_sample = calls // SAMPLES
    for _ in range(SAMPLES):
        for _ in range(per_sample):
            step()
        samples.append(sample(device))
    seconds = time.perf_counter() - start  # includes the samples' synchronize and gc

    def growth_per_10k(first: dict, last: dict, calls: int) -> dict:
        return {k: (last[k] - first[k]) * 10_000 / calls for k in first}

    middle = samples[SAMPLES // 2]
    return {"calls": per_sample * SAMPLES, "seconds": seconds, "first": samples[0],
            "last": samples[-1],
            "growth_per_10k": growth_per_10k(samples[0], samples[-1], per_sample * SAMPLES),
            "late_growth_per_10k": growth_per_10k(middle, samples[-1], per_sample * SAMPLES // 2),
            }  # fmt: skip


def run_variant(variant: str, device: str, replays: int, steps: int) -> dict:
    import inductor_xpugraph

    if variant.startswith("ours"):
        inductor_xpugraph.enable(device)
        inductor_xpugraph.config.allocator_checkpointing = variant == "ours"
    else:
        inductor_xpugraph.disable(device)
    torch.manual_seed(0)

    small = torch.compile(lambda x: (x * 2 + 1).relu(), mode="reduce-overhead")
    x = torch.randn(1024, device=device)
    out = None

    def replay():
        nonlocal out
        out = small(x)

    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)
    ).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randn(32, 256, device=device)

    def train():
        nonlocal out
        out = compiled(batch).square().mean()
        out.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    row = {"variant": variant, "replays": soak(replay, replays, device)}
    row["training"] = soak(train, steps, device)
    if variant.startswith("ours"):
        row["stats"] = {k: v for k, v in inductor_xpugraph.stats().items() if k != "skip_reasons"}
    return row


def report(rows: list[dict], device: str) -> None:
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (emulator)"
    print(f"## Soak — {name}, torch {torch.__version__}")
    print("Growth per 10k calls, whole phase / second half.")
    print("| variant | phase | calls | s | RSS MiB | objects | device MiB | pool MiB |"
          " RSS MiB at end |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        for phase in ("replays", "training"):
            r = row[phase]
            whole, late = r["growth_per_10k"], r["late_growth_per_10k"]
            cells = [
                f"{whole[k]:+{spec}} / {late[k]:+{spec}}"
                for k, spec in (("rss_mib", ".2f"), ("objects", ".0f"), ("device_mib", ".3f"),
                                ("pool_mib", ".3f"))
            ]  # fmt: skip
            print(
                f"| {row['variant']} | {phase} | {r['calls']} | {r['seconds']:.1f} | "
                + " | ".join(cells)
                + f" | {r['last']['rss_mib']:.0f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replays", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_variant(args.child, args.device, args.replays, args.steps)))
        return
    variants = [v for v in args.variants if args.device == "cuda" or v == "ours"]
    rows = []
    for variant in variants:
        command = [sys.executable, __file__, "--child", variant, "--device", args.device]
        command += ["--replays", str(args.replays), "--steps", str(args.steps)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            print(f"{variant}: failed\n{result.stderr[-2000:]}")
            continue
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
    report(rows, args.device)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
