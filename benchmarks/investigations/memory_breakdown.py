"""Where each implementation's device memory goes, call by call, and what is live at its peak.

    PYTHONPATH=. python3 benchmarks/investigations/memory_breakdown.py --all --out DIR

For each (model, mode, implementation) in its own process: six calls (warmup, record,
replays) with fresh inputs, the allocated and reserved memory after each call and the peak
allocated during it; at the end, the reserved memory by pool (a graph pool or the default
one) and by stream, and the allocations live at the run's peak allocated, grouped by pool
and by where they were made. ``--all`` runs every pair, several processes at once (memory
counters are per process), and prints one table; the JSON per run goes to ``--out``.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

from benchmarks.memory_at_peak import live_at_peak

MODELS = ("mlp", "resnet18", "resnet50", "inception_v3", "swin_t", "gpt2", "bloom")
IMPLS = ("ours", "ours_owned", "upstream")
PAIRS = (
    ("mlp", "inference"),
    ("resnet18", "inference"),
    ("inception_v3", "inference"),
    ("bloom", "inference"),
    ("gpt2", "inference"),
    ("mlp", "training"),
    ("resnet50", "training"),
    ("swin_t", "training"),
    ("gpt2", "training"),
)


def build(name: str, mode: str):
    """(model, inputs factory, loss) on cuda."""
    import torch

    if name == "mlp":
        model = torch.nn.Sequential(
            torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)
        )
        return model.cuda(), lambda: (torch.randn(64, 512, device="cuda"),), lambda out: out.sum()
    if name in ("resnet18", "resnet50", "inception_v3", "swin_t"):
        import torchvision

        kwargs = {"aux_logits": False, "init_weights": False} if name == "inception_v3" else {}
        model = getattr(torchvision.models, name)(weights=None, **kwargs).cuda()
        size = 299 if name == "inception_v3" else 224
        return (
            model,
            lambda: (torch.randn(4, 3, size, size, device="cuda"),),
            lambda out: out.float().square().mean(),
        )
    import transformers

    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=6, n_positions=512)
        model = transformers.GPT2LMHeadModel(config)
        vocab, seq = config.vocab_size, 256
    else:
        config = transformers.BloomConfig(n_layer=4, hidden_size=1024, n_head=16)
        model = transformers.BloomForCausalLM(config)
        vocab, seq = config.vocab_size, 128
    model.config.use_cache = False
    return (
        model.cuda(),
        lambda: (torch.randint(0, vocab, (4, seq), device="cuda"),),
        lambda out: out.logits.float().square().mean(),
    )


def _site(frames: list[dict]) -> str:
    for frame in frames:
        name = frame["filename"]
        if "torchinductor" in name or "/tmp/" in name:
            return f"generated:{frame['name']}"
        if "cublas" in name.lower() or "CUDABlas" in name:
            return "cublas"
    for frame in frames:
        if frame["filename"].endswith(".py") and "inductor_xpugraph" in frame["filename"]:
            return f"{frame['filename'].rsplit('/', 1)[-1]}:{frame['line']} {frame['name']}"
    for frame in frames:
        if frame["filename"].endswith(".py"):
            return f"{frame['filename'].rsplit('/', 1)[-1]}:{frame['line']} {frame['name']}"
    names = " ".join(frame["name"] for frame in frames[:6])
    return "cublas workspace" if "Blas" in names or "blas" in names else f"<c++> {names[:80]}"


def _peak_breakdown(snapshot: dict) -> dict:
    """The allocations live at the moment of peak allocated, by (pool, site), in MiB."""
    segments = sorted(
        (seg["address"], seg["address"] + seg["total_size"], _pool_name(seg))
        for seg in snapshot["segments"]
    )
    starts = [start for start, _, _ in segments]

    def pool_of(address: int) -> str:
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0 and address < segments[i][1]:
            return segments[i][2]
        return "released"

    peak, peak_live = live_at_peak(snapshot)
    groups: collections.Counter[str] = collections.Counter()
    for event in peak_live:
        groups[f"{pool_of(event['addr'])} | {_site(event.get('frames', []))}"] += event["size"]
    return {
        "traced_peak_mib": round(peak / 2**20, 1),
        "live_at_peak_mib": {k: round(v / 2**20, 1) for k, v in groups.most_common(14)},
    }


def _pool_name(seg: dict) -> str:
    return "graph pool" if tuple(seg["segment_pool_id"]) != (0, 0) else "default"


def _reserved_by_pool(snapshot: dict) -> dict:
    reserved: collections.Counter[str] = collections.Counter()
    allocated: collections.Counter[str] = collections.Counter()
    for seg in snapshot["segments"]:
        pool = _pool_name(seg)
        key = f"{pool}, stream {seg['stream']}"
        reserved[key] += seg["total_size"]
        allocated[key] += seg["allocated_size"]
    return {
        k: {"reserved_mib": round(v / 2**20, 1), "allocated_mib": round(allocated[k] / 2**20, 1)}
        for k, v in reserved.items()
    }


def run_one(name: str, mode: str, impl: str, calls: int) -> dict:
    import torch

    import inductor_xpugraph

    if impl == "upstream":
        inductor_xpugraph.disable("cuda")
    else:
        inductor_xpugraph.enable("cuda")
        inductor_xpugraph.config.allocator_checkpointing = impl == "ours"
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(max_entries=400_000, stacks="all")
    base_allocated = torch.cuda.memory_allocated()
    model, make_inputs, loss_of = build(name, mode)
    model.train(mode == "training")
    params = torch.cuda.memory_allocated() - base_allocated
    compiled = torch.compile(model, mode="reduce-overhead")
    torch.cuda.reset_peak_memory_stats()
    rows = []
    for _ in range(calls):
        inputs = make_inputs()
        torch.cuda.reset_peak_memory_stats()
        if mode == "training":
            torch.compiler.cudagraph_mark_step_begin()
            loss = loss_of(compiled(*inputs))
            loss.backward()
            model.zero_grad(set_to_none=True)
            del loss
        else:
            with torch.no_grad():
                out = compiled(*inputs)
            del out
        torch.cuda.synchronize()
        rows.append(
            {
                "allocated_mib": round(torch.cuda.memory_allocated() / 2**20, 1),
                "reserved_mib": round(torch.cuda.memory_reserved() / 2**20, 1),
                "peak_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            }
        )
    snapshot = torch.cuda.memory._snapshot()
    stats = inductor_xpugraph.stats() if impl != "upstream" else {}
    return {
        "model": name,
        "mode": mode,
        "impl": impl,
        "params_mib": round(params / 2**20, 1),
        "calls": rows,
        "peak_allocated_mib": max(r["peak_allocated_mib"] for r in rows),
        "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20, 1),
        "reserved_by_pool": _reserved_by_pool(snapshot),
        "at_peak": _peak_breakdown(snapshot),
        "counters": {k: stats.get(k) for k in ("warmups", "records", "replays", "fallbacks")},
    }


def _child(name: str, mode: str, impl: str, calls: int, out_dir: str) -> dict:
    path = os.path.join(out_dir, f"{name}-{mode}-{impl}.json")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="memory_breakdown_"))
    command = [
        sys.executable,
        __file__,
        "--model",
        name,
        "--mode",
        mode,
        "--impl",
        impl,
        "--calls",
        str(calls),
        "--json",
        path,
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return {"model": name, "mode": mode, "impl": impl, "error": done.stderr[-2000:]}
    with open(path) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=MODELS)
    parser.add_argument("--mode", choices=("inference", "training"), default="inference")
    parser.add_argument("--impl", choices=IMPLS, default="ours")
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--json")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--only", default="", help="comma list of model names (with --all)")
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="memory_breakdown_out_"))
    args = parser.parse_args()
    if not args.all:
        result = run_one(args.model, args.mode, args.impl, args.calls)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        return
    os.makedirs(args.out, exist_ok=True)
    wanted = set(filter(None, args.only.split(",")))
    jobs = [(m, mode, impl) for m, mode in PAIRS if not wanted or m in wanted for impl in IMPLS]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda job: _child(*job, args.calls, args.out), jobs))
    with open(os.path.join(args.out, "all.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("| model | mode | impl | peak alloc | peak reserved | per call (alloc/reserved/peak) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['model']} | {r['mode']} | {r['impl']} | error | | {r['error'][-300:]!r} |")
            continue
        per_call = " ".join(
            f"{c['allocated_mib']:.0f}/{c['reserved_mib']:.0f}/{c['peak_allocated_mib']:.0f}"
            for c in r["calls"]
        )
        print(
            f"| {r['model']} | {r['mode']} | {r['impl']} | {r['peak_allocated_mib']:.1f} | "
            f"{r['peak_reserved_mib']:.1f} | {per_call} |"
        )
    for r in results:
        if "error" not in r:
            print(
                f"\n{r['model']} {r['mode']} {r['impl']}: reserved by pool {r['reserved_by_pool']}"
            )
            print(f"  live at peak: {r['at_peak']['live_at_peak_mib']}")


if __name__ == "__main__":
    main()
