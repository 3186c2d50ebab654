"""Churn: a process that swaps models. Does device memory come back when a model is deleted?

Each round builds a new model (an MLP of 4 layers, 1024 wide), compiles it with
``mode="reduce-overhead"``, runs 5 training steps (forward, backward, SGD) and 5 inference
calls, then deletes model and compiled code, calls ``torch._dynamo.reset()`` and
``gc.collect()`` — what notebooks, test runners and model servers do. Nothing else is reset:
no ``inductor_xpugraph.reset()``, no ``reset_cudagraph_trees()``.

Run from the repository root, each variant in a fresh process (cuda if present, else the CPU
emulator, where only ``ours`` runs):

    PYTHONPATH=. python3 benchmarks/churn.py [--rounds 20] [--out churn.json]

Printed per variant: ``torch.cuda.memory_allocated()`` and ``memory_reserved()`` (MiB) after
rounds 3 and the last, our pool bytes, Python objects, and the growth per round between them.
Upstream's trees are dropped by ``torch._dynamo.reset()`` itself (it calls
``reset_cudagraph_trees`` when cuda is available); ours are dropped with the compiled graphs.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys

import torch

VARIANTS = ("upstream", "ours", "ours_portable")


def one_round(device: str, width: int = 1024) -> None:
    model = torch.nn.Sequential(
        *[layer for _ in range(4) for layer in (torch.nn.Linear(width, width), torch.nn.GELU())]
    ).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, width, device=device)
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


def measure(device: str) -> dict:
    import inductor_xpugraph

    if device == "cuda":
        torch.cuda.synchronize()
    gc.collect()
    return {
        "allocated_mib": torch.cuda.memory_allocated() / 2**20 if device == "cuda" else 0.0,
        "reserved_mib": torch.cuda.memory_reserved() / 2**20 if device == "cuda" else 0.0,
        "pool_mib": inductor_xpugraph.stats()["pool_bytes"] / 2**20,
        "objects": len(gc.get_objects()),
    }


def run_variant(variant: str, device: str, rounds: int) -> dict:
    import inductor_xpugraph

    if variant.startswith("ours"):
        inductor_xpugraph.enable(device)
        inductor_xpugraph.config.allocator_checkpointing = variant == "ours"
    else:
        inductor_xpugraph.disable(device)
    samples = []
    for _ in range(rounds):
        one_round(device)
        samples.append(measure(device))
    third, last = samples[2], samples[-1]
    growth = {k: (last[k] - third[k]) / (rounds - 3) for k in third}
    return {
        "variant": variant,
        "rounds": rounds,
        "after_3": third,
        "after_last": last,
        "growth_per_round": growth,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        print(json.dumps(run_variant(args.child, device, args.rounds)))
        return
    variants = VARIANTS if device == "cuda" else ("ours",)
    rows = []
    for variant in variants:
        command = [sys.executable, __file__, "--child", variant, "--rounds", str(args.rounds)]
        result = subprocess.run(command, capture_output=True, text=True)
        lines = result.stdout.strip().splitlines()
        if result.returncode != 0 or not lines:
            tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            rows.append({"variant": variant, "error": tail[:300]})
            print(f"{variant}: failed: {tail[:300]}")
            continue
        rows.append(json.loads(lines[-1]))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (emulator)"
    print(f"## Churn, {args.rounds} rounds — {name}, torch {torch.__version__}")
    print(
        "| variant | allocated MiB (3 / last) | reserved MiB (3 / last) | pool MiB (3 / last) "
        "| objects per round |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            continue
        a, b, g = row["after_3"], row["after_last"], row["growth_per_round"]
        print(
            f"| {row['variant']} | {a['allocated_mib']:.1f} / {b['allocated_mib']:.1f} "
            f"| {a['reserved_mib']:.1f} / {b['reserved_mib']:.1f} "
            f"| {a['pool_mib']:.2f} / {b['pool_mib']:.2f} | {g['objects']:+.0f} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
