"""Graphs with collectives inside, on two ranks: tensor-parallel decode, DDP and FSDP2
training of an MLP and of a small transformer (README.md describes the workloads).

Every variant gets its own ``torchrun --nproc-per-node 2`` launch with an empty Inductor cache,
``--runs`` launches each, the variants taking turns; a cell is the median over the launches,
with their range (on two H200s the same variant's step time moves by up to 30% between
launches). Rank 0 reports step times, the first call, peak allocated memory above the
workload's start, the result or the losses against eager's, and the graph counts. On the CPU
(gloo) a run only checks that everything works. One variant by hand:
``PYTHONPATH=. torchrun --nproc-per-node 2 benchmarks/distributed.py --child ours``.

``--paired VARIANT``: the host's speed moves between processes by more than eager, upstream
and ours differ on FSDP2's host-bound steps (up to 50% on one H200). Paired, each launch builds
every training workload twice from one seed, eager and VARIANT; each warms up alone, then
their steps alternate in the one process: each side's median step, eager's over VARIANT's, and
that ratio's range over blocks of 10 steps.

``--compile-optimizer``: each training workload's AdamW step is compiled with the variant too
(graphed by ours and upstream's trees, fused by Inductor alone; eager steps it eagerly): the
optimizer takes 12-18% of an FSDP2 step under the profiler on one H200 (docs/distributed.md).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402
import step_profile  # noqa: E402
import workloads  # noqa: E402
from measure import VARIANTS, Variant  # noqa: E402

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
    model = ShardedDecoder(dist.get_world_size()).to(device)
    step = variant.compile(model)
    torch.manual_seed(0)  # the same activations on every rank
    x = torch.randn(4, 1, 512, device=device)
    positions = [torch.tensor([i % model.max_seq], device=device) for i in range(steps)]
    start = time.perf_counter()
    step(x, positions[0])
    measure.synchronize(device.type)
    row = {"first s": time.perf_counter() - start}
    for pos in positions[1:3]:  # warmup and record
        step(x, pos)
    for mode in ("pipelined", "synchronized"):
        left = iter(positions[3:])
        if mode == "pipelined":
            call = lambda: step(x, next(left))  # noqa: E731
        else:  # the host reads each step's result, as a decode loop checking for a stop token
            call = lambda: step(x, next(left))[0, 0, 0].item()  # noqa: E731
        row[f"{mode} ms"] = measure.per_call_us(call, steps - 3, 1, device.type, False) / 1e3
    return {**row, "result": f"{step(x, positions[-1])[0, 0, 0].item():.5f}"}


# -- data-parallel training --------------------------------------------------------------------


# Steps run under the profiler after the timed ones (``--profile``); 0: none.
PROFILE_STEPS = 0
# Whether each training workload's optimizer step is compiled with the variant too
# (``--compile-optimizer``): graphed by ours and upstream, fused by Inductor alone.
COMPILE_OPTIMIZER = False


class Trainer:
    """AdamW steps of ``step_model`` (``model`` wrapped for data parallelism), each step's loss
    read on the host. ``batch(generator)`` makes a step's input (default: 64 × 1024 floats per
    rank), ``loss_of(output, input)`` its loss (default: the mean square)."""

    def __init__(self, step_model, model, device: torch.device, batch=None, loss_of=None) -> None:
        self.step_model, self.model = step_model, model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.optimizer_step = self.optimizer.step
        self.data = torch.Generator(device=device).manual_seed(10 + dist.get_rank())
        self.batch = batch or (lambda g: torch.randn(64, 1024, device=device, generator=g))
        self.loss_of = loss_of or (lambda out, x: out.square().mean())
        self.losses: list[float] = []
        self.times: list[float] = []  # seconds per step, from the batch made to the loss read

    def step(self) -> None:
        x = self.batch(self.data)
        start = time.perf_counter()
        loss = self.loss_of(self.step_model(x), x)
        loss.backward()
        self.optimizer_step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(loss.item())
        self.times.append(time.perf_counter() - start)


def train(variant: Variant, step_model, model, device, steps, batch=None, loss_of=None):
    """``steps`` steps of a ``Trainer``; the median step after the first three. With
    ``PROFILE_STEPS``, that many more steps run under the profiler, and ``step_profile`` says
    where their time went; with ``COMPILE_OPTIMIZER``, ``variant`` compiles the optimizer's
    step. ``steps`` None: the ``Trainer`` itself, unstepped (``--paired``)."""
    trainer = Trainer(step_model, model, device, batch, loss_of)
    if COMPILE_OPTIMIZER:
        trainer.optimizer_step = variant.compile(trainer.optimizer.step)
    if steps is None:
        return trainer
    for _ in range(steps):
        trainer.step()
    times = trainer.times
    steady = sorted(times[3:])[len(times[3:]) // 2]
    result = {"step ms": steady * 1e3, "first s": times[0], "losses": trainer.losses[:steps]}
    if PROFILE_STEPS:
        result["profile"] = step_profile.profile_steps(trainer.step, PROFILE_STEPS)
    return result


def _mixed_precision(bf16: bool) -> dict:
    """``fully_shard``'s keyword for bf16 compute with fp32 gradients' reduction (none without)."""
    if not bf16:
        return {}
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return {"mp_policy": policy}


def ddp_train(variant: Variant, device: torch.device, steps: int | None):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = workloads.mlp(device)
    ddp = DDP(variant.compile(model), device_ids=[device.index] if device.type == "cuda" else None)
    return train(variant, ddp, model, device, steps)


def fsdp_train(variant: Variant, device: torch.device, steps: int | None, bf16: bool = False):
    """FSDP2 with each Linear of an MLP (4 × 1024) sharded with ``fully_shard`` and its forward
    compiled. FSDP gathers a layer's parameters into memory that moves from step to step, so
    graphed variants see static inputs that move."""
    from torch.distributed.fsdp import fully_shard

    model, shard = workloads.mlp(device), _mixed_precision(bf16)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **shard)
            layer.forward = variant.compile(layer.forward)
    fully_shard(model, **shard)
    return train(variant, model, model, device, steps)


class ResidualBlock(torch.nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


class ResidualMLP(torch.nn.Module):
    def __init__(self, width=256, hidden=1024, blocks=4, inputs=64, outputs=16) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(inputs, width)
        self.blocks = torch.nn.ModuleList(ResidualBlock(width, hidden) for _ in range(blocks))
        self.out = torch.nn.Linear(width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def fsdp_mlp(variant: Variant, device: torch.device, steps: int | None, bf16: bool = False):
    """FSDP2 in torchtitan's order: each residual block compiled as a module, then sharded,
    then the root sharded (4 blocks, width 256, hidden 1024, 64 inputs, 16 outputs, batch 64):
    small blocks, so a step is mostly host work."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model, shard = ResidualMLP().to(device), _mixed_precision(bf16)
    for i, block in enumerate(model.blocks):
        model.blocks[i] = variant.compile(block)
        fully_shard(model.blocks[i], **shard)
    fully_shard(model, **shard)
    return train(
        variant,
        model,
        model,
        device,
        steps,
        lambda g: torch.randn(64, 64, device=device, generator=g),
    )


class Block(torch.nn.Module):
    """A pre-norm transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(torch.nn.Module):
    def __init__(self, vocab=8192, dim=512, heads=8, layers=6) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def fsdp_transformer(
    variant: Variant,
    device: torch.device,
    steps: int | None,
    reshard_after_forward: bool = True,
    bf16: bool = False,
    checkpointed: bool = False,
):
    """FSDP2 on a small transformer (6 blocks × 512, vocabulary 8192, batch 8 × 256 tokens per
    rank), torchtitan's way: ``fully_shard`` on each block and on the root, each block's
    forward compiled, AdamW, next-token loss. FSDP gathers each block's parameters into
    memory that moves from step to step (``reshard_after_forward=False``: kept from the
    forward to the backward, freed after it). ``checkpointed``: each block's activations are
    recomputed in the backward (``torch.utils.checkpoint`` inside the compiled forward)."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Transformer().to(device)
    shard = {"reshard_after_forward": reshard_after_forward, **_mixed_precision(bf16)}
    for block in model.blocks:
        fully_shard(block, **shard)
        forward = block.forward
        if checkpointed:
            forward = functools.partial(
                torch.utils.checkpoint.checkpoint, forward, use_reentrant=False
            )
        block.forward = variant.compile(forward)
    fully_shard(model, **shard)

    def batch(generator):
        return torch.randint(0, 8192, (8, 257), device=device, generator=generator)

    def loss_of(logits, tokens):
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())

    def step_model(tokens):
        return model(tokens)

    return train(variant, step_model, model, device, steps, batch, loss_of)


def fsdp_transformer_kept(variant: Variant, device: torch.device, steps: int | None, **kw):
    return fsdp_transformer(variant, device, steps, reshard_after_forward=False, **kw)


def fsdp_transformer_checkpointed(variant: Variant, device: torch.device, steps: int | None, **kw):
    return fsdp_transformer(variant, device, steps, checkpointed=True, **kw)


WORKLOADS = {
    "tp_decode": tp_decode,
    "ddp_train": ddp_train,
    "fsdp_mlp": fsdp_mlp,
    "fsdp_train": fsdp_train,
    "fsdp_transformer": fsdp_transformer,
    "fsdp_transformer_kept": fsdp_transformer_kept,
    "fsdp_transformer_checkpointed": fsdp_transformer_checkpointed,
}
# Each FSDP2 workload also with bf16 mixed precision (``MixedPrecisionPolicy``).
WORKLOADS.update({
    f"{name}_bf16": functools.partial(run, bf16=True)
    for name, run in list(WORKLOADS.items())
    if name.startswith("fsdp")
})  # fmt: skip


# -- one variant under torchrun ----------------------------------------------------------------


def _join(device_type: str) -> torch.device:
    """This rank's device, once it has joined the process group (torchrun's environment)."""
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    if device_type == "cuda":
        return torch.device(device_type, torch.cuda.current_device())
    return torch.device("cpu")


def _leave(results: dict) -> None:
    """Rank 0 prints ``results`` as the launch's last line; every rank leaves the group."""
    dist.barrier()
    if dist.get_rank() == 0:
        print(json.dumps(results), flush=True)
    dist.destroy_process_group()


def child(variant_name: str, device_type: str, workloads_run: list[str], steps: int) -> None:
    device = _join(device_type)
    variant = Variant(variant_name, device_type).select()
    results: dict[str, dict] = {}
    counted: dict[str, int] = {}
    for workload in workloads_run:
        torch._dynamo.reset()
        memory = measure.DeviceMemory(device_type).start()
        results[workload] = WORKLOADS[workload](variant, device, steps)
        results[workload]["peak MiB"] = memory.mib().get("peak_mib", 0.0)
        if variant.ours:
            import inductor_xpugraph

            results[workload]["skips"] = list(inductor_xpugraph.stats()["skip_reasons"])
        graphs = variant.counters()
        if graphs is not None:  # this workload's: the counts since the one before
            results[workload]["graphs"] = {k: v - counted.get(k, 0) for k, v in graphs.items()}
            counted = graphs
        variant.reset_graphs()
    _leave(results)


# -- eager and one variant, their steps alternating in one process (``--paired``) ---------------

# Steps each side runs alone before they alternate: the warmup, the record, and for ours the
# record of graphs whose copied parameters settled (the fifth step), so that nothing compiles
# or records while the sides alternate.
PAIRED_WARMUP_STEPS = 6
PAIRED_BLOCK = 10  # alternated steps per block of the ratio's range


def _ours_report_lines(variant: Variant) -> list[str]:
    """Ours' events (each re-record, fallback or skip with its reason and count) and why each
    graph that copies moving memory still does: the lines ``report()`` prints for them."""
    if not variant.ours:
        return []
    import inductor_xpugraph

    report = inductor_xpugraph.report()
    lines = [event.line() for event in report.events]
    lines += [
        f"{c.graph} [{c.phase}]: copies {c.moving_bytes / 2**20:.1f} MiB per replay "
        f"({c.moving_why})"
        for c in report.callables
        if c.moving_inputs
    ]
    return lines


def paired_child(variant_name: str, device_type: str, workloads_run: list[str], steps: int):
    """For each workload, eager and ``variant_name`` built from one seed, each warmed up alone
    (the variant compiling while it is the one selected), then ``steps`` steps of each,
    alternating: both sides see the same host, whose speed varies between processes by more
    than the variants differ (benchmarks/RESULTS.md)."""
    device = _join(device_type)
    results: dict[str, dict] = {}
    for workload in workloads_run:
        torch._dynamo.reset()
        sides: dict[str, tuple[Variant, Trainer]] = {}
        for name in ("eager", variant_name):
            variant = Variant(name, device_type).select()
            trainer = WORKLOADS[workload](variant, device, None)
            for _ in range(PAIRED_WARMUP_STEPS):
                trainer.step()
            sides[name] = (variant, trainer)
        variant, _ = sides[variant_name]
        before = variant.counters() or {}
        for _ in range(steps):
            for _, trainer in sides.values():
                trainer.step()
        after = variant.counters() or {}
        eager, other = (sides[name][1] for name in ("eager", variant_name))
        mine, theirs = other.times[PAIRED_WARMUP_STEPS:], eager.times[PAIRED_WARMUP_STEPS:]
        blocks = measure.block_ratios(theirs, mine, PAIRED_BLOCK)
        results[workload] = {
            "eager ms": statistics.median(theirs) * 1e3,
            "variant ms": statistics.median(mine) * 1e3,
            "block range": [min(blocks), max(blocks)] if blocks else None,  # under one block
            "worst loss difference": max(
                abs(a - b) for a, b in zip(eager.losses, other.losses, strict=True)
            ),
            # Graphs made and run while the sides alternated, and in all.
            "graphs": {k: (v - before.get(k, 0), v) for k, v in after.items()},
            "why": _ours_report_lines(variant),
        }
        variant.reset_graphs()
    _leave(results)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=1, help="launches per variant, in turns")
    parser.add_argument(
        "--ranks", type=int, default=2, help="processes per launch (1: FSDP2 on one device)"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="after the timed steps, this many more under the profiler: where a step's time goes",
    )
    parser.add_argument(
        "--paired",
        choices=[v for v in VARIANTS if v != "eager"],
        metavar="VARIANT",
        help="eager and VARIANT in each launch, their steps alternating (training workloads)",
    )
    parser.add_argument(
        "--compile-optimizer",
        action="store_true",
        help="training workloads: the variant compiles the AdamW step too (eager: not compiled)",
    )
    parser.add_argument("--child", choices=VARIANTS, help="run one variant (under torchrun)")
    parser.add_argument("--child-paired", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global COMPILE_OPTIMIZER
    COMPILE_OPTIMIZER = args.compile_optimizer
    if args.child:
        global PROFILE_STEPS
        PROFILE_STEPS = args.profile
        child(args.child, args.device, args.workloads, args.steps)
        return
    if args.child_paired:
        paired_child(args.child_paired, args.device, args.workloads, args.steps)
        return
    if args.paired:
        untrained = [w for w in args.workloads if w == "tp_decode"]
        if untrained:
            parser.error("--paired alternates training steps: not tp_decode")
        if args.profile:
            parser.error("--paired does not profile: use --profile without it")
        step = f", {args.paired} compiling the optimizer step" if COMPILE_OPTIMIZER else ""
        title = (
            f"Paired: eager and {args.paired} alternating{step}, {args.ranks} rank(s), "
            f"{args.steps} steps each after {PAIRED_WARMUP_STEPS}, {args.runs} launch(es)"
        )
        print(measure.header(title, args.device))
        launches = [launch(args.paired, args, paired=True) for _ in range(args.runs)]
        report_paired(args.paired, [r for r in launches if r is not None], args.workloads)
        return
    title = (
        f"Distributed, {args.ranks} rank(s), {args.steps} steps per workload, "
        f"{args.runs} launch(es)"
    )
    if COMPILE_OPTIMIZER:
        title += ", optimizer step compiled"
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


def launch(variant: str, args: argparse.Namespace, paired: bool = False) -> dict | None:
    """One ``torchrun`` launch of ``variant`` (with an empty Inductor cache, as every variant
    compiles and autotunes alike), ``paired`` with eager or alone: rank 0's results per
    workload, or None."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    result = measure.in_fresh_process([
        "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks), "--master-port", port,
        os.path.abspath(__file__), "--child-paired" if paired else "--child", variant,
        "--device", args.device,
        "--steps", str(args.steps), "--profile", str(args.profile),
        *(["--compile-optimizer"] if args.compile_optimizer else []),
        "--workloads", *args.workloads,
    ])  # fmt: skip
    if "error" in result:
        print(f"{variant}: failed: {result['error']}")
        return None
    return result


def report(runs: dict[str, list[dict]], workloads_run: list[str]) -> None:
    """One table per workload: each number the median over a variant's launches, with their
    range; losses compared with eager's first launch; graph counts of the first launch."""
    numbers = ("pipelined ms", "synchronized ms", "step ms", "first s", "peak MiB")
    for workload in workloads_run:
        eager = runs.get("eager")
        eager_losses = eager[0][workload].get("losses") if eager else None
        columns = [k for k in numbers if any(k in r[0][workload] for r in runs.values())]
        header = ["variant", *columns, "result", "graphs: records / replays / fallbacks"]
        print(f"\n### {workload}\n\n| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
        for variant, launches in runs.items():
            results = [launch[workload] for launch in launches]
            cells = [measure.median_range([r[k] for r in results], 3) for k in columns]
            if "losses" not in results[0]:
                answer = " ".join(sorted({r["result"] for r in results}))
            elif eager_losses is None:
                answer = "-"
            else:
                worst = max(abs(a - b) for r in results for a, b in zip(r["losses"], eager_losses))
                answer = "losses equal eager's" if worst == 0 else f"losses {worst:.1e} off eager's"
            graphs, skips = results[0].get("graphs"), results[0].get("skips")
            counts = (
                ""
                if not graphs
                else " / ".join(
                    str(graphs.get(k, "-")) for k in ("records", "replays", "fallbacks")
                )
            )
            counts += f" (skipped: {'; '.join(skips)[:200]})" if skips else ""
            print(f"| {variant} | " + " | ".join([*cells, answer, counts]) + " |")
        report_profiles({v: launches[0][workload].get("profile") for v, launches in runs.items()})


def report_paired(variant: str, launches: list[dict], workloads_run: list[str]) -> None:
    """One table per workload, a row per launch: each side's median step, eager's over the
    variant's (above 1: the variant is faster) and its range over blocks of steps."""
    for workload in workloads_run:
        print(f"\n### {workload}\n")
        print(f"| launch | eager ms | {variant} ms | eager / {variant} | per-block range | "
              "largest loss difference | graphs while alternating (in all) |")  # fmt: skip
        print("|---" * 7 + "|")
        for i, results in enumerate(launches, 1):
            row = results[workload]
            spread = row["block range"]
            counts = row["graphs"]
            graphs = " / ".join(
                f"{k} {counts[k][0]} ({counts[k][1]})"
                for k in ("records", "replays", "fallbacks")
                if k in counts
            )
            cells = [
                f"{row['eager ms']:.3f}", f"{row['variant ms']:.3f}",
                f"{row['eager ms'] / row['variant ms']:.3f}",
                f"{spread[0]:.2f}-{spread[1]:.2f}" if spread else "-",
                f"{row['worst loss difference']:.1e}", graphs or "-",
            ]  # fmt: skip
            print(f"| {i} | " + " | ".join(cells) + " |")
        for i, results in enumerate(launches, 1):
            for line in results[workload].get("why", []):
                print(f"- launch {i}: {line}")


def report_profiles(profiles: dict[str, dict | None]) -> None:
    """Where a step's time went, per variant (its first launch), in ms per step: host time by
    region and kind of work, then device time the same way (``step_profile``)."""
    profiles = {variant: p for variant, p in profiles.items() if p}
    if not profiles:
        return
    variants = list(profiles)
    for side in ("host", "device"):
        rows = list(dict.fromkeys(row for p in profiles.values() for row in p[side]))
        print(f"\n| {side} ms per step | " + " | ".join(variants) + " |")
        print("|---" * (len(variants) + 1) + "|")
        total = "step ms" if side == "host" else "device busy ms"
        print(
            f"| **{total}** | " + " | ".join(f"{profiles[v][total]:.3f}" for v in variants) + " |"
        )
        for row in rows:
            cells = [f"{profiles[v][side].get(row, 0.0):.3f}" for v in variants]
            print(f"| {row} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
