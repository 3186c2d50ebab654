"""Behaviour only a real device shows: Inductor's own trees stay out, captures never nest,
graph partitions around CPU work each replay. Marked ``gpu``; skipped without cuda."""

import copy

import pytest
import torch
import torch._inductor.cudagraph_trees as upstream_trees

import inductor_xpugraph
from inductor_xpugraph.trees.per_thread import all_trees

pytestmark = pytest.mark.gpu


def test_inductor_creates_no_tree_of_its_own(cuda_device):
    compiled = torch.compile(lambda x: x.sin() + 1, mode="reduce-overhead")
    x = torch.randn(64, device="cuda")
    for _ in range(4):
        torch.testing.assert_close(compiled(x), x.sin() + 1)
    assert inductor_xpugraph.stats()["replays"] == 2
    containers = getattr(upstream_trees.local, "tree_manager_containers", {})
    assert all(c.tree_manager is None for c in containers.values())


def test_call_inside_a_user_capture_runs_plain_code_inside_it(cuda_device):
    compiled = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead")
    static_x = torch.randn(32, device="cuda")
    for _ in range(3):
        compiled(static_x)  # warmup, record, replay
    replays = inductor_xpugraph.stats()["replays"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(static_x)
    assert inductor_xpugraph.stats()["replays"] == replays  # not replayed during capture
    static_x.copy_(torch.arange(32.0, device="cuda"))
    graph.replay()
    torch.testing.assert_close(out, static_x * 2 + 1)


def test_partitions_around_cpu_work_each_replay(cuda_device):
    def f(x):
        y = (x * 2).relu()
        z = (y.cpu() + 1).to("cuda")  # a device copy: Inductor partitions around it
        return (z * 3).sum(), y

    compiled = torch.compile(f, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(128, device="cuda")
        for got, expected in zip(compiled(x), f(x)):
            torch.testing.assert_close(got, expected)
    stats = inductor_xpugraph.stats()
    assert stats["records"] == 2  # one per partition
    assert stats["replays"] == 4


def test_random_ops_give_the_same_stream_as_ungraphed_code(cuda_device):
    def noisy(x):
        return torch.nn.functional.dropout(x, p=0.5, training=True) + torch.rand_like(x)

    graphed = torch.compile(noisy, mode="reduce-overhead")
    plain = torch.compile(noisy)
    x = torch.randn(1024, device="cuda")
    torch.manual_seed(0)
    from_graphs = [graphed(x).clone() for _ in range(5)]
    torch.manual_seed(0)
    from_plain = [plain(x).clone() for _ in range(5)]
    assert inductor_xpugraph.stats()["replays"] == 3
    for a, b in zip(from_graphs, from_plain):
        torch.testing.assert_close(a, b)


def test_backward_of_a_forward_graph_runs_from_the_same_tree_on_autograd_threads(cuda_device):
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()).cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(4):
        compiled(torch.randn(8, 32, device="cuda")).sum().backward()
    stats = inductor_xpugraph.stats()
    assert stats["records"] == 2 and stats["replays"] == 4  # forward and backward
    # The autograd thread used the forward thread's tree.
    (tree,) = [t for t in all_trees() if t.nodes()]
    forward, backward = sorted(tree.nodes(), key=lambda n: n.seq)
    assert backward.parent is forward


def _run_two_shapes(steps: int) -> None:
    # One dynamic-shape callable: each size is a child of the root, a branch of its own.
    compiled = torch.compile(lambda x: (x @ x).relu() + 1, mode="reduce-overhead", dynamic=True)
    for step in range(steps):
        size = 256 if step % 2 else 512
        x = torch.randn(size, size, device="cuda")
        torch.testing.assert_close(compiled(x), (x @ x).relu() + 1)


def test_two_shapes_replay_correctly_while_sharing_pool_memory(cuda_device):
    with inductor_xpugraph.config.patch(allocator_checkpointing=True):
        inductor_xpugraph.reset()
        _run_two_shapes(steps=12)  # each call a new generation, the branches alternate
        stats = inductor_xpugraph.stats()
    assert stats["records"] == 2 and stats["replays"] == 8
    (tree,) = [t for t in all_trees() if t.nodes()]
    assert tree.memory.name == "allocator_checkpointing"
    # Only the branch recorded last (256 x 256) holds memory; the other one reuses it.
    assert stats["pool_bytes"] == 256 * 256 * 4


def test_captures_leave_cublas_workspaces_outside_the_pool(cuda_device, caplog):
    # cuBLAS allocates a workspace per (handle, stream) on first use; each tree has a capture
    # stream of its own, so its first capture of a matmul would allocate one. In the pool,
    # checkpointing would meet an allocation that is no graph's output and fall back.
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)).cuda()
    reference = copy.deepcopy(model)
    with inductor_xpugraph.config.patch(allocator_checkpointing=True):
        inductor_xpugraph.reset()
        compiled = torch.compile(model, mode="reduce-overhead")
        for _ in range(4):
            x = torch.randn(16, 64, device="cuda")
            compiled(x).square().sum().backward()
            reference(x).square().sum().backward()
        stats = inductor_xpugraph.stats()
    (tree,) = [t for t in all_trees() if t.nodes()]
    assert stats["records"] == 2 and tree.memory.name == "allocator_checkpointing"
    assert "holds memory that is not an output" not in caplog.text
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_trees_after_resets_capture_on_one_stream_and_add_no_workspace(cuda_device):
    # Each tree used to take a new capture stream, and cuBLAS keeps a workspace (32 MiB on
    # an H100) per thread and stream for good: a process that resets and loads a model
    # again grew by one workspace per reset, up to the 32 streams of torch's stream pool.
    def one_model_after_a_reset():
        torch._dynamo.reset()
        inductor_xpugraph.reset()
        compiled = torch.compile(torch.nn.Linear(64, 64).cuda(), mode="reduce-overhead")
        for _ in range(3):
            compiled(torch.randn(8, 64, device="cuda")).sum().backward()
        (tree,) = [t for t in all_trees() if t.nodes()]
        return tree.backend.capture_stream

    first_stream = one_model_after_a_reset()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    for _ in range(3):
        assert one_model_after_a_reset() == first_stream
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - allocated < 2**20


def test_graphed_code_gives_the_callers_stream_no_cublas_workspace(cuda_device):
    # Warmups run on the capture stream: graphed matmuls must not leave the caller's stream
    # a workspace (32 MiB on an H100) that only un-graphed code would use.
    torch._C._cuda_clearCublasWorkspaces()  # every tree is gone: no graph bakes one in
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(16, 64, device="cuda")
    for _ in range(4):  # warmup, record, replays of the forward and the backward
        compiled(x).square().sum().backward()
    assert inductor_xpugraph.stats()["replays"] >= 4
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    product = x @ x.T  # the first eager matmul on this stream allocates its workspace
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - allocated - product.nbytes >= 2**20


def test_owned_outputs_keep_every_branch_allocated(cuda_device):
    with inductor_xpugraph.config.patch(allocator_checkpointing=False):
        inductor_xpugraph.reset()
        _run_two_shapes(steps=12)
        stats = inductor_xpugraph.stats()
    (tree,) = [t for t in all_trees() if t.nodes()]
    assert tree.memory.name == "owned_outputs"
    assert stats["pool_bytes"] == (512 * 512 + 256 * 256) * 4


def _mlp_and_copy():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)
    ).cuda()
    import copy

    return model, copy.deepcopy(model)


@pytest.mark.parametrize("checkpointing", [True, False])
def test_a_backward_capture_reuses_the_saved_activations_it_consumes(cuda_device, checkpointing):
    model, reference = _mlp_and_copy()
    compiled = torch.compile(model, mode="reduce-overhead")
    with inductor_xpugraph.config.patch(allocator_checkpointing=checkpointing):
        inductor_xpugraph.reset()
        for _ in range(6):
            x = torch.randn(64, 256, device="cuda")
            compiled(x).square().mean().backward()
            reference(x).square().mean().backward()
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad)
                p.grad = q.grad = None
        stats = inductor_xpugraph.stats()
        (tree,) = [t for t in all_trees() if t.nodes()]
        backward = max(tree.nodes(), key=lambda n: n.seq)
    assert backward.phase == "backward" and backward.consumed_inputs
    assert stats["replays"] == 8 and stats["liveness_fallbacks"] == 0


@pytest.mark.parametrize("checkpointing", [True, False])
def test_a_backward_consumes_the_copy_of_the_input_batch_its_forward_saved(
    cuda_device, checkpointing
):
    model, _ = _mlp_and_copy()
    compiled = torch.compile(model, mode="reduce-overhead")
    with inductor_xpugraph.config.patch(allocator_checkpointing=checkpointing):
        inductor_xpugraph.reset()
        for _ in range(4):
            compiled(torch.randn(64, 256, device="cuda")).square().mean().backward()
        (tree,) = [t for t in all_trees() if t.nodes()]
        forward, backward = sorted(tree.nodes(), key=lambda n: n.seq)
    # The batch's static buffer is pool memory, saved by the forward: the backward frees it.
    (batch,) = forward.recording.input_buffers
    consumed = {consumed.block.address for consumed in backward.consumed_inputs}
    assert batch.data_ptr() in consumed


@pytest.mark.parametrize("checkpointing", [True, False])
def test_an_activation_kept_by_the_caller_is_never_overwritten_by_the_backward(
    cuda_device, checkpointing
):
    w1 = torch.randn(256, 1024, device="cuda", requires_grad=True)
    w2 = torch.randn(1024, 256, device="cuda", requires_grad=True)

    def f(x):
        hidden = torch.relu(x @ w1)
        return hidden @ w2, hidden

    compiled = torch.compile(f, mode="reduce-overhead")
    with inductor_xpugraph.config.patch(allocator_checkpointing=checkpointing):
        inductor_xpugraph.reset()
        x = torch.randn(64, 256, device="cuda")
        for step in range(5):  # warmup, record, replays; the last step keeps `hidden`
            out, hidden = compiled(x)
            kept = hidden if step == 4 else None
            del hidden
            out.sum().backward()
            w1.grad = w2.grad = None
        torch.testing.assert_close(kept, torch.relu(x @ w1))


@pytest.mark.parametrize("checkpointing", [True, False], ids=["checkpointing", "owned-outputs"])
def test_reset_gives_the_pool_memory_back_to_the_caching_allocator(cuda_device, checkpointing):
    import gc

    with inductor_xpugraph.config.patch(allocator_checkpointing=checkpointing):
        inductor_xpugraph.reset()
        compiled = torch.compile(lambda x: (x @ x).relu() + 1, mode="reduce-overhead")
        for _ in range(4):
            compiled(torch.randn(512, 512, device="cuda"))
        (tree,) = [tree for tree in all_trees() if tree.nodes()]
        pool = tuple(tree._pool.handle)

        def pool_segments():
            snapshot = torch.cuda.memory_snapshot()
            return [s for s in snapshot if tuple(s["segment_pool_id"]) == pool]

        assert pool_segments()
        inductor_xpugraph.reset()
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        assert pool_segments() == []


@pytest.mark.parametrize("checkpointing", [True, False])
def test_a_clear_of_every_cublas_workspace_never_lets_a_graph_write_freed_memory(
    cuda_device, checkpointing
):
    """``torch._C._cuda_clearCublasWorkspaces()`` (upstream's trees call it) frees the
    workspaces our graphs baked in (Note [Someone else clears every workspace]). Tensors
    allocated on the capture stream afterwards may lie there; graphs recorded before must
    not replay over them. On the H200, before the fix, 2 MiB of such tensors changed."""
    tall, wide = torch.randn(64, 1 << 16, device="cuda"), torch.randn(1 << 16, 64, device="cuda")
    product = torch.compile(lambda a, b: (a @ b).relu(), mode="reduce-overhead")
    with inductor_xpugraph.config.patch(allocator_checkpointing=checkpointing):
        inductor_xpugraph.reset()
        for _ in range(3):
            expected = product(tall, wide).clone()
        (tree,) = [t for t in all_trees() if t.nodes()]
        if tree.backend.workspace_policy.name != "KEEP_OUTSIDE_POOL":
            pytest.skip("this torch frees the capture stream's workspaces after each capture")
        torch.cuda.synchronize()
        torch._C._cuda_clearCublasWorkspaces()
        with torch.cuda.stream(tree.backend.capture_stream):
            fillers = [torch.full((mib << 18,), 7.0, device="cuda") for mib in (32, 16, 8, 4)]
        torch.cuda.current_stream().wait_stream(tree.backend.capture_stream)
        for _ in range(4):
            torch.testing.assert_close(product(tall, wide), expected)
        torch.cuda.synchronize()
        assert all(bool((filler == 7.0).all()) for filler in fillers)
        stats = inductor_xpugraph.stats()
    assert stats["records"] == 2 and stats["replays"] >= 2, stats
