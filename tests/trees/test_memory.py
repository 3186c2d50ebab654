"""The pool-path bookkeeping of allocator checkpointing, against a model allocator.

Real checkpoints need the CUDA caching allocator (tests/trees/backends/test_cuda.py runs
them); here a fake backend models a pool as the set of its allocated addresses, which is all
the strategy may rely on, and records what the strategy asks of it.
"""

import logging

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from inductor_xpugraph.trees.decision import Leave, Position
from inductor_xpugraph.trees.inputs import InputBuffers, StaticInput
from inductor_xpugraph.trees.memory import CheckpointedPool, OwnedOutputs
from inductor_xpugraph.trees.node import CallableIdentity, Phase
from inductor_xpugraph.trees.recording import Recording
from inductor_xpugraph.trees.tree import GraphTree


class ModelPool:
    """A backend whose pool is a set of allocated addresses."""

    supports_pool_checkpoints = True

    warms_up_in_pool = True

    def __init__(self) -> None:
        self.allocated: set[int] = set()
        self.restores: list[frozenset[int]] = []
        self.leak = False  # the next capture keeps an allocation no output accounts for
        # Outputs of warmups in the pool, freed when their storage dies or leaves the address.
        self.warmup_allocations: list[tuple[int, StorageWeakRef]] = []
        self.warmups = {"in pool": 0, "outside": 0}
        self.cache_releases = 0

    def in_use(self) -> set[int]:
        """Addresses allocated in the pool now: graph outputs, and live warmup outputs."""
        live = set()
        for address, ref in self.warmup_allocations:
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
            if storage is not None and storage.data_ptr() == address:
                live.add(address)
        return self.allocated | live

    def release_cached_memory(self):
        self.cache_releases += 1

    def warmup(self, fn, args):
        self.warmups["outside"] += 1
        return fn(args)

    def warmup_in_pool(self, fn, args, pool):
        self.warmups["in pool"] += 1
        outputs = fn(args)
        self.warmup_allocations += [
            (out.data_ptr(), StorageWeakRef(out.untyped_storage())) for out in outputs
        ]
        return outputs

    def capture(self, fn, args, pool, place_inputs):
        """Run ``fn(args)``; memory of its pool inputs that it drops is freed, as on a device."""
        place_inputs(args)
        inputs = [
            (t.untyped_storage().data_ptr(), StorageWeakRef(t.untyped_storage()))
            for t in args
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.allocated
        ]
        outputs = fn(args)
        self.allocated -= {ptr for ptr, ref in inputs if ref.expired()}
        self.allocated |= {out.data_ptr() for out in outputs}
        if self.leak:
            self.allocated.add(1)
        return None, outputs

    def new_pool(self):
        return object()

    def is_capturing(self):
        return False

    def release_dropped_pools(self):
        pass

    def checkpoint_pool(self, pool):
        return frozenset(self.allocated)

    def restore_pool(self, pool, checkpoint, new_owners):
        assert self.in_use() <= checkpoint, "a restore may only add allocations"
        assert {s.data_ptr() for s in new_owners} == checkpoint - self.allocated
        self.allocated = set(checkpoint)
        self.restores.append(checkpoint)

    def free_storages(self, storages):
        for storage in storages:
            self.allocated.remove(storage.data_ptr())

    def pool_holds_exactly(self, pool, storages):
        return {s.data_ptr() for s in storages} == self.in_use()


NO_COPIES = InputBuffers([], copy_values=False)


@pytest.fixture
def tree():
    tree = GraphTree("cpu")
    tree.backend = ModelPool()
    tree.memory = CheckpointedPool(tree.backend)
    tree._pool = object()
    return tree


def record(tree, callable_id, leak=False, make_output=lambda: torch.empty(16)):
    """Capture a one-output graph below the current node and make it current.

    Returns the node and the output handed to the caller: hold it to keep it alive.
    """
    tree.backend.leak = leak
    graph, outputs, _ = tree.capture(lambda args: (make_output(),), [], NO_COPIES)
    recording = Recording(
        None, static_inputs=[], copied_inputs=[], input_buffers=[], captured_outputs=outputs
    )
    del outputs
    node = tree.add_node(
        CallableIdentity(callable_id, f"graph{callable_id}", Phase.INFERENCE), (), recording
    )
    tree.enter(node)
    return node, recording.outputs()[0]


def record_consuming(tree, callable_id, args, keep_input=False, new_output=None):
    """Capture a graph that reads its one input, drops it unless ``keep_input`` (then it
    returns a view of it, as well as its own output), and returns a new output
    (``new_output(address of the input)`` when given, else fresh memory)."""

    def graph(args):
        (x,) = args
        address = x.data_ptr()
        args.clear()
        y = new_output(address) if new_output else torch.empty(16)
        return (y, x[:8]) if keep_input else (y,)

    path_blocks = tree.current.path_blocks()
    static_inputs = [StaticInput.of(args, 0)]
    graph, outputs, consumed = tree.capture(graph, args, NO_COPIES)
    recording = Recording(
        None,
        static_inputs=static_inputs,
        copied_inputs=[],
        input_buffers=[],
        captured_outputs=outputs,
        path_blocks=path_blocks,
        consumed_inputs=consumed,
    )
    del outputs
    node = tree.add_node(
        CallableIdentity(callable_id, f"graph{callable_id}", Phase.BACKWARD), (), recording
    )
    tree.enter(node)
    return node


def owners(node):
    return [block.owner for block in node.recording.blocks]


def output_ptr(node):
    return node.recording.blocks[0].address


def test_only_the_pool_path_owns_output_memory(tree):
    a, a_out = record(tree, 0)
    b, b_out = record(tree, 1)
    assert tree.memory.pool_path == [a, b]
    assert tree.backend.allocated == {output_ptr(a), output_ptr(b)}
    assert all(node.recording.blocks[0].owner is not None for node in (a, b))


def test_capture_at_the_root_frees_every_output_of_the_other_branch(tree):
    a, a_out = record(tree, 0)
    b, b_out = record(tree, 1)
    tree.current = tree.root  # a new generation
    c, c_out = record(tree, 2)
    assert tree.memory.pool_path == [c]
    assert owners(a) == [None] and owners(b) == [None]
    assert tree.backend.allocated == {output_ptr(c)}
    assert tree.backend.restores == []


def test_capture_below_a_node_off_the_pool_path_restores_its_outputs(tree):
    a, a_out = record(tree, 0)
    a_checkpoint = frozenset(tree.backend.allocated)
    record(tree, 1)
    tree.current = tree.root
    c, c_out = record(tree, 2)
    tree.current = a  # a replayed in a later generation
    a_out = a.recording.outputs()[0]
    d, d_out = record(tree, 3)
    assert tree.backend.restores == [a_checkpoint]
    assert tree.memory.pool_path == [a, d]
    assert owners(c) == [None]
    assert a.recording.blocks[0].owner.data_ptr() == output_ptr(a)
    assert tree.backend.allocated == {output_ptr(a), output_ptr(d)}
    assert a_out.data_ptr() == output_ptr(a)  # held, hence re-allocated


def test_capture_reuses_outputs_of_its_step_that_nothing_references(tree):
    a, a_out = record(tree, 0)
    del a_out  # the caller is done with it (say, logits once the loss is computed)
    b, b_out = record(tree, 1)
    assert owners(a) == [None]
    assert tree.backend.allocated == {output_ptr(b)}
    assert list(b.reused_outputs) == a.recording.blocks
    assert b.try_release_reused_memory([])


def test_a_node_does_not_replay_while_an_output_it_reuses_is_referenced(tree):
    a, a_out = record(tree, 0)
    del a_out
    b, b_out = record(tree, 1)
    a_out = a.recording.outputs()[0]  # a later step keeps a's output
    assert not b.try_release_reused_memory([])
    a_view = a_out[1:]
    del a_out
    assert not b.try_release_reused_memory([])  # a view holds the memory too
    del a_view
    assert b.try_release_reused_memory([])


def test_an_output_still_referenced_is_not_reused(tree):
    a, a_out = record(tree, 0)
    b, b_out = record(tree, 1)
    assert b.reused_outputs == ()
    assert tree.backend.allocated == {output_ptr(a), output_ptr(b)}


def test_dropping_a_node_of_the_pool_path_frees_it_and_its_descendants(tree):
    a, a_out = record(tree, 0)
    b, b_out = record(tree, 1)
    c, c_out = record(tree, 2)
    tree.current = a
    tree.drop_node(b)
    assert tree.memory.pool_path == [a]
    assert tree.backend.allocated == {output_ptr(a)}
    assert b not in tree.memory.checkpoints


def test_outputs_are_built_over_a_storage_that_does_not_own_their_memory(tree):
    a, a_out = record(tree, 0)
    (block,) = a.recording.blocks
    assert block.owner.data_ptr() == block.storage.data_ptr() == block.address
    assert block.storage is not block.owner
    assert a_out.untyped_storage()._cdata == block.storage._cdata
    assert a_out.data_ptr() == output_ptr(a)


def test_pool_memory_no_output_accounts_for_switches_the_tree_to_owned_outputs(tree, caplog):
    a, a_out = record(tree, 0)
    b, b_out = record(tree, 1)
    with caplog.at_level(logging.WARNING, logger="inductor_xpugraph"):
        c, c_out = record(tree, 2, leak=True)
    assert "owned outputs instead of allocator checkpointing" in caplog.text
    assert tree.position is Position.OFF_TREE  # the rest of this step runs un-graphed
    assert c.recording.blocks[0].owner is not None
    assert a.recording.blocks[0].owner is not None  # a_out is still valid in this step
    old_pool = tree._pool
    tree.start_generation()
    assert isinstance(tree.memory, OwnedOutputs)
    assert tree.nodes() == []  # recorded again, with owned outputs, into a fresh pool
    assert tree._pool is None and tree.pool is not old_pool


def test_capture_frees_an_input_it_consumes_when_it_drops_it(tree):
    a, a_out = record(tree, 0)  # a forward; a_out stands for a saved activation
    args = [a_out]
    del a_out
    b = record_consuming(tree, 1, args)
    assert owners(a) == [None]
    assert output_ptr(a) not in tree.backend.allocated
    assert list(b.reused_outputs) == a.recording.blocks
    assert [consumed.index for consumed in b.consumed_inputs] == [0]


def test_a_copied_input_the_capture_returns_is_pool_memory_a_later_capture_can_consume(tree):
    def forward(args):  # returns its input batch too, as a forward saving it for backward
        (x,) = args
        args.clear()
        return torch.empty(16), x

    buffers = InputBuffers([0], copy_values=False)
    graph, outputs, _ = tree.capture(forward, [torch.ones(16)], buffers)
    recording = Recording(
        None,
        static_inputs=[],
        copied_inputs=[0],
        input_buffers=buffers.views,
        captured_outputs=outputs,
    )
    del outputs
    a = tree.add_node(CallableIdentity(0, "forward", Phase.FORWARD), (), recording)
    tree.enter(a)
    (buffer,) = recording.input_buffers
    assert buffer.data_ptr() in tree.backend.allocated
    args = [recording.outputs()[1]]  # the saved batch, handed to the backward only
    record_consuming(tree, 1, args)
    assert buffer.data_ptr() not in tree.backend.allocated


def test_a_node_that_consumed_an_input_replays_once_the_caller_drops_it(tree):
    a, a_out = record(tree, 0)
    args = [a_out]
    del a_out
    b = record_consuming(tree, 1, args)
    args = [a.recording.outputs()[0]]  # the next step's saved activation
    assert b.try_release_reused_memory(args)
    assert args == [None]


def test_a_node_that_consumed_an_input_does_not_replay_while_it_is_held(tree):
    a, a_out = record(tree, 0)
    args = [a_out]
    del a_out
    b = record_consuming(tree, 1, args)
    kept = a.recording.outputs()[0]  # a later step keeps the activation
    args = [kept]
    assert not b.try_release_reused_memory(args)
    (rebuilt,) = args  # the arguments are rebuilt for an un-graphed run
    assert rebuilt.data_ptr() == kept.data_ptr() and rebuilt.shape == kept.shape


def test_an_input_referenced_elsewhere_is_not_lent_to_the_capture(tree):
    a, a_out = record(tree, 0)
    b = record_consuming(tree, 1, [a_out])  # the caller still holds a_out
    assert a.recording.blocks[0].owner is not None
    assert output_ptr(a) in tree.backend.allocated
    assert b.consumed_inputs == () and b.reused_outputs == ()


def test_a_lent_input_the_capture_returns_a_view_of_is_owned_again(tree):
    a, a_out = record(tree, 0)
    args = [a_out]
    del a_out
    b = record_consuming(tree, 1, args, keep_input=True)
    assert a.recording.blocks[0].owner is not None
    assert output_ptr(a) in tree.backend.allocated
    assert b.consumed_inputs == ()
    view = b.recording.outputs()[1]
    # The view counts as a use of a's output: a later capture does not reuse its memory.
    assert view.untyped_storage().data_ptr() == output_ptr(a)
    assert not a.recording.blocks[0].is_dead()


def test_an_output_placed_in_the_memory_of_a_consumed_input_is_the_captures_own(tree):
    # A backward's gradient may be allocated exactly where a saved activation it freed was.
    arena = torch.zeros(16)  # pool memory: outlives the storages placed in it

    def over_arena(address):
        storage = torch._C._construct_storage_from_data_pointer(address, arena.device, 64)
        return torch.empty(0).set_(storage, 0, (16,), (1,))

    a, a_out = record(tree, 0, make_output=lambda: over_arena(arena.data_ptr()))
    args = [a_out]
    del a_out
    b = record_consuming(tree, 1, args, new_output=over_arena)
    assert tree.current is b  # the pool check accounted for the memory the capture reused
    assert output_ptr(b) == output_ptr(a) == arena.data_ptr()
    assert [consumed.index for consumed in b.consumed_inputs] == [0]
    (b_out,) = b.recording.outputs()
    assert b_out.shape == (16,)


# -- warmups in the pool ------------------------------------------------------------------------


def warm_up(tree, value=1.0):
    """A warmup below the current node whose one output holds ``value``; returns it."""
    (out,) = tree.warm_up(lambda args: (torch.full((16,), value),), [])
    return out


def test_a_warmup_runs_in_the_pool(tree):
    warm_up(tree)
    assert tree.backend.warmups == {"in pool": 1, "outside": 0}


def test_the_cache_is_released_once_when_a_steps_warmups_start_in_the_pool(tree):
    """What a compilation left cached goes before the pool grows; the step's later calls,
    un-graphed in the pool, add no device synchronization for it."""
    warm_up(tree, value=1.0)
    warm_up(tree, value=2.0)
    assert tree.backend.warmups["in pool"] == 2 and tree.backend.cache_releases == 1


def test_a_callable_warmed_up_again_releases_the_cache_no_more(tree):
    """Only a callable's first warmup follows its compilation: one warmed up at every call
    (``force_cudagraphs_warmup``) adds no device synchronization per call."""

    def fn(args):
        return (torch.zeros(16),)

    for _ in range(3):
        tree.warm_up(fn, [])  # its output dropped at once
        assert tree.resume_after_warmups()
    assert tree.backend.warmups["in pool"] == 3 and tree.backend.cache_releases == 1
    warm_up(tree)  # a callable compiled since
    assert tree.backend.cache_releases == 2


def test_a_warmup_output_held_past_its_generation_leaves_the_pool_with_its_values(tree):
    out = warm_up(tree, value=3.0)
    address = out.data_ptr()
    tree.start_generation()  # the next step's graphs may overwrite the pool: it moves out
    assert out.data_ptr() != address and torch.equal(out, torch.full((16,), 3.0))
    assert tree.backend.in_use() == set()
    a, a_out = record(tree, 0)
    assert tree.next_memory is None  # the pool held exactly the graph's outputs


def test_a_warmup_output_the_caller_dropped_is_not_copied(tree):
    out = warm_up(tree)
    address = out.data_ptr()
    del out
    tree.start_generation()
    assert not tree.warmup_outputs and address not in tree.backend.in_use()


def test_after_a_warmup_in_the_pool_no_graph_runs_until_the_generation_ends(tree):
    a, a_out = record(tree, 0)
    tree.current = tree.root  # the next step: a replays, then a new callable warms up
    tree.current = a
    first = warm_up(tree, value=1.0)
    assert tree.position is Position.WARMING_UP and not tree.current.children
    second = warm_up(tree, value=2.0)  # the step's next call: un-graphed, in the pool
    assert tree.backend.warmups == {"in pool": 2, "outside": 0}
    assert tree.position is Position.WARMING_UP and first.data_ptr() != second.data_ptr()
    tree.start_generation()
    assert tree.current is tree.root


def test_a_warmup_below_a_node_off_the_pool_path_restores_the_path_first(tree):
    a, a_out = record(tree, 0)
    a_checkpoint = frozenset(tree.backend.allocated)
    tree.current = tree.root
    b, b_out = record(tree, 1)  # a sibling: the pool path is [b]
    tree.current = a  # a replayed in a later generation, then a new callable warms up
    out = warm_up(tree)
    assert tree.backend.restores == [a_checkpoint] and tree.memory.pool_path == [a]
    assert tree.backend.in_use() == {output_ptr(a), out.data_ptr()}


def test_owned_outputs_hand_over_warmup_outputs_held_past_their_generation(owned_tree):
    out = warm_up(owned_tree, value=5.0)
    address = out.data_ptr()
    owned_tree.start_generation()
    assert out.data_ptr() != address and torch.equal(out, torch.full((16,), 5.0))


def test_a_warmup_where_a_capture_would_be_refused_runs_outside_the_pool(owned_tree):
    a, b = lend_to_a_backward(owned_tree)
    owned_tree.current = a  # a later step replays a, then another backward warms up
    warm_up(owned_tree)
    assert owned_tree.backend.warmups == {"in pool": 0, "outside": 1}
    assert owned_tree.current is a  # nothing ran in the pool: graphs may still run


# -- owned outputs (portable): the same reuse, and what a lender's free memory forbids ------


@pytest.fixture
def owned_tree():
    tree = GraphTree("cpu")
    tree.backend = ModelPool()
    tree.memory = OwnedOutputs()
    tree._pool = object()
    return tree


def lend_to_a_backward(tree):
    """A forward ``a`` whose output only the backward ``b``'s arguments reference."""
    a, a_out = record(tree, 0)
    args = [a_out]
    del a_out
    return a, record_consuming(tree, 1, args)


def test_owned_outputs_lend_an_input_the_capture_consumes(owned_tree):
    a, b = lend_to_a_backward(owned_tree)
    assert owners(a) == [None]
    assert list(b.reused_outputs) == a.recording.blocks
    assert [consumed.index for consumed in b.consumed_inputs] == [0]
    assert owned_tree.memory.lent_to == {a: {b}}


def test_owned_outputs_free_a_dead_output_for_the_next_capture(owned_tree):
    a, a_out = record(owned_tree, 0)
    del a_out  # the logits, once the loss is computed
    c, c_out = record(owned_tree, 1)
    assert owners(a) == [None]
    assert list(c.reused_outputs) == a.recording.blocks


def test_owned_outputs_keep_an_output_still_referenced(owned_tree):
    a, a_out = record(owned_tree, 0)
    b = record_consuming(owned_tree, 1, [a_out])  # the caller still holds a_out
    assert a.recording.blocks[0].owner is not None
    assert b.reused_outputs == () and owned_tree.memory.lent_to == {}


def test_owned_outputs_allow_captures_below_the_node_that_reused_the_memory(owned_tree):
    a, b = lend_to_a_backward(owned_tree)
    assert owned_tree.current is b
    assert owned_tree.memory.can_capture_below(b)


def test_owned_outputs_refuse_a_capture_that_bypasses_the_node_that_reused_the_memory(
    owned_tree, caplog
):
    a, b = lend_to_a_backward(owned_tree)
    owned_tree.current = a  # a later step replays a, then calls another backward
    assert not owned_tree.memory.can_capture_below(a)
    with caplog.at_level(logging.WARNING, logger="inductor_xpugraph"):
        owned_tree.leave(Leave.LENT_MEMORY, "backward", None)  # as a decision to record there does
    assert "without lending" in caplog.text
    assert owned_tree.position is Position.OFF_TREE  # the rest of this step runs un-graphed
    owned_tree.start_generation()
    assert owned_tree.nodes() == []  # recorded again from this step on
    assert isinstance(owned_tree.memory, OwnedOutputs) and not owned_tree.memory.lending


def test_owned_outputs_refuse_a_capture_below_a_lender_whose_borrower_was_dropped(owned_tree):
    a, b = lend_to_a_backward(owned_tree)
    owned_tree.drop_node(b)  # b is re-recorded: a's lent memory is still free
    assert owned_tree.current is a
    assert not owned_tree.memory.can_capture_below(a)


def test_owned_outputs_without_lending_keep_every_output(owned_tree):
    owned_tree.memory = OwnedOutputs(lending=False)
    a, b = lend_to_a_backward(owned_tree)
    assert a.recording.blocks[0].owner is not None
    assert b.reused_outputs == () and b.consumed_inputs == ()


def test_a_recording_replays_only_with_the_object_inputs_it_was_captured_with():
    # A graph bakes in its object inputs (a DTensor's DeviceMesh, a process group, a
    # generator): another object at that position must not replay it.
    mesh, other_mesh, weight = object(), object(), torch.ones(4)
    recording = Recording(
        None,
        static_inputs=[StaticInput.of([None, weight], 1)],
        copied_inputs=[0],
        input_buffers=[torch.empty(4)],
        captured_outputs=(),
        object_inputs=[(2, mesh)],
    )
    assert recording.static_inputs_match([torch.zeros(4), weight, mesh])
    assert not recording.static_inputs_match([torch.zeros(4), weight, other_mesh])
    assert recording.changed_inputs([torch.zeros(4), weight, other_mesh]) == ([], [2])
    identity = recording.input_identity([torch.zeros(4), weight, mesh])
    assert identity != recording.input_identity([torch.zeros(4), weight, other_mesh])


def test_a_callable_met_again_after_a_warmup_in_the_pool_starts_a_new_generation(tree):
    """Calls that never move torch.compile's counter (a loaded export in a serving loop):
    the warming generation must still end when a callable comes back."""
    identity = CallableIdentity(7, "graph7", Phase.INFERENCE)
    out = warm_up(tree)
    tree.generation.note_eager(identity, [out])
    assert not tree.restart_if_repeated(8, [], (), ())  # another callable: the same step
    assert tree.restart_if_repeated(7, [], (), ())
    assert tree.current is tree.root
