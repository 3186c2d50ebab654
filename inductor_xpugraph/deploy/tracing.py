"""How a function becomes the graph an export compiles: traced with fake tensors, its tensor
constants made inputs.

``standalone_compile`` wants a graph whose placeholders carry fake values with a shape
environment, and makes every tensor constant of it an input the caller would not know of.
So ``export`` traces the function with fake tensors (a function that reads a tensor it was
not given, a weight in a closure, fails there and is refused with a message saying to pass
it), and lifts each constant (a tensor the function made, a weight of a graph traced with
real tensors) to a static input after the caller's; ``load`` passes their saved values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def traced_with_fake_tensors(fn: Callable[..., Any], example_inputs: list[Any]):
    """``fn`` as a graph traced with fake tensors: ``standalone_compile`` finds its shape
    environment there, and without one torch 2.15 bypasses the cache its artifact is made
    from ("CompiledArtifact has no artifact to serialize"). A graph module that already
    carries fake values with a shape environment (Dynamo's, ``make_fx(...,
    tracing_mode="fake"/"symbolic")``) is kept as it is (``export`` then specializes it on
    the example inputs); one traced with real tensors carries fake values without one, and
    is traced again."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import make_fx

    if isinstance(fn, torch.fx.GraphModule) and any(
        isinstance(node.meta.get("val"), FakeTensor)
        and node.meta["val"].fake_mode.shape_env is not None
        for node in fn.graph.nodes
        if node.op == "placeholder"
    ):
        gm = fn
    else:
        try:
            gm = make_fx(fn, tracing_mode="fake")(*example_inputs)
        except NotImplementedError as error:
            if "argument of type" not in str(error):
                raise
            # fx met an object it cannot put in a graph: a returned cache object, typically
            raise ValueError(
                f"inductor_xpugraph.export: fn returns or builds something that is not a "
                f"tensor ({error}). An export returns tensors (one, or a tuple, list or dict of "
                f"them): return those you need, e.g. out.last_hidden_state, or, for a Hugging "
                f"Face model, call it with use_cache=False so that it returns no cache object."
            ) from error
        except Exception as error:
            if "FakeTensor" not in str(error):
                raise
            reason = "reads a tensor that is not one of its inputs (a weight?)"
            raise ValueError(_WEIGHTS_AS_INPUTS.format(reason=reason)) from error
    return gm


def lift_tensor_constants(
    gm: torch.fx.GraphModule,
) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """``gm`` (a copy, where it has any) with each tensor constant (a tensor the function
    made, such as ``torch.tensor(-1e4)``, or a weight of a graph traced with real tensors)
    made an input after the others, and their values in that order.

    ``standalone_compile`` makes them inputs of the artifact anyway, so that a loaded export
    would fail on its caller's arguments; here they are saved with the export and ``load``
    passes them (at fixed addresses: captured in place, never copied)."""
    from torch._guards import detect_fake_mode

    found = [
        node
        for node in gm.graph.nodes
        if node.op == "get_attr" and isinstance(getattr(gm, node.target, None), torch.Tensor)
    ]
    if not found:
        return gm, []
    graph, copied = torch.fx.Graph(), {}
    graph.output(graph.graph_copy(gm.graph, copied))
    owner, gm = (
        gm,
        torch.fx.GraphModule(gm, graph),
    )  # the caller's module stays as it was
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    fake_mode = detect_fake_mode([node.meta.get("val") for node in placeholders])
    constants = [getattr(owner, node.target).detach() for node in found]
    last = placeholders[-1] if placeholders else None
    for index, (original, value) in enumerate(zip(found, constants)):
        node = copied[original]
        with graph.inserting_after(last) if last else graph.inserting_before(node):
            lifted = graph.placeholder(f"constant_{index}")
        lifted.meta = dict(node.meta)
        if fake_mode is not None:
            lifted.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
        node.replace_all_uses_with(lifted)
        graph.erase_node(node)
        delattr(gm, node.target)
        last = lifted
    gm.recompile()
    return gm, constants


_WEIGHTS_AS_INPUTS = (
    "inductor_xpugraph.export: fn {reason}. An export takes every tensor it reads as an input: "
    "pass the weights in example_inputs (and to the loaded function), e.g. "
    "torch.func.functional_call(model, params, (x,)) with params among the inputs, and name "
    "their positions in static_inputs so that graphs read them in place."
)
