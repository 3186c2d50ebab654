"""The generation in progress on a graph tree: what it handed out, and whether it may end.

A generation is one pass down the tree from its root (``tree``): a training step, an
inference call, a decode step. While it runs, it notes what it hands the caller: the nodes
that ran, and the outputs of its un-graphed runs. When it ends, that is retired
(``handed_out``) and the next one starts empty.

Note [A backward that can no longer run]
----------------------------------------
A generation does not end while a backward of it is pending: the backward belongs to the
iteration of its forward and reads what the forward left in graph memory. "A backward is
pending" holds only while it can still run and read that: while some output of the
generation's forwards is held, or its memory is referenced otherwise (the activations
autograd saved, a loss's graph keeping them). A forward called in training mode whose
results the caller drops (an evaluation loop without ``torch.no_grad()``) leaves nothing a
backward could read; without this rule, every such call would record a new graph below the
last one, without end. The recordings must first stop holding their own outputs that carry
autograd history (``find_outputs_autograd_took``), or they would keep the autograd graph
alive themselves. When a backward can still run, a forward met again is recorded below the
last one, as upstream's trees do: layers that share one compiled graph are met again on the
path in every training step, so this is no error.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection
from typing import Any

import torch
from torch._dynamo.mutation_guard import GenerationTracker
from torch._inductor.cudagraph_trees import MarkStepBox

from .handed_out import HandedOut
from .node import CallableIdentity, GraphNode, Phase


class OutputRef(weakref.ref):
    """A weak reference to an output of an un-graphed run, with its position among the
    callable's outputs (a recording of the callable hands out the same position)."""

    __slots__ = ("position",)

    def __new__(cls, output: torch.Tensor, position: int) -> OutputRef:
        ref = super().__new__(cls, output)
        ref.position = position
        return ref

    def __init__(self, output: torch.Tensor, position: int) -> None:
        super().__init__(output)


def current_generation() -> int:
    """Upstream's generation: the mark-step counter once used, else the compile invocation.
    The replay fast path (``GraphedCallable.__call__``) inlines it."""
    return MarkStepBox.mark_step_counter or GenerationTracker.generation


class Generation:
    """What the generation in progress handed out, and whether a backward of it is pending.

    The fast path writes these attributes directly: a node that replayed is appended to
    ``replayed_nodes``, and every call of a forward (backward) sets (clears)
    ``pending_backward``.
    """

    __slots__ = (
        "number",
        "pending_backward",
        "replayed_nodes",
        "eager_outputs",
        "written",
        "carried",
    )

    def __init__(self, number: int | None = None) -> None:
        # ``current_generation()`` when it started; None for a tree that has run nothing.
        self.number = number
        # Set by a forward's call, cleared by a backward's: see ``backward_may_run``.
        self.pending_backward = False
        # The nodes that ran, in order (a node may appear more than once): their output
        # objects are their recordings'.
        self.replayed_nodes: list[GraphNode] = []
        # Un-graphed runs, as (callable identity, weak references to its outputs) pairs.
        self.eager_outputs: list[tuple[CallableIdentity, list[weakref.ref]]] = []
        # Its outputs that a later call of it wrote in place: state (``note_written``).
        self.written: list[tuple[weakref.ref, int]] = []
        # Un-graphed outputs of the generation before that the caller held when it ended:
        # stale when this one ends, unless a call of it writes them (``take_carried``).
        self.carried: list[tuple[CallableIdentity, list[weakref.ref]]] = []

    def note_eager(
        self, producer: CallableIdentity, outputs: Any, inputs: Collection[int] = ()
    ) -> None:
        """Note what an un-graphed run of ``producer`` gave the caller, to retire it when the
        generation ends: its tensor outputs but those that are input objects (``inputs``,
        their ids: a parameter saved for backward is not ours to invalidate).

        Output objects are held weakly: one the caller drops is freed as it would be without
        graphs. Gradients are never made stale, so backward outputs are not noted.
        """
        if producer.phase is not Phase.BACKWARD:
            refs = [
                OutputRef(out, i)
                for i, out in enumerate(outputs)
                if isinstance(out, torch.Tensor) and id(out) not in inputs
            ]
            self.eager_outputs.append((producer, refs))

    def note_written(self, args: list[Any], positions: tuple[int, ...]) -> None:
        """Note the tensors of ``args`` at ``positions`` (a call writes them in place) that
        are outputs of this generation: state made inside compiled code, handed over when
        the generation ends if the caller still holds them (Note [Outputs kept as state]).
        Called where a callable warms up or records, never on the replay fast path."""
        so_far = HandedOut(self.replayed_nodes, self.eager_outputs)
        for i in positions:
            arg = args[i]
            if isinstance(arg, torch.Tensor) and so_far.goes_stale(arg):
                self.written.append((weakref.ref(arg), arg.untyped_storage().data_ptr()))

    def take_carried(
        self, args: list[Any], positions: tuple[int, ...]
    ) -> list[tuple[CallableIdentity, int, torch.Tensor]]:
        """The tensors of ``args`` at ``positions`` (a call writes them in place) that are
        carried from the generation before, each with the callable that made it and its
        output position: state, which no longer goes stale (Note [Un-graphed outputs go
        stale a generation late] in ``handed_out``). Called where a callable warms up or
        records, never on the replay fast path."""
        if not self.carried:
            return []
        written = {id(arg): arg for i in positions if isinstance(arg := args[i], torch.Tensor)}
        taken = []
        for producer, refs in self.carried:
            for ref in list(refs):
                out = ref()
                if out is not None and id(out) in written:
                    taken.append((producer, ref.position, out))
                    refs.remove(ref)
        return taken

    def ran(self, callable_id: int) -> bool:
        """Whether ``callable_id`` ran in this generation, graphed or not."""
        return any(node.callable_id == callable_id for node in self.replayed_nodes) or any(
            producer.id == callable_id for producer, _ in self.eager_outputs
        )

    def backward_may_run(self) -> bool:
        """``pending_backward``, brought up to date and returned: whether a backward of this
        generation may still run, so that the generation cannot end yet (Note [A backward
        that can no longer run]).

        It stays set only while something the forwards produced is still referenced: a held
        output, or graph memory that autograd saved for the backward."""
        if not self.pending_backward:
            return False
        forwards = [node.recording for node in self.replayed_nodes if node.phase is Phase.FORWARD]
        for recording in forwards:
            # The recording itself must not keep the autograd graph alive: outputs with
            # history are held weakly from now on, as after any generation.
            if not recording.autograd_outputs_found:
                recording.find_outputs_autograd_took()
        referenced = any(recording.memory_referenced() for recording in forwards) or any(
            producer.phase is Phase.FORWARD and any(ref() is not None for ref in refs)
            for producer, refs in self.eager_outputs
        )
        self.pending_backward = referenced
        return referenced

    def take_handed_out(self) -> HandedOut:
        """What was handed out so far, each node once, for retiring; the generation keeps
        noting from empty."""
        nodes = list(dict.fromkeys(self.replayed_nodes))
        taken = HandedOut(nodes, self.eager_outputs, self.written, self.carried)
        self.replayed_nodes, self.eager_outputs, self.written, self.carried = [], [], [], []
        return taken
