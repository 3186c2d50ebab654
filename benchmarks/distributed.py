"""Graphs with collectives inside, on two ranks: tensor-parallel decode, DDP and FSDP2
training (README.md describes the workloads).

Every variant gets its own ``torchrun --nproc-per-node 2`` launch with an empty Inductor cache,
``--runs`` launches each, the variants taking turns; a cell is the median over the launches,
with their range (on two H200s the same variant's step time moves by up to 30% between
launches). Rank 0 reports step times, the first call, peak allocated memory above the
workload's start, the result or the losses against eager's, and the graph counts. On the CPU
(gloo) a run only checks that everything works. One variant by hand:
``PYTHONPATH=. torchrun --nproc-per-node 2 benchmarks/distributed.py --child ours``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import workloads  # noqa: E402
from measure import VARIANTS, Variant  # noqa: E402

# -- the device ------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


# -- tensor-parallel decode --------------------------------------------------------------------


class ShardedBlock(torch.nn.Module):
    """One decoder block holding this rank's shard of the heads and of the MLP."""

    def __init__(self, dim: int, heads: int, batch: int, max_seq: int, world: int) -> None:
        super().__init__()
        self.local_heads, self.head_dim = heads // world, dim // heads
        local = self.local_heads * self.head_dim
        self.norm1, self.norm2 = torch.nn.RMSNorm(dim), torch.nn.RMSNorm(dim)
        self.wqkv = torch.nn.Linear(dim, 3 * local, bias=False)  # column-parallel
        self.wo = torch.nn.Linear(local, dim, bias=False)  # row-parallel
        self.up = torch.nn.Linear(dim, 4 * dim // world, bias=False)  # column-parallel
        self.down = torch.nn.Linear(4 * dim // world, dim, bias=False)  # row-parallel
        cache = (batch, self.local_heads, max_seq, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache), persistent=False)
        self.register_buffer("v_cache", torch.zeros(cache), persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        import torch.distributed._functional_collectives as funcol

        batch = x.shape[0]
        q, k, v = self.wqkv(self.norm1(x)).split(self.local_heads * self.head_dim, dim=-1)
        q, k, v = (
            t.view(batch, 1, self.local_heads, self.head_dim).transpose(1, 2) for t in (q, k, v)
        )
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        attn = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        attn = attn.transpose(1, 2).reshape(batch, 1, -1)
        x = x + funcol.all_reduce(self.wo(attn), "sum", dist.group.WORLD)
        hidden = self.down(F.gelu(self.up(self.norm2(x))))
        return x + funcol.all_reduce(hidden, "sum", dist.group.WORLD)


class ShardedDecoder(torch.nn.Module):
    def __init__(self, world: int, dim=512, heads=8, layers=4, batch=4, max_seq=512) -> None:
        super().__init__()
        self.max_seq = max_seq
        self.blocks = torch.nn.ModuleList(
            ShardedBlock(dim, heads, batch, max_seq, world) for _ in range(layers)
        )

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        mask = (torch.arange(self.max_seq, device=x.device) <= pos).view(1, 1, 1, -1)
        for block in self.blocks:
            x = block(x, pos, mask)
        return x


@torch.no_grad()
def tp_decode(variant: Variant, device: torch.device, steps: int) -> dict:
    torch.manual_seed(dist.get_rank())  # each rank its own shard
    before = allocated(device)
    model = ShardedDecoder(dist.get_world_size()).to(device)
    step = variant.compile(model)
    torch.manual_seed(0)  # the same activations on every rank
    x = torch.randn(4, 1, 512, device=device)
    positions = [torch.tensor([i % model.max_seq], device=device) for i in range(steps)]
    first_start = time.perf_counter()
    out = step(x, positions[0])
    sync(device)
    first = time.perf_counter() - first_start
    for pos in positions[1:3]:  # warmup and record
        out = step(x, pos)
    sync(device)
    start = time.perf_counter()
    for pos in positions[3:]:
        out = step(x, pos)
    sync(device)
    pipelined = (time.perf_counter() - start) / (steps - 3)
    start = time.perf_counter()
    for pos in positions[3:]:
        out = step(x, pos)
        checksum = out[0, 0, 0].item()  # the host reads each step's result
    synchronized = (time.perf_counter() - start) / (steps - 3)
    return {
        "pipelined ms": pipelined * 1e3,
        "synchronized ms": synchronized * 1e3,
        "first s": first,
        "peak MiB": (peak(device) - before) / 2**20,
        "result": f"{checksum:.5f}",
    }


# -- data-parallel training --------------------------------------------------------------------


def train(step_model, model, device: torch.device, steps: int, before: int) -> dict:
    """``steps`` AdamW steps of ``step_model`` (``model`` wrapped for data parallelism), batch
    64 per rank, each step's loss read on the host; the median step after the first three."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.Generator(device=device).manual_seed(10 + dist.get_rank())
    losses, times = [], []
    for _ in range(steps):
        x = torch.randn(64, 1024, device=device, generator=data)
        start = time.perf_counter()
        loss = step_model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    steady = sorted(times[3:])[len(times[3:]) // 2]
    return {
        "step ms": steady * 1e3,
        "first s": times[0],
        "peak MiB": (peak(device) - before) / 2**20,
        "losses": losses,
    }


def ddp_train(variant: Variant, device: torch.device, steps: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    before = allocated(device)
    model = workloads.mlp(device.type if device.type == "cpu" else device)
    ddp = DDP(variant.compile(model), device_ids=[device.index] if device.type == "cuda" else None)
    return train(ddp, model, device, steps, before)


def fsdp_train(variant: Variant, device: torch.device, steps: int) -> dict:
    """FSDP2 as torchtitan uses it with torch.compile: each layer sharded with
    ``fully_shard`` and each layer's forward compiled. FSDP gathers a layer's parameters
    into new memory at every step, so graphed variants see static inputs that move."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    before = allocated(device)
    model = workloads.mlp(device.type if device.type == "cpu" else device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
            layer.forward = variant.compile(layer.forward)
    fully_shard(model)
    return train(model, model, device, steps, before)


WORKLOADS = {"tp_decode": tp_decode, "ddp_train": ddp_train, "fsdp_train": fsdp_train}


# -- one variant under torchrun ----------------------------------------------------------------


def child(variant_name: str, device_type: str, workloads_run: list[str], steps: int) -> None:
    rank = int(os.environ["RANK"])
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    device = (
        torch.device(device_type, torch.cuda.current_device())
        if device_type == "cuda"
        else torch.device("cpu")
    )
    variant = Variant(variant_name, device_type).select()
    results: dict[str, dict] = {}
    counted: dict[str, int] = {}
    for workload in workloads_run:
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        results[workload] = WORKLOADS[workload](variant, device, steps)
        if variant.ours:
            import inductor_xpugraph

            results[workload]["skips"] = list(inductor_xpugraph.stats()["skip_reasons"])
        graphs = variant.counters()
        if graphs is not None:  # this workload's: the counts since the one before
            results[workload]["graphs"] = {k: v - counted.get(k, 0) for k, v in graphs.items()}
            counted = graphs
        variant.reset_graphs()
    dist.barrier()
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--runs", type=int, default=1, help="launches per variant, the variants alternating"
    )
    parser.add_argument("--child", choices=VARIANTS, help="run one variant (under torchrun)")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.device, args.workloads, args.steps)
        return
    title = f"Distributed, two ranks, {args.steps} steps per workload, {args.runs} launch(es)"
    if args.device == "cuda":
        title += f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
    print(measure.header(title, args.device))
    runs: dict[str, list[dict]] = collections.defaultdict(list)
    for _ in range(args.runs):  # variants alternate, so a slow spell of the host hits them all
        for variant in args.variants:
            result = launch(variant, args)
            if result is not None:
                runs[variant].append(result)
    report(runs, args.workloads)


def launch(variant: str, args: argparse.Namespace) -> dict | None:
    """One ``torchrun`` launch of ``variant``: rank 0's results per workload, or None."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", str(_free_port()), __file__, "--child", variant,
        "--device", args.device, "--steps", str(args.steps), "--workloads", *args.workloads,
    ]  # fmt: skip
    # Each launch compiles from an empty Inductor cache: with a shared one, only the first
    # compiled variant compiled from scratch (autotuning included), so its first-call time
    # and peak memory were not comparable with the others'.
    with tempfile.TemporaryDirectory(prefix="distributed-inductor-cache-") as cache:
        environment = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        done = subprocess.run(command, capture_output=True, text=True, env=environment)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        print(f"{variant}: failed (rc {done.returncode})\n{done.stderr[-3000:]}")
        return None
    return json.loads(lines[-1][len("RESULT ") :])


def spread(values: list[float], digits: int) -> str:
    """The median, and the range when there is more than one value."""
    middle = f"{statistics.median(values):.{digits}f}"
    if len(values) == 1:
        return middle
    return f"{middle} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def report(runs: dict[str, list[dict]], workloads: list[str]) -> None:
    """One table per workload: each number the median over a variant's launches, with their
    range; losses compared with eager's first launch; graph counts of the first launch."""
    for workload in workloads:
        eager = runs.get("eager")
        eager_losses = eager[0][workload].get("losses") if eager else None
        print(f"\n{workload}")
        if workload == "tp_decode":
            columns = "pipelined ms/step | synchronized ms/step | 1st s | peak MiB | result"
        else:
            columns = "ms/step | 1st s | peak MiB | losses equal eager's"
        print(f"| variant | {columns} | graphs: records / replays / fallbacks |")
        print("|---" * (columns.count("|") + 3) + "|")
        for variant, launches in runs.items():
            results = [launch[workload] for launch in launches]
            graphs, skips = results[0].get("graphs"), results[0].get("skips")
            counts = (
                f"{graphs['records']} / {graphs['replays']} / {graphs.get('fallbacks', '-')}"
                if graphs
                else ""
            )
            if skips:
                counts += f" (skipped: {'; '.join(skips)[:200]})"
            first = spread([r["first s"] for r in results], 1)
            peak = spread([r["peak MiB"] for r in results], 1)
            if workload == "tp_decode":
                pipelined = spread([r["pipelined ms"] for r in results], 3)
                synchronized = spread([r["synchronized ms"] for r in results], 3)
                answers = " ".join(sorted({r["result"] for r in results}))
                print(
                    f"| {variant} | {pipelined} | {synchronized} | {first} | {peak} | "
                    f"{answers} | {counts} |"
                )
            else:
                if eager_losses is None:
                    same = "-"
                else:
                    worst = max(
                        abs(a - b) for r in results for a, b in zip(r["losses"], eager_losses)
                    )
                    same = "yes" if worst == 0 else f"max difference {worst:.1e}"
                step = spread([r["step ms"] for r in results], 3)
                print(f"| {variant} | {step} | {first} | {peak} | {same} | {counts} |")


if __name__ == "__main__":
    main()
