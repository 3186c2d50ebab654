"""Collectives inside graphs, on the ``torch.distributed`` stack users already run.

Two ranks, each in its own process (``torch.multiprocessing.spawn``), each with its own tree:
- tensor parallelism with functional collectives (as gpt-fast does): a Megatron-style MLP
  block, column-parallel then row-parallel, whose partial results are all-reduced inside the
  compiled (and graphed) code; and the same with DTensor's ``parallelize_module``;
- data parallelism: ``DDP(torch.compile(model))``: Dynamo's DDPOptimizer splits the model at
  DDP's bucket boundaries, so each pass is a chain of graphs, and the reducer all-reduces
  the gradients each graphed backward produced.

On the CPU (CI) the ranks use ``gloo`` and the emulator: the collectives run at every replay
because the emulator re-runs the code. With two cuda devices (``-m multigpu``, the 2-GPU
machine) the ranks use ``nccl``, and the profiler checks that a replay issues the all-reduce
from inside the graph: NCCL's kernel runs, the host-side op does not.
"""

from __future__ import annotations

import copy
import datetime
import faulthandler
import functools
import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support.fresh_processes import fork_server
from torch.utils.checkpoint import checkpoint

WORLD = 2
STEPS = 5
# FSDP2's gathered parameters land where the allocator puts them: a few more steps, so that
# the last two replay every graph whichever step first saw them move.
FSDP_STEPS = 7
# A rank still running after this long is stuck (a collective whose partner never came):
# it prints every thread's stack and exits, so the test fails instead of hanging.
RANK_DEADLINE_S = int(os.environ.get("XPUGRAPH_TEST_RANK_DEADLINE_S", "240"))

_TWO_GPUS = [
    pytest.mark.multigpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < WORLD,
        reason=f"needs {WORLD} cuda devices",
    ),
]
SETUPS = [
    pytest.param(("cpu", False), id="gloo-cpu", marks=pytest.mark.slow),
    pytest.param(("cuda", True), id="nccl-cuda-checkpointing", marks=_TWO_GPUS),
    pytest.param(("cuda", False), id="nccl-cuda-owned-outputs", marks=_TWO_GPUS),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(worker, device_type: str, checkpointing: bool) -> None:
    """Run ``worker(rank, device)`` on every rank; a rank's failure fails the test."""
    if not dist.is_available():
        pytest.skip("this torch build has no torch.distributed")
    args = (worker, device_type, checkpointing, _free_port())
    # Ranks on the CPU fork from a server that imported torch once (``fresh_processes``); GPU
    # ranks start fresh interpreters, as launchers start them.
    start_method = "spawn"
    if device_type == "cpu":
        fork_server()
        start_method = "forkserver"
    mp.start_processes(_rank_main, args=args, nprocs=WORLD, start_method=start_method)


def _rank_main(rank, worker, device_type, checkpointing, port):
    import inductor_xpugraph

    faulthandler.enable(file=sys.stderr, all_threads=True)  # a rank that aborts says where
    faulthandler.dump_traceback_later(RANK_DEADLINE_S, exit=True, file=sys.stderr)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device_type == "cuda" else "gloo"
    collective_timeout = datetime.timedelta(seconds=RANK_DEADLINE_S // 2)
    dist.init_process_group(backend, rank=rank, world_size=WORLD, timeout=collective_timeout)
    device = f"cuda:{rank}" if device_type == "cuda" else "cpu"
    try:
        inductor_xpugraph.enable(device_type)
        with inductor_xpugraph.config.patch(allocator_checkpointing=checkpointing):
            worker(rank, device)
    finally:
        # NCCL's destroy waits for the graphs that captured its collectives to be freed:
        # free ours first, as users must (README, Limits).
        inductor_xpugraph.reset()
        dist.destroy_process_group()


# -- tensor parallelism --------------------------------------------------------------------------


def _tensor_parallel_mlp(rank: int, device: str):
    """Full weights (for the reference) and this rank's step: column-parallel ``w1``,
    row-parallel ``w2``, one all-reduce of the partial outputs."""
    import torch.distributed._functional_collectives as funcol

    torch.manual_seed(0)  # the same full weights on every rank
    w1 = torch.randn(128, 64, device=device) / 8
    w2 = torch.randn(64, 128, device=device) / 8
    w1_shard = w1.chunk(WORLD, dim=0)[rank].clone()
    w2_shard = w2.chunk(WORLD, dim=1)[rank].clone()

    def step(x):
        partial = torch.nn.functional.gelu(x @ w1_shard.T) @ w2_shard.T
        return funcol.all_reduce(partial, "sum", dist.group.WORLD) + x

    def reference(x):
        return torch.nn.functional.gelu(x @ w1.T) @ w2.T + x

    return step, reference


def _run_tensor_parallel_steps(rank: int, device: str, mode: str | None = "reduce-overhead"):
    """``STEPS`` calls of the compiled step, each equal to the unsharded reference; returns
    the compiled step and the last batch."""
    step, reference = _tensor_parallel_mlp(rank, device)
    compiled = torch.compile(step, mode=mode)
    inputs = torch.Generator(device=device).manual_seed(1)  # the same batch on every rank
    for _ in range(STEPS):
        x = torch.randn(8, 64, device=device, generator=inputs)
        torch.testing.assert_close(compiled(x), reference(x), rtol=1e-4, atol=1e-4)
    return compiled, x


def _tensor_parallel_worker(rank: int, device: str) -> None:
    import inductor_xpugraph

    compiled, x = _run_tensor_parallel_steps(rank, device)
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"]) == (1, STEPS - 2), stats
    assert not stats["skip_reasons"], stats["skip_reasons"]
    if device.startswith("cuda"):
        _assert_replay_all_reduces_inside_the_graph(compiled, x)


def _assert_replay_all_reduces_inside_the_graph(compiled, x) -> None:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        compiled(x)
        torch.cuda.synchronize()
    names = [event.name for event in profiler.events()]
    assert any("nccl" in name.lower() for name in names), "no NCCL kernel ran in the replay"
    host_ops = [name for name in names if "all_reduce" in name and "nccl" not in name.lower()]
    assert not host_ops, f"the replay ran the all-reduce from the host: {host_ops}"


@pytest.mark.parametrize("setup", SETUPS)
def test_a_tensor_parallel_step_replays_its_all_reduce_and_matches_eager(setup):
    _spawn(_tensor_parallel_worker, *setup)


def _dtensor_worker(rank: int, device: str) -> None:
    """Tensor parallelism the DTensor way: ``parallelize_module`` with a column-parallel and
    a row-parallel linear. DTensor passes its DeviceMesh into the compiled graph as an
    object input (torch 2.13), which the graph bakes in, as upstream's trees do: such graphs
    are graphed, not skipped as having inputs that are "neither tensors nor sizes"."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import inductor_xpugraph

    mesh = init_device_mesh(device.split(":")[0], (WORLD,))
    torch.manual_seed(0)  # the same full weights on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)
    ).to(device)
    reference = copy.deepcopy(model)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    compiled = torch.compile(model, mode="reduce-overhead")
    inputs = torch.Generator(device=device).manual_seed(1)  # the same batch on every rank
    with torch.no_grad():
        for _ in range(STEPS):
            x = torch.randn(8, 64, device=device, generator=inputs)
            torch.testing.assert_close(compiled(x), reference(x), rtol=1e-4, atol=1e-4)
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"]) == (1, STEPS - 2), stats
    assert not stats["skip_reasons"], stats["skip_reasons"]
    if device.startswith("cuda"):
        with torch.no_grad():
            _assert_replay_all_reduces_inside_the_graph(compiled, x)


@pytest.mark.parametrize("setup", SETUPS)
def test_a_dtensor_parallelized_module_replays_with_its_mesh_as_a_graph_input(setup):
    _spawn(_dtensor_worker, *setup)


def _staggered_capture_worker(rank: int, device: str) -> None:
    """Rank 1 warms up one call longer, so it runs its all-reduce eagerly while rank 0
    captures its own, and replays from the call after: the collectives still pair up."""
    import inductor_xpugraph

    with inductor_xpugraph.config.patch(warmup_runs=1 + rank):
        _run_tensor_parallel_steps(rank, device)
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"]) == (1, STEPS - 2 - rank), stats


@pytest.mark.parametrize("setup", SETUPS)
def test_ranks_that_capture_at_different_calls_stay_in_step(setup):
    _spawn(_staggered_capture_worker, *setup)


def _one_rank_ungraphed_worker(rank: int, device: str) -> None:
    """Rank 0 runs Inductor's code without graphs (as after a fallback or a skip) while rank 1
    records and replays: rank 0's all-reduces run from the host, rank 1's from its graph, and
    they pair."""
    import inductor_xpugraph

    _run_tensor_parallel_steps(rank, device, mode=None if rank == 0 else "reduce-overhead")
    stats = inductor_xpugraph.stats()
    expected = (0, 0) if rank == 0 else (1, STEPS - 2)
    assert (stats["records"], stats["replays"]) == expected, stats


@pytest.mark.parametrize("setup", SETUPS)
def test_a_rank_without_graphs_pairs_its_collectives_with_a_replaying_rank(setup):
    _spawn(_one_rank_ungraphed_worker, *setup)


# -- data parallelism ----------------------------------------------------------------------------


def _data_parallel_worker(rank: int, device: str) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import inductor_xpugraph

    torch.manual_seed(0)
    # 3 MiB of parameters: more than DDP's first bucket (1 MiB), so Dynamo's DDPOptimizer
    # splits the compiled model at the bucket boundary and each pass is a chain of graphs.
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(3)]).to(device)
    reference = DDP(copy.deepcopy(model))
    compiled = DDP(torch.compile(model, mode="reduce-overhead"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    batches = torch.Generator(device=device).manual_seed(10 + rank)  # each rank its own data
    for _ in range(STEPS):
        x = torch.randn(16, 512, device=device, generator=batches)
        for net, opt in ((compiled, optimizer), (reference, reference_optimizer)):
            net(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        # AdamW's first steps move a weight by about lr * sign(grad): where a gradient is
        # near zero, the rounding differences of Inductor's fused kernels against eager
        # (about 1e-7) can move it by up to lr: on two CPU cores, up to 10 of the 262,144
        # weights ended 6e-5 apart. The tolerance allows that, not a wrong gradient.
        for p, q in zip(model.parameters(), reference.module.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=2e-4)
    stats = inductor_xpugraph.stats()
    # Every graph of the chain (forward and backward of each bucket) records once and
    # replays in every later step.
    assert stats["records"] >= 4 and stats["replays"] == (STEPS - 2) * stats["records"], stats
    assert not stats["skip_reasons"], stats["skip_reasons"]


@pytest.mark.parametrize("setup", SETUPS)
def test_ddp_bucketed_graphs_replay_as_a_chain_and_train_like_eager_ddp(setup):
    _spawn(_data_parallel_worker, *setup)


# -- fully sharded data parallelism (FSDP2) ------------------------------------------------------


def _fsdp_worker(
    rank: int,
    device: str,
    reshard_after_forward: bool = True,
    mixed_precision: bool = False,
    checkpointed: bool = False,
    compiled_first: bool = False,
    compiled_optimizer: bool = False,
) -> None:
    """FSDP2 as torchtitan uses it with torch.compile: each layer sharded, each layer's forward
    compiled. FSDP frees a layer's gathered parameters after use (after its forward, or with
    ``reshard_after_forward=False`` after its backward) and gathers them again into the same
    storage, at an address the allocator picks: the recordings copy them
    (``inputs.MovingStorages``), and every step replays once they are recorded. The forward
    returns its weight for the backward over the caller's parameter, so the backward reads
    the parameter as it is when the backward runs, gathered again. ``mixed_precision``: FSDP
    gathers bf16 copies of the parameters (``MixedPrecisionPolicy``) and reduces the gradients
    in fp32; the layers compute in bf16, compiled and eager alike. ``checkpointed``: each
    compiled forward is ``torch.utils.checkpoint``'s, so its backward recomputes it.
    ``compiled_first``: torchtitan's order, each layer compiled as a module, then sharded.
    ``compiled_optimizer``: AdamW over the sharded parameters (DTensors), its step compiled
    with ``mode="reduce-overhead"`` too, one more graph per step; eager FSDP2 steps AdamW
    eagerly."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import inductor_xpugraph

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)]).to(device)
    reference = copy.deepcopy(model)
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if mixed_precision else None,
        reduce_dtype=torch.float32 if mixed_precision else None,
    )
    # bf16: compiled code rounds otherwise than eager (fused kernels).
    tolerance = {"rtol": 2e-2, "atol": 2e-3} if mixed_precision else {}
    if compiled_first:
        for i, layer in enumerate(model):
            model[i] = torch.compile(layer, mode="reduce-overhead")
    for net in (model, reference):
        for layer in net:
            fully_shard(layer, reshard_after_forward=reshard_after_forward, mp_policy=policy)
        fully_shard(net, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    if not compiled_first:
        for layer in model:
            forward = layer.forward
            if checkpointed:
                forward = functools.partial(checkpoint, forward, use_reentrant=False)
            layer.forward = torch.compile(forward, mode="reduce-overhead")
    graphs = 6  # each layer's forward and backward
    if compiled_optimizer:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        optimizer_step = torch.compile(optimizer.step, mode="reduce-overhead")
        graphs += 1
    batches = torch.Generator(device=device).manual_seed(10 + rank)
    counts = []  # (records, replays) after each step
    for _ in range(FSDP_STEPS):
        x = torch.randn(8, 64, device=device, generator=batches)
        loss = model(x).square().mean()
        loss.backward()
        expected = reference(x).square().mean()
        expected.backward()
        torch.testing.assert_close(loss, expected, **tolerance)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad.full_tensor(), **tolerance)
        if compiled_optimizer:
            optimizer_step()
            reference_optimizer.step()
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.full_tensor(), q.full_tensor(), **tolerance)
        model.zero_grad()
        reference.zero_grad()
        stats = inductor_xpugraph.stats()
        counts.append((stats["records"], stats["replays"]))
    assert (stats["fallbacks"], stats["skip_reasons"]) == (0, {}), stats
    # Each graph (each layer's forward and backward, and the optimizer's step) records and
    # then replays at every step. When memory is copied from depends on the allocator: memory
    # seen at one address at the warmup and the record, and at another later, costs one more
    # record, and with owned outputs (the emulator) the whole tree records once more, without
    # lending. Either way the last steps replay every graph and record nothing.
    steps = [
        (after[0] - before[0], after[1] - before[1]) for before, after in zip(counts, counts[1:])
    ]
    assert steps[-2:] == [(0, graphs), (0, graphs)], counts
    assert stats["replays"] >= graphs * (FSDP_STEPS - 4), counts


def _fsdp_keeping_gathered_parameters_worker(rank: int, device: str) -> None:
    _fsdp_worker(rank, device, reshard_after_forward=False)


def _fsdp_mixed_precision_worker(rank: int, device: str) -> None:
    _fsdp_worker(rank, device, mixed_precision=True)


def _fsdp_mixed_precision_keeping_gathered_parameters_worker(rank: int, device: str) -> None:
    _fsdp_worker(rank, device, reshard_after_forward=False, mixed_precision=True)


def _fsdp_checkpointed_worker(rank: int, device: str) -> None:
    _fsdp_worker(rank, device, checkpointed=True)


def _fsdp_compiled_first_worker(rank: int, device: str) -> None:
    _fsdp_worker(rank, device, compiled_first=True)


def _fsdp_compiled_optimizer_worker(rank: int, device: str) -> None:
    _fsdp_worker(rank, device, compiled_optimizer=True)


@pytest.mark.parametrize("setup", SETUPS)
def test_fsdp2_with_compiled_layers_replays_every_step_and_trains_like_eager_fsdp(setup):
    _spawn(_fsdp_worker, *setup)


@pytest.mark.parametrize("setup", SETUPS)
def test_fsdp2_keeping_gathered_parameters_to_the_backward_replays_every_step(setup):
    _spawn(_fsdp_keeping_gathered_parameters_worker, *setup)


@pytest.mark.parametrize("setup", SETUPS)
def test_fsdp2_with_bf16_mixed_precision_replays_every_step(setup):
    _spawn(_fsdp_mixed_precision_worker, *setup)


@pytest.mark.parametrize("setup", SETUPS)
def test_fsdp2_with_bf16_mixed_precision_keeping_gathered_parameters_replays_every_step(setup):
    _spawn(_fsdp_mixed_precision_keeping_gathered_parameters_worker, *setup)


@pytest.mark.parametrize("setup", SETUPS)
def test_fsdp2_with_activation_checkpointing_replays_every_step(setup):
    _spawn(_fsdp_checkpointed_worker, *setup)


@pytest.mark.parametrize("setup", SETUPS)
def test_fsdp2_of_layers_compiled_before_sharding_replays_every_step(setup):
    _spawn(_fsdp_compiled_first_worker, *setup)


@pytest.mark.parametrize("setup", SETUPS)
def test_fsdp2_with_a_graphed_optimizer_step_replays_it_and_steps_like_eager_adamw(setup):
    _spawn(_fsdp_compiled_optimizer_worker, *setup)
