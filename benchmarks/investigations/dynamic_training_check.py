"""Are the wrong gradients of dynamic-shape training ours, upstream's or Inductor's?

The conformance test ``test_dynamic_sizes_in_training`` (an MLP compiled with
``dynamic=True``, batches 4, 6, 8, 4, 6, 8, 4, gradients compared with eager's after every
step) failed intermittently on the H100 for our trees and for upstream's alike. This runs
the same loop ``--trials`` times per variant, each variant in a fresh process, and counts
the trials whose gradients differ from eager's; Inductor without graphs is the control.
The cause is ``torch._C._cuda_clearCublasWorkspaces()``, which upstream's trees call around
warmups and captures (this project's cuda backend never does): Inductor without graphs goes
wrong the same way with it (``inductor_clearing``). Results: ``benchmarks/RESULTS.md``,
"Wrong gradients and cuBLAS workspaces".

    PYTHONPATH=. python3 benchmarks/investigations/dynamic_training_check.py --trials 20 [--cold]

Prints, per variant: failing trials, the steps they failed at and the largest difference.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

import torch

# inductor_clearing: Inductor without graphs, clearing cuBLAS workspaces around the forward
# and the backward, as upstream's trees do around warmups and captures.
VARIANTS = ("inductor", "inductor_clearing", "upstream", "ours", "ours_portable")
BATCHES = (4, 6, 8, 4, 6, 8, 4)


def compile_for(variant: str, model: torch.nn.Module) -> torch.nn.Module:
    import inductor_xpugraph

    if variant.startswith("ours"):
        inductor_xpugraph.enable("cuda")
        inductor_xpugraph.config.allocator_checkpointing = variant == "ours"
    else:
        inductor_xpugraph.disable("cuda")
    mode = None if variant.startswith("inductor") else "reduce-overhead"
    return torch.compile(model, mode=mode, dynamic=True)


def one_trial(variant: str, seed: int, snapshot: bool) -> dict:
    """The conformance loop once; returns the first failing step and the largest error."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
    ).cuda()
    reference = copy.deepcopy(model)
    compiled = compile_for(variant, model)
    worst, failed_steps, wrong = 0.0, [], []
    for step, batch in enumerate(BATCHES):
        x = torch.randn(batch, 16, device="cuda")
        if variant == "inductor_clearing":
            clear = torch._C._cuda_clearCublasWorkspaces
            clear()
            out = compiled(x)
            clear()
            out.register_hook(lambda grad: clear())
            out.square().mean().backward()
            clear()
        else:
            compiled(x).square().mean().backward()
        # The gradients as the backward left them, before any other work on the device.
        at_once = [p.grad.clone() for p in model.parameters()] if snapshot else None
        reference(x).square().mean().backward()
        for index, (p, q) in enumerate(zip(model.parameters(), reference.parameters())):
            error = (p.grad - q.grad).abs().max().item()
            worst = max(worst, error)
            close = torch.isclose(p.grad, q.grad, rtol=1.3e-6, atol=1e-5)
            if not close.all():
                failed_steps.append(step)
                when = "not snapshot"
                if at_once is not None:
                    first = torch.isclose(at_once[index], q.grad, rtol=1.3e-6, atol=1e-5)
                    when = "computed wrong" if not first.all() else "changed after the backward"
                wrong.append(
                    f"step {step} parameter {index}: {int((~close).sum())}/{close.numel()} ({when})"
                )
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
    counters = {}
    if variant.startswith("ours"):
        import inductor_xpugraph

        stats = inductor_xpugraph.stats()
        counters = {k: stats[k] for k in ("records", "replays", "handovers", "fallbacks")}
    return {
        "failed_steps": sorted(set(failed_steps)),
        "worst": worst,
        "wrong": wrong,
        "counters": counters,
    }


def child(variant: str, trials: int, collect_cycles: bool, snapshot: bool) -> None:
    if not collect_cycles:
        import gc

        gc.disable()
    results = []
    for seed in range(trials):
        results.append(one_trial(variant, seed, snapshot))
        torch._dynamo.reset()
        if variant.startswith("ours"):
            import inductor_xpugraph

            inductor_xpugraph.reset()
        elif variant == "upstream":
            from torch._inductor import cudagraph_trees

            cudagraph_trees.reset_cudagraph_trees()
    print(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument(
        "--cold", action="store_true",
        help="give each variant's process empty Triton and Inductor caches (a first compile)",
    )  # fmt: skip
    parser.add_argument("--no-gc", action="store_true", help="no cycle collection in the loop")
    parser.add_argument(
        "--snapshot", action="store_true",
        help="copy the gradients right after the backward, to tell wrong from overwritten "
        "(the copies change the allocation history, which hid the failures)",
    )  # fmt: skip
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.trials, not args.no_gc, args.snapshot)
        return
    caches = "empty caches" if args.cold else "caches as found"
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.trials} trials, {caches}"
    )
    for variant in args.variants:
        env = dict(os.environ)
        if args.cold:
            env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_")
            env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_")
        done = subprocess.run(
            [sys.executable, __file__, "--child", variant, "--trials", str(args.trials)]
            + (["--no-gc"] if args.no_gc else [])
            + (["--snapshot"] if args.snapshot else []),
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        if done.returncode != 0:
            print(f"{variant}: error\n{done.stderr[-2000:]}")
            continue
        results = json.loads(done.stdout.strip().splitlines()[-1])
        failing = [(seed, r) for seed, r in enumerate(results) if r["failed_steps"]]
        worst = max(r["worst"] for r in results)
        detail = "; ".join(
            f"seed {seed}: {', '.join(r['wrong'])} {r['counters'] or ''}" for seed, r in failing
        )
        print(
            f"{variant}: {len(failing)}/{len(results)} trials wrong, largest difference "
            f"{worst:.2e}{': ' + detail if detail else ''}"
        )


if __name__ == "__main__":
    main()
