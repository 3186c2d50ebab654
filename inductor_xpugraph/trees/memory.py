"""Which graph outputs hold memory in a device's pool, and how a new capture finds room.

Every node of a tree captures into one pool. Its captured outputs are pool memory that later
replays write again; a new capture must never be placed over the outputs of the nodes that run
before it in a generation (its ancestors) while they are still needed, or a replay of the path
would overwrite them. The runtime's safety argument (``tree``) needs exactly that, and nothing
more: a node's outputs are only valid in a generation whose path runs through it, and older
generations' outputs are invalidated. Two strategies give it:

``OwnedOutputs`` (portable: any backend; the one on xpu where torch has no XPU allocator
checkpointing, torch 2.11-2.14; elsewhere with ``config.allocator_checkpointing=False``):
every node keeps its output memory allocated for as long as it exists, except what it lends
(below). No allocator support is needed, and a capture can only use memory no node holds.
Cost: outputs of sibling branches (another shape, eval after train, another graph-break path)
never share memory.

``CheckpointedPool`` (the default where the backend's allocator can checkpoint a pool: cuda,
and xpu on a torch with the ``_xpu_*`` checkpoint bindings, 2.15; see
``backends.allocator_checkpoints``): only the nodes of one path, the *pool path*, own their
output memory; outputs of other nodes are unowned storages over memory the allocator sees as
free. Before a capture below node N, the pool path moves to root..N: owners of nodes leaving
it are freed, and the allocator's bookkeeping is restored to the checkpoint taken right after
N's own capture (``_cuda_setCheckpointPoolState``, on xpu ``_xpu_setCheckpointPoolState``),
which re-allocates the outputs of the nodes joining it, with fresh owners. Siblings therefore
share memory, which is safe because two siblings never run in one generation.

Reuse within a step (both strategies): the memory of an output of the path that is dead by
the time a node is captured can serve that capture, as it would without graphs.
- Outputs nothing references any more (the logits, once the loss is computed) are freed
  before the capture.
- Outputs only the call's arguments reference (a backward's saved activations) are *lent*:
  the capture receives tensors over the owning storage and the strategy lets go of it, so
  the block returns to the pool exactly when the captured code drops the argument after its
  last use. A loan the capture drops is consumed; one that survives (an output aliases it)
  is owned again. The static buffers of copied inputs are allocated inside the capture
  (``inputs.InputBuffers``): a forward that saves its input batch for the backward
  returns that buffer as an output, which the backward can consume like any activation.
The new node records both kinds (``GraphNode.reused_outputs``). A replay first drops the
caller's references to consumed arguments, then checks that nothing references the reused
outputs. If something does (the caller kept the logits this time), its replay would
overwrite them: the callable records a variant that does not reuse them, or, past the bound
on variants, the rest of the generation runs un-graphed
(``GraphedCallable.decide``).

The lender no longer owns that memory. Under checkpointing a later capture below it restores
its checkpoint, which re-allocates the memory, so nothing more is needed. With owned outputs
the memory stays free for good: a capture on a path through the lender that does not also
run through every node that reused its memory (another backward for the same forward, say)
could be placed there and overwrite the lender's outputs before they are read. Such a
capture is refused (``can_capture_below``): that generation runs un-graphed, and the tree
records again from the next one, without lending (``GraphTree.leave``).

After each capture, checkpointing checks that the pool holds exactly the pool path's live
outputs; anything else (an output that is not pool memory, a capture that kept an allocation)
makes the rest of that generation run un-graphed and the tree start again from the next one
with ``OwnedOutputs``, with a warning (``GraphTree._fall_back_to_owned_outputs``).

Warmups run in the pool. A callable's warmup runs the same kernels as its capture, on the same
stream, with the same sizes: its intermediates are the capture's intermediates. Run outside
the pool, the allocator caches the warmup's freed blocks for the capture stream in the default
pool, where no graph can use them, and the capture then reserves the same amount again in the
graph pool: device memory reserved for a model's activations twice, for the life of the
process. Three ways out were weighed:
- empty the default pool's cache before each capture (what ``torch.cuda.graph`` does): frees
  only segments with nothing live in them, so blocks that share a segment with a user's tensor
  stay reserved; it costs the user's un-graphed code its cache at every capture, and it does
  nothing for a pool that must grow while the cache holds memory it could have used;
- warm up under a capture-like routing in a pool of its own, then drop it: the same double
  reservation, one pool at a time, and the pool's memory returns to the device only when
  the allocator frees it;
- warm up in the graph pool, as upstream's trees do: the capture finds the warmup's freed
  memory in its own pool and reserves nothing more. Chosen.
A warmup in the pool must not be placed over memory the graphs need, which is the rule a
capture keeps: so it runs in the pool only where a capture below the current node would be
admitted (``can_capture_below``), after the strategy made the pool ready for one
(``prepare_warmup``: with checkpointing, the pool path moves to the current path, exactly as
before a capture, minus the lending). Elsewhere (off the tree, after a refused capture, on a
backend that cannot route allocations) it runs outside the pool.
Its memory is then anywhere the allocator sees as free, the scratch of any graph included, and
its outputs are the caller's tensors there, which no strategy accounts for. Two rules, the
ones upstream's trees keep, make that safe (``GraphTree.warm_up``, ``start_generation``):
- once a warmup ran in the pool, no graph runs until the generation ends: its later calls
  run un-graphed in the pool (a replay would write its scratch over the warmup's outputs,
  and a capture would place itself around memory it cannot see);
- when the next generation starts, before any graph runs, the warmup outputs still
  referenced (after retiring dropped the output objects the caller held) are *handed over*
  (``WarmupOutputs.hand_over``: copied out of the pool, every tensor over them keeping its
  values, as gradients are). Upstream's trees free them and make them raise instead.
So a capture or a restore never meets a warmup's allocation. A usual loop keeps nothing past
its step (``out = model(x)`` drops the last output, ``zero_grad()`` the gradients) and nothing
is copied; gradient accumulation copies its gradients out once. Where torch cannot swap a
storage's memory (``invalidation.can_copy_out_of_pool``), warmups run outside the pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import config
from . import messages, stats
from .invalidation import copy_out_of_pool
from .node import ConsumedInput, GraphNode
from .storages import tensor_over

if TYPE_CHECKING:
    from .backends import GraphBackend
    from .recording import OutputBlock


class Output(NamedTuple):
    """An output of a node: the ``index``-th block of memory its recording's outputs lie in."""

    node: GraphNode
    index: int

    @property
    def block(self) -> OutputBlock:
        return self.node.recording.blocks[self.index]


class _PathReuse:
    """What both strategies share: outputs of the path a capture may reuse, and loans."""

    def __init__(self) -> None:
        # Nodes, root first, of the path of the capture being prepared (or the last one).
        self.pool_path: list[GraphNode] = []
        # Outputs freed for the capture being prepared: dead ones, then consumed loans.
        self._freed_for_capture: list[Output] = []
        # Owners lent to the capture in progress: (output, weak reference to the owner).
        self._loans: list[tuple[Output, StorageWeakRef]] = []
        # Arguments of the capture over lent outputs, with the layout to rebuild them.
        self._lent_args: list[ConsumedInput] = []

    def can_capture_below(self, parent: GraphNode) -> bool:
        return True

    def held_bytes(self, nodes: list[GraphNode]) -> int:
        """Bytes of the outputs of ``nodes`` that own pool memory now."""
        return sum(
            block.owner.nbytes()
            for node in nodes
            for block in node.recording.blocks
            if block.owner is not None
        )

    def _free(self, output: Output) -> None:
        raise NotImplementedError

    def _held(self) -> list[Output]:
        """The outputs of the pool path that own pool memory now."""
        return [
            Output(node, index)
            for node in self.pool_path
            for index, block in enumerate(node.recording.blocks)
            if block.owner is not None
        ]

    def _begin_reuse(self, outputs: list[Output]) -> None:
        """For a new capture: forget an earlier capture's loans, and free those of
        ``outputs`` that nothing references any more (the capture may reuse them)."""
        self._loans, self._lent_args = [], []
        self._freed_for_capture = [output for output in outputs if output.block.is_dead()]
        for output in self._freed_for_capture:
            self._free(output)

    def lend_inputs(self, args: list[Any]) -> list[int]:
        """Hand the capture the owners of path outputs that only ``args`` reference; return
        the positions of the arguments lent.

        Each such argument is replaced by a tensor over its output's owning storage, and the
        strategy drops its own reference: the memory is freed when the captured code drops
        the argument. The caller must hold no other reference to ``args``' tensors.
        """
        held_by_ptr = {output.block.address: output for output in self._held()}
        # Taken out of ``args``: their references must not count as uses.
        layouts = _take_arguments_in(held_by_ptr, args)
        for output, arg_layouts in layouts.items():
            block = output.block
            lend = block.is_dead()
            storage = block.owner if lend else block.storage
            for arg_index, *layout in arg_layouts:
                args[arg_index] = tensor_over(storage, *layout)
            if lend:
                self._loans.append((output, StorageWeakRef(storage)))
                block.owner = None
                self._lent_args.extend(
                    ConsumedInput(arg_index, block, *layout) for arg_index, *layout in arg_layouts
                )
        return [lent.index for lent in self._lent_args]

    def settle_loans(self) -> frozenset[int]:
        """After the capture: an owner it dropped was consumed, one still alive is ours again.

        Returns the addresses of the outputs it consumed: the capture may have put its own
        allocations (its outputs among them) there.
        """
        consumed = set()
        for output, loan in self._loans:
            owner = torch.UntypedStorage._new_with_weak_ptr(loan.cdata)
            if owner is None:
                self._freed_for_capture.append(output)
                consumed.add(output.block.address)
            else:
                output.block.owner = owner
        self._loans = []
        self._lent_args = [arg for arg in self._lent_args if arg.block.address in consumed]
        return frozenset(consumed)

    def take_back_loans(self, args: list[Any]) -> None:
        """After a capture that raised: put each lent argument back into ``args``, as a
        tensor over its output's memory, for an un-graphed run of the same call, and end the
        loans (``settle_loans``). An owner the capture dropped leaves its memory free in the
        pool with its contents intact (a device capture executes nothing; the emulator puts
        its inputs back), and nothing is allocated there before the next capture into that
        pool, which the tree no longer makes (``GraphTree.start_over``)."""
        for lent in self._lent_args:
            args[lent.index] = lent.tensor()
        self.settle_loans()
        self._freed_for_capture, self._lent_args = [], []

    def _note_reuse(self, node: GraphNode) -> list[Output]:
        """Give the new node what its capture reused; returns those outputs."""
        freed, self._freed_for_capture = self._freed_for_capture, []
        node.reused_outputs = tuple(output.block for output in freed)
        node.consumed_inputs, self._lent_args = tuple(self._lent_args), []
        return freed


class WarmupOutputs:
    """The storages warmups allocated in the pool and gave the caller, held weakly (see the
    module docstring, "Warmups run in the pool")."""

    def __init__(self) -> None:
        self._storages: list[StorageWeakRef] = []

    def __bool__(self) -> bool:
        return bool(self._storages)

    def note(self, outputs: Any, inputs: list[StorageWeakRef]) -> None:
        """Note the outputs of a warmup in the pool, but for those over an input's storage
        (``inputs``, taken before the run). Storages, not addresses: an input the run freed
        (a forward's saved activation, in the pool too) may have left its address to an
        output."""
        kept_inputs = {ref.cdata for ref in inputs if not ref.expired()}
        flat = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        for out in flat:
            if isinstance(out, torch.Tensor) and not out.is_meta:
                ref = StorageWeakRef(out.untyped_storage())
                if ref.cdata not in kept_inputs and out.untyped_storage().data_ptr():
                    self._storages.append(ref)

    def any_alive(self) -> bool:
        return any(not ref.expired() for ref in self._storages)

    def hand_over(self) -> int:
        """Copy the ones still alive out of the pool, which gets their memory back; returns
        how many."""
        noted, self._storages = self._storages, []
        alive: dict[int, torch.UntypedStorage] = {}
        for ref in noted:
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
            if storage is not None:
                alive.setdefault(storage.data_ptr(), storage)
        if alive:
            copy_out_of_pool(list(alive.values()))  # the storages returned free the pool's
        return len(alive)


class OwnedOutputs(_PathReuse):
    """Each node owns its outputs while it exists (portable; needs no allocator support),
    except those it lends to a capture later on its path."""

    name = "owned_outputs"

    def __init__(self, lending: bool = True) -> None:
        super().__init__()
        self.lending = lending
        # Lender -> the nodes whose captures reused memory of its outputs. A node dropped
        # later stays in the set: it is on no path, so captures below the lender are refused.
        self.lent_to: dict[GraphNode, set[GraphNode]] = {}

    def can_capture_below(self, parent: GraphNode) -> bool:
        """False when the path root..parent runs through a lender but not through every
        node that reused its memory: that memory is free, and the capture could use it."""
        path = set(parent.path_from_root())
        return all(
            borrowers <= path for lender, borrowers in self.lent_to.items() if lender in path
        )

    def prepare_capture(self, parent: GraphNode, pool: Any) -> None:
        self.pool_path = parent.path_from_root()
        self._begin_reuse(self._held() if self.lending else [])

    def prepare_warmup(self, parent: GraphNode, pool: Any) -> None:
        """Every output not lent away is allocated: an un-graphed run admitted below
        ``parent`` (``can_capture_below``) can allocate anywhere else in the pool."""

    def lend_inputs(self, args: list[Any]) -> list[int]:
        return super().lend_inputs(args) if self.lending else []

    def adopt(self, node: GraphNode, pool: Any) -> bool:
        for lent in self._note_reuse(node):
            self.lent_to.setdefault(lent.node, set()).add(node)
        return True

    def forget(self, nodes: list[GraphNode]) -> None:
        for node in nodes:  # their owners die with them
            self.lent_to.pop(node, None)

    def _free(self, output: Output) -> None:
        output.block.owner = None  # the last reference: freed now


class CheckpointedPool(_PathReuse):
    """Only the pool path owns memory; the allocator is restored to a checkpoint to move it."""

    name = "allocator_checkpointing"

    def __init__(self, backend: GraphBackend) -> None:
        super().__init__()
        self.backend = backend
        # ``pool_path``: the nodes whose live outputs are allocated in the pool: their
        # recordings' blocks hold an owning storage (None once freed). Every other node's
        # blocks are unowned.
        # The allocator's bookkeeping of the pool right after each node's capture, and which
        # outputs it has allocated.
        self.checkpoints: dict[GraphNode, Any] = {}
        self.allocated_at: dict[GraphNode, frozenset[Output]] = {}

    def prepare_capture(self, parent: GraphNode, pool: Any) -> None:
        """Allocate exactly the live outputs of root..parent; free everything else."""
        self.prepare_warmup(parent, pool)
        self._begin_reuse(_in_capture_order(self.allocated_at.get(parent, frozenset())))

    def prepare_warmup(self, parent: GraphNode, pool: Any) -> None:
        """Allocate exactly the live outputs of root..parent: the pool path moves there."""
        wanted = self.allocated_at.get(parent, frozenset())
        held = set(self._held())
        for output in held - wanted:
            self._free(output)
        missing = _in_capture_order(wanted - held)
        if missing:
            owners = [output.block.new_unowned_storage() for output in missing]
            self.backend.restore_pool(pool, self.checkpoints[parent], owners)
            for output, owner in zip(missing, owners):
                output.block.owner = owner
        self.pool_path = parent.path_from_root()

    def adopt(self, node: GraphNode, pool: Any) -> bool:
        recording = node.recording
        held = self._held()
        expected = [output.block.owner for output in held]
        expected += [block.owner for block in recording.blocks]
        if not self.backend.pool_holds_exactly(pool, expected):
            return False
        self.checkpoints[node] = self.backend.checkpoint_pool(pool)
        outputs = {Output(node, index) for index in range(len(recording.blocks))}
        self.allocated_at[node] = frozenset(held) | outputs
        self._note_reuse(node)
        self.pool_path.append(node)
        return True

    def forget(self, nodes: list[GraphNode]) -> None:
        dropped = set(nodes)
        for index, node in enumerate(self.pool_path):
            if node in dropped:
                for leaving in self.pool_path[index:]:
                    for output_index in range(len(leaving.recording.blocks)):
                        self._free(Output(leaving, output_index))
                del self.pool_path[index:]
                break
        for node in nodes:
            self.checkpoints.pop(node, None)
            self.allocated_at.pop(node, None)

    def _free(self, output: Output) -> None:
        block = output.block
        if block.owner is not None:
            self.backend.free_storages([block.owner])
            block.owner = None


def _in_capture_order(outputs) -> list[Output]:
    return sorted(outputs, key=lambda output: (output.node.seq, output.index))


def _take_arguments_in(outputs_by_ptr: dict[int, Output], args: list[Any]) -> dict[Output, list]:
    """Remove the tensors of ``args`` in the memory of these outputs; return their layouts
    (argument index, offset, size, stride, dtype), by output."""
    layouts: dict[Output, list[tuple[Any, ...]]] = {}
    for arg_index, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            output = outputs_by_ptr.get(arg.untyped_storage().data_ptr())
            if output is not None:
                layout = (arg_index, arg.storage_offset(), arg.size(), arg.stride(), arg.dtype)
                layouts.setdefault(output, []).append(layout)
                args[arg_index] = None
    return layouts


MemoryStrategy = OwnedOutputs | CheckpointedPool


def memory_strategy(backend: GraphBackend) -> MemoryStrategy:
    """Checkpoints where the backend found every checkpoint binding of its device in this
    torch (``supports_pool_checkpoints``) and the config allows them; else owned outputs."""
    if config.allocator_checkpointing and backend.supports_pool_checkpoints:
        return CheckpointedPool(backend)
    return OwnedOutputs()


def reserve_in_new_pool(backend: GraphBackend, pool: Any, nbytes: int, device: str) -> None:
    """``initial_pool_allocation_gb``: a reservation the device cannot make, or has no
    memory for, is said once and the pool grows as graphs are recorded."""
    try:
        if backend.reserve_in_pool(pool, nbytes):
            return
        why = "its allocator cannot place memory in a pool outside a capture"
    except RuntimeError as error:  # out of memory
        why = f"reserving {nbytes / 2**30:.2f} GiB failed ({messages.first_line(error)})"
    stats.warn_once(messages.CANNOT_RESERVE_POOL % (device, why))
