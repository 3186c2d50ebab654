"""A precompiled export keeps its graphs in a serving process; upstream's does not.

Run on the GPU machine from the repository root:

    PYTHONPATH=. python3 benchmarks/deploy_replay.py

Workload: 32 × (matmul 64² + softmax) at batch 4, the weights one (32, 64, 64) input. Four
per-call host times (median of repeats of 100 calls + one synchronize):
- ours, in process: ``torch.compile(mode="reduce-overhead")`` through inductor_xpugraph;
- ours, loaded: ``deploy.export`` here, ``deploy.load`` in a fresh process;
- upstream, in process: ``mode="reduce-overhead"`` (Inductor's CUDA Graph Trees);
- upstream, loaded: ``standalone_compile`` with ``triton.cudagraphs=True`` saved here, loaded with
  ``CompiledArtifact.load`` in a fresh process (its loader switches cudagraphs off).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import inductor_xpugraph


def chain(x, weights):
    for i in range(weights.shape[0]):
        x = torch.softmax(x @ weights[i], dim=-1)
    return x


def inputs():
    torch.manual_seed(0)
    return [torch.randn(4, 64, device="cuda"), torch.randn(32, 64, 64, device="cuda") * 0.1]


def per_call_us(fn, args, calls=100, repeats=21) -> float:
    for _ in range(20):
        fn(*args)
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def loaded_child(kind: str, path: str) -> None:
    """In a fresh process: load, check against eager, time."""
    if kind == "ours":
        from inductor_xpugraph.deploy import load

        fn = load(path)
    else:
        from torch._inductor import CompiledArtifact

        fn = CompiledArtifact.load(path=path, format="unpacked")
    args = inputs()
    out = fn(*args)
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, chain(*args))
    us = per_call_us(fn, args)
    stats = inductor_xpugraph.stats() if "inductor_xpugraph" in sys.modules else {}
    print(json.dumps({"us": us, "replays": stats.get("replays"), "records": stats.get("records")}))


def run_child(kind: str, path: str) -> dict:
    env = dict(os.environ, INDUCTOR_XPUGRAPH_DEVICES="")
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, path], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    from torch._inductor import standalone_compile

    from inductor_xpugraph.deploy import export

    args = inputs()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        ours_path = os.path.join(tmp, "ours")
        export(chain, args, ours_path)
        rows["ours, loaded in a fresh process"] = run_child("ours", ours_path)

        inductor_xpugraph.disable("cuda")
        from torch.fx.experimental.proxy_tensor import make_fx

        artifact = standalone_compile(
            make_fx(chain)(*args), args, options={"config_patches": {"triton.cudagraphs": True}}
        )
        upstream_path = os.path.join(tmp, "upstream")
        artifact.save(path=upstream_path, format="unpacked")
        rows["upstream, loaded in a fresh process"] = run_child("upstream", upstream_path)

    torch._dynamo.reset()
    rows["upstream, in process"] = {
        "us": per_call_us(torch.compile(chain, mode="reduce-overhead"), args)
    }
    torch._dynamo.reset()
    inductor_xpugraph.enable("cuda")
    inductor_xpugraph.reset()
    ours_us = per_call_us(torch.compile(chain, mode="reduce-overhead"), args)
    rows["ours, in process"] = {"us": ours_us, "replays": inductor_xpugraph.stats()["replays"]}

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| variant | host µs/call | our replays in that process |")
    print("|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['us']:.1f} | {row.get('replays') or '-'} |")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        loaded_child(sys.argv[2], sys.argv[3])
    else:
        main()
