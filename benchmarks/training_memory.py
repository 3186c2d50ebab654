"""Peak memory and replays of training steps: upstream CUDA Graph Trees vs ours.

Run on the GPU machine from the repository root:

    PYTHONPATH=. python3 benchmarks/training_memory.py [--steps 8] [--out results.json]

Each (workload, variant) runs in a fresh process so pools never leak between variants.
A step is forward + backward + SGD update (``zero_grad(set_to_none=True)``). Reported
(above what was allocated/reserved before compiling): peak allocated and peak reserved
memory over the steps, memory still allocated after the last step (ours keeps its graphs'
outputs allocated; upstream's sit free but reserved in its private pool), graph replays,
and the median host time per step.
Variants: ``inductor`` (default mode, no graphs), ``upstream`` (mode="reduce-overhead",
Inductor's own trees), ``ours_checkpointing`` and ``ours_owned`` (mode="reduce-overhead"
through inductor_xpugraph, with allocator checkpointing on, the cuda default, and off: the
portable "owned outputs" strategy that xpu uses).
Workloads: ``mlp``, ``gpt2`` (one shape), ``mlp_2shapes`` (batches of 64 and 48 rows in
turn: two branches of the tree, which only allocator checkpointing lets share memory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORKLOADS = ("mlp", "gpt2", "mlp_2shapes")
VARIANTS = ("inductor", "upstream", "ours_checkpointing", "ours_owned")


def build(workload: str):
    import torch

    torch.manual_seed(0)
    if workload in ("mlp", "mlp_2shapes"):
        layers = []
        for _ in range(4):
            layers += [torch.nn.Linear(1024, 1024), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers).cuda()
        rows = [64, 48] if workload == "mlp_2shapes" else [64]
        step = iter(range(10**9))

        def batch():
            return (torch.randn(rows[next(step) % len(rows)], 1024, device="cuda"),)

        def loss_fn(out, *_):
            return out.square().mean()

        return model, batch, loss_fn
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=4,
        n_head=4,
        n_embd=256,
        vocab_size=5000,
        n_positions=128,
        attn_pdrop=0.0,
        embd_pdrop=0.0,
        resid_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config).cuda()

    def batch():
        return (torch.randint(0, 5000, (8, 128), device="cuda"),)

    def loss_fn(out, ids):
        logits = out.logits if hasattr(out, "logits") else out[0]
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)
        )

    return model, batch, loss_fn


def select_variant(variant: str) -> None:
    """Ours (``ours_checkpointing`` or ``ours_owned``) on cuda, or the stock wrapper."""
    import inductor_xpugraph

    if variant.startswith("ours"):
        inductor_xpugraph.enable("cuda")
        inductor_xpugraph.config.allocator_checkpointing = variant == "ours_checkpointing"
    else:
        inductor_xpugraph.disable("cuda")


def run_variant(workload: str, variant: str, steps: int) -> dict:
    import torch

    import inductor_xpugraph

    select_variant(variant)
    model, batch, loss_fn = build(workload)
    mode = None if variant == "inductor" else "reduce-overhead"
    compiled = torch.compile(model, mode=mode)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    base_reserved = torch.cuda.memory_reserved()
    times = []
    for _ in range(steps):
        inputs = batch()
        start = time.perf_counter()
        loss = loss_fn(compiled(*inputs), *inputs)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    stats = inductor_xpugraph.stats() if variant.startswith("ours") else {}
    return {
        "workload": workload,
        "variant": variant,
        "peak_mib": (torch.cuda.max_memory_allocated() - base) / 2**20,
        "peak_reserved_mib": (torch.cuda.max_memory_reserved() - base_reserved) / 2**20,
        "after_mib": (torch.cuda.memory_allocated() - base) / 2**20,
        "step_ms": statistics.median(times[3:]) * 1e3,
        "replays": stats.get("replays"),
        "records": stats.get("records"),
        "loss": float(loss),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "VARIANT"))
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_variant(*args.one, args.steps)))
        return
    rows = []
    for workload in WORKLOADS:
        for variant in VARIANTS:
            proc = subprocess.run(
                [sys.executable, __file__, "--one", workload, variant, "--steps", str(args.steps)],
                capture_output=True,
                text=True,
                env=os.environ,
            )
            if proc.returncode != 0:
                print(proc.stderr[-3000:])
                continue
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    import torch

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.steps} steps")
    print(
        "| workload | variant | peak allocated MiB | peak reserved MiB | allocated after MiB "
        "| step ms | records | replays |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['workload']} | {r['variant']} | {r['peak_mib']:.1f} "
            f"| {r['peak_reserved_mib']:.1f} | {r['after_mib']:.1f} "
            f"| {r['step_ms']:.2f} | {r['records'] if r['records'] is not None else '-'} "
            f"| {r['replays'] if r['replays'] is not None else '-'} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
