"""Everything the tree runtime tells users, in one place (as upstream keeps its wording in
``cudagraph_utils``): why a graph is not captured (skip), why a callable runs un-graphed from
now on (fallback), why it recorded again (re-record), why a step left the tree (liveness
fallback), when a tree changes its memory strategy, and the stale-output errors.

Each reason says what happened, to which input (named by ``inputs.InputNames.describe``:
placeholder, module, source line) and what the user can do; the graph's name and source line
are added by ``stats.Event.line``. Tests and ``report()`` match these texts. Why codegen
leaves a whole graph un-captured is said where it decides, in ``codegen.eligibility``.
"""

from __future__ import annotations

import functools

from .. import config
from .failed_operator import FailedOperator

# -- events (stats.record_event / record_skip) -----------------------------------------------


def rerecord(what_changed: str) -> str:
    return f"{what_changed}; recording a variant"


def moving_inputs_copied(inputs: str) -> str:
    """``inputs``, static, are in memory that moved under their tensors (FSDP2)."""
    return (
        f"{inputs} moved in place (the same storage at a new address, as FSDP2 gathers "
        "parameters): copied into the graph at each replay from now on"
    )


def settled_inputs_read_in_place(inputs: str) -> str:
    """``inputs``, copied because their memory moved, stayed put over the last replays."""
    return (
        f"{inputs}, copied since their memory moved, stayed at one address for the last "
        "replays: read where they lie from now on, copying nothing"
    )


# Why a recording copies memory that moves under its tensor (``Recording.why_copied``, in
# ``report()``): it moved after the record, or again after it settled (copied for good); it
# settled, but this graph cannot be replaced (copied for good); or it is still watched.
MOVED_AFTER_RECORD = "moved after this graph was recorded"
MOVED_AFTER_SETTLING = "moved again after it had settled"
SETTLED_MOVED_AGAIN = "settled, then seen elsewhere before this graph could be replaced"
SETTLED_NO_CAPTURE = "settled, but no capture could replace this graph where it is"


def copies_until_settled(replays: int) -> str:
    return f"read in place if it stays put for {replays} replays from the record"


def managed_inputs_copied(inputs: str, limit: int) -> str:
    """``inputs``, outputs of earlier graphs, moved ``limit`` times at this place."""
    return (
        f"{inputs}, produced by an earlier graph, moved {limit} times here: copied from now on "
        "(managed_input_rerecord_action='copy')"
    )


def managed_inputs_skip(inputs: str, limit: int) -> str:
    return (
        f"{inputs}, produced by an earlier graph, moved {limit} times here: this graph runs "
        "un-graphed after that graph from now on (managed_input_rerecord_action='skip'; "
        "upstream's triton.cudagraph_managed_input_rerecord_limit)"
    )


def moved_and_replaced(moved: str | None, replaced: str | None) -> str:
    """``moved``/``replaced``: the inputs with new addresses, the object inputs that are other
    objects than at capture (each as ``InputNames.describe`` words them), or None."""
    parts = [f"{moved} moved (new addresses)"] if moved else []
    if replaced:
        parts.append(f"{replaced} are other objects than at capture")
    return "; ".join(parts)


def fallback_for_moving_inputs(
    moved: str, holders: str | None, generations: int, limit: int, limits: str
) -> str:
    """``moved``: the inputs at addresses never seen (``InputNames.describe``); ``holders``:
    who holds the first of them when it is state the graph writes (``describe_holders``),
    else None. ``limits``: the thrash guard's, named as the user sets them."""
    if holders is not None:
        fix = (
            f"the tensors it writes are new at each call ({holders}): pass one such object to "
            "every call and reset it between requests (for Hugging Face generate, one "
            "StaticCache as past_key_values)"
        )
    else:
        fix = (
            "parameters, buffers or static-address inputs are new tensors at each call: "
            "update them in place (copy_, load_state_dict) instead"
        )
    return (
        f"recorded again {limit} times within {generations} generations ({moved} at new "
        f"addresses); un-graphed from now on.\n  Fix: {fix}; or raise {limits}"
    )


def fallback_for_evicted_rerecords(generations: int, limit: int, limits: str) -> str:
    return (
        f"recorded again {limit} times within {generations} generations and "
        f"would once more, now what it had recorded before and dropped to keep at most "
        f"{config.static_input_variants} variants (its static inputs, or those of a graph "
        f"before it, cycle through more address sets than are kept); running it un-graphed "
        f"from now on (limits: inductor_xpugraph.config.static_input_variants="
        f"{config.static_input_variants}, {limits})"
    )


def unsafe_mutation(inputs: str) -> str:
    """``inputs``: the written inputs that are new tensors at this call (the first few, and how
    many more); what "new" means and what the next call does is in docs/troubleshooting.md."""
    return (
        f"writes {inputs}, new tensors at this call (not those of the call before, parameters, "
        "buffers or outputs of an earlier graph): a graph writes fixed addresses, so this call "
        "runs un-graphed; pass the same tensors again and it is recorded"
    )


def misaligned_static_inputs(graph: str, inputs: str, alignment: int) -> str:
    return (
        f"inductor_xpugraph: {graph} was called with {inputs} at an address that is not a "
        f"multiple of {alignment} bytes, where Inductor compiled its kernels for an aligned "
        f"tensor (a static input, aligned when it compiled; Inductor does not check static "
        f"inputs at each call). Nothing ran: pass a tensor that starts on a {alignment}-byte "
        f"boundary (a copy, with .clone(), instead of a view at an odd offset)"
    )


def first_line(error: BaseException) -> str:
    """``RuntimeError: <the first line of its message>``, for one-line messages."""
    text = (str(error).splitlines() or [""])[0][:200]
    return f"{type(error).__name__}: {text}"


def capture_failed(
    device: str, error: BaseException, raised: bool, operator: FailedOperator | None = None
) -> str:
    """``operator``: the operator the generated module was running when the capture failed
    (``failed_operator``), None where no operator's line raised."""
    outcome = (
        "the error was raised (config.capture_failure_raises, or upstream's "
        "triton.cudagraph_or_error)"
        if raised
        else "that call ran un-graphed, with its result as without graphs"
    )
    if operator is None:
        way_out = (
            "If an operator of the graph cannot be recorded on this device, list it in "
            "inductor_xpugraph.config.never_capture_ops and the rest of the graph is captured "
            "around it"
        )
    else:
        way_out = (
            f"It failed in {operator.name} (`{operator.line}`): graphs compiled from now on in "
            f"this process partition it out, and keep their graphs around it (this one stays "
            f"un-graphed until it is compiled again). To do so from the first compile, set "
            f"inductor_xpugraph.config.never_capture_ops = ('{operator.name}',) (or "
            f"INDUCTOR_XPUGRAPH_NEVER_CAPTURE_OPS={operator.name})"
        )
    return (
        f"its capture on {device} failed with {first_line(error)}; {outcome}, and it runs "
        f"un-graphed from now on. {way_out}"
    )


def device_cannot_record(device: str, reason: str, step: str | None = None) -> str:
    """``step``: the capture step whose failure left torch in a state no call undoes (None:
    an empty capture failed)."""
    why = f"after a failed {step}: {reason}" if step else f"an empty capture failed with {reason}"
    return (
        f"inductor_xpugraph: {device} cannot record graphs in this process ({why}): every "
        f"compiled graph on {device} runs un-graphed from now on, correct but without the "
        f"speedup of reduce-overhead. `python -m inductor_xpugraph doctor` probes the device "
        f"and says more"
    )


def other_capture_still_running(device: str, seconds: float) -> str:
    return (
        f"inductor_xpugraph: a replay on {device} waited {seconds:g} s for another thread's "
        f"capture on the device to end, and goes ahead (a replay that draws random numbers "
        f"fails while the generator is in capture mode)"
    )


def device_stopped_recording(device: str, reason: str) -> str:
    return f"{device} records no graph in this process ({reason}): it runs un-graphed"


def generator_left_capturing(device: str, error: BaseException) -> str:
    return (
        f"inductor_xpugraph: after a failed capture, the {device} random number generator may "
        f"still be in capture mode (giving it a fresh state failed with {first_line(error)}); "
        f"random ops on {device} may raise until the process restarts"
    )


GENERATOR_NOT_REGISTERED = (
    "it takes a torch.Generator, which torch.accelerator.Graph of this torch cannot register "
    "(no register_generator_state): a graph would replay the same random numbers"
)
HOST_ROUTING_LEFT = (
    "a failed capture left torch's host (pinned memory) allocator routing into the graph's "
    "pool, with a filter that refers to the destroyed graph; no Python call ends it "
    "(XPUGraph, torch >= 2.13)"
)


def warmup_failed_after_capture(device: str, error: BaseException) -> str:
    return (
        f"its warmup on {device}'s capture stream failed after a capture on the device had "
        f"failed ({first_line(error)}): it runs un-graphed from now on"
    )


def queue_left_recording(device: str) -> str:
    return (
        f"a failed capture left a queue of {device} recording, and destroying the graph did "
        f"not end it"
    )


def capture_stream_taken(device: str) -> str:
    return (
        f"inductor_xpugraph: the queue of {device}'s capture stream records into someone "
        f"else's graph (xpu hands out the same 32 queues per priority round-robin); captures "
        f"use another stream from now on"
    )


def recorded_below_itself(recordings: int, stopped: bool) -> str:
    """A step that cannot end: ``recordings`` of the graph on the current path; ``stopped``
    once ``config.pending_backward_records_limit`` is reached."""
    what = (
        "its further calls in this step run un-graphed (config.pending_backward_records_limit)"
        if stopped
        else "every call records a new graph"
    )
    return (
        f"met again below {recordings} recordings of itself in one step: earlier outputs are "
        "still referenced and require grad, so a backward may still read what those calls "
        f"left and the step cannot end; {what}. In an evaluation loop, run under "
        "torch.no_grad() or torch.inference_mode(), or keep only detached outputs; otherwise "
        "call backward(), or inductor_xpugraph.mark_step_begin() before each step (a model "
        "that calls this graph this often per step can ignore this, or raise the limit)"
    )


WARMUP_OUTPUTS_HELD = (
    "runs un-graphed: outputs of an earlier call of this step that ran un-graphed (its warmup, "
    "in the graph pool) are still referenced, and no graph may run over them before the step "
    "ends, which it cannot while they require grad (a backward may still read them). In an "
    "evaluation loop, run under torch.no_grad() or torch.inference_mode(), or keep only "
    "detached outputs; otherwise call backward(), or inductor_xpugraph.mark_step_begin() "
    "before each step"
)


def graphs_invalidated(device: str, reason: str) -> str:
    return (
        f"the {device} graphs recorded so far may not replay again: {reason}; the rest of "
        "this step runs un-graphed, and the tree records its graphs again from the next step on"
    )


def too_many_sizes_skipped(limit: int) -> str:
    return (
        f"more than {limit} distinct sizes and "
        f"config.skip_dynamic_graphs=True; new sizes run un-graphed"
    )


def dynamic_shape_rerecord_limit(limit: int) -> str:
    """Upstream's words (torch 2.15 ``cudagraph_trees.deferred_cudagraphify``)."""
    return (
        f"graph hit cudagraph_dynamic_shape_rerecord_limit={limit}; already-recorded shapes "
        f"still replay, new shapes run eager"
    )


def not_a_capture_size(capture_sizes: tuple) -> str:
    return (
        f"sizes not in torch._inductor.config.triton.cudagraph_capture_sizes={capture_sizes} "
        f"run un-graphed"
    )


LIVENESS_VARIANT = (
    "recorded again without reusing the memory of earlier outputs of its step: its "
    "recording reuses it, and they are still referenced now (keep the same outputs alive in "
    "every step, or clone them, and one recording serves)"
)

LIVENESS_FALLBACK = (
    "captured reusing the memory of earlier outputs of its step that are still referenced "
    "now; the rest of this step runs un-graphed (keep the same outputs alive in every step, "
    "or clone them)"
)

# -- log lines (format strings with %-arguments, for logging) --------------------------------

MANY_SIZES = (
    "inductor_xpugraph: %s has been called with %d distinct sizes; each is warmed up and "
    "recorded on its own and keeps its own graph and memory. Mark the sizes static, pad "
    "inputs, or set inductor_xpugraph.config.skip_dynamic_graphs=True."
)
CAPTURES_OF_A_STEP = (
    "inductor_xpugraph: %s: captured %d graph(s) in %.0f ms during the last step; graph "
    "outputs now hold %.1f MiB of the pool"
)
UNKNOWN_POOL_MEMORY = (
    "inductor_xpugraph: the %s graph pool holds memory that is not an output of the graphs on "
    "the current path (`%s` returned memory allocated outside its capture, or its capture kept "
    "an allocation alive); this tree uses owned outputs instead of allocator checkpointing "
    "from the next step on, and records its graphs again"
)
LENT_MEMORY_CONFLICT = (
    "inductor_xpugraph: a new %s graph below `%s` could be placed in memory that an earlier "
    "graph of this step lent to another branch (owned outputs cannot reserve it again); this "
    "tree records its graphs again from the next step on, without lending memory between "
    "graphs"
)


def overwritten_output(position: int, producer: str, changed_by: str) -> str:
    """``debug_checks`` found a held output changed by a graphed call."""
    return (
        f"inductor_xpugraph debug check: output {position} of `{producer}`, handed out earlier "
        f"in this step and still held, changed while `{changed_by}` ran: graph memory was "
        f"reused under a live tensor. Please report this with the model."
    )


# -- errors raised by a tensor whose graph memory was retired ---------------------------------

STALE_OUTPUT = (
    "inductor_xpugraph: this tensor is an output of a {device} graph (`{name}`) from an "
    "earlier iteration, and its memory has been overwritten by a subsequent run. To keep an "
    "output across calls, clone it (`out.clone()`) before calling the compiled code again; "
    "if the next call starts a new iteration, call inductor_xpugraph.mark_step_begin() (or "
    "torch.compiler.cudagraph_mark_step_begin()) before it. Where a library keeps outputs "
    "across calls for you (Hugging Face generate's hidden states, attentions or logits), "
    "compile with inductor_xpugraph.config.generation_cloning = True "
    "(INDUCTOR_XPUGRAPH_GENERATION_CLONING=1): outputs still held when a step ends are copied "
    "out and stay readable."
)
DROPPED_BY_RESET = (
    "inductor_xpugraph: this tensor is an output of a {device} graph (`{name}`) that "
    "inductor_xpugraph.reset() dropped, with its memory. Clone outputs you keep across a "
    "reset()."
)


@functools.lru_cache(maxsize=1024)
def stale_output(device: str, name: str, source: str | None, dropped_by_reset: bool = False) -> str:
    """``source``: the user's line the graph comes from, where Inductor kept one."""
    template = DROPPED_BY_RESET if dropped_by_reset else STALE_OUTPUT
    return template.format(device=device, name=f"{name}` from `{source}" if source else name)


def stale_state(graph: str, inputs: str, holders: str, caller: str | None) -> str:
    """An output kept as state that could not be kept (Note [Outputs kept as state])."""
    where = f" (called from {caller})" if caller else ""
    return (
        f"inductor_xpugraph: `{graph}`{where} writes {inputs}, {holders}. It was made inside "
        f"compiled code, as an output of a graph of the step before, and that step's end "
        f"overwrote it: the call that started this step did not pass it, so it could not be "
        f"kept as state. It now holds zeros in memory of its own and is kept from here on: "
        f"reset it (a Hugging Face cache: `cache.reset()`) and run the request again. To keep "
        f"its values, make it before the first compiled call (a Hugging Face StaticCache: "
        f"`cache.early_initialization(batch_size=..., num_heads=..., head_dim=..., "
        f"dtype=..., device=...)`, or pass a cache built outside the compiled code)."
    )


CANNOT_RESERVE_POOL = (
    "inductor_xpugraph: initial_pool_allocation_gb (upstream's "
    "triton.cudagraph_initial_mempool_allocation_gb) has no effect on %s: %s. The pool grows "
    "as graphs are recorded"
)
CANNOT_CLONE_OUTPUTS = (
    "inductor_xpugraph: generation_cloning (upstream's triton.cudagraph_trees_generation_cloning) "
    "has no effect on this torch: it cannot copy graph memory out of the pool (torch >= 2.13 "
    "can; on older ones, a C++ compiler builds the extension that does). Outputs kept past "
    "their step raise the stale-output error when read"
)


def upstream_setting_not_applied(name: str, why: str) -> str:
    return f"inductor_xpugraph: torch._inductor.config.triton.{name} has no effect here: {why}"


def skipped_with_or_error(reason: str) -> str:
    """A graph that would run un-graphed, raised (upstream's ``triton.cudagraph_or_error``)."""
    return (
        f"inductor_xpugraph: a graph would run un-graphed, and "
        f"torch._inductor.config.triton.cudagraph_or_error is set: {reason}"
    )


def without_compiled_module(can_swap: bool, can_invalidate: bool) -> str:
    """What running without the package's compiled module costs (``invalidation``): where torch
    swaps storages, a copy; else, with torch's invalidation binding, gradient accumulation."""
    if can_swap:
        return (
            "outputs kept past their step are copied out of the graph pool instead of made "
            "errors (correct, one device copy per kept output and step)"
        )
    if can_invalidate:
        return (
            "gradients kept past their step (accumulation) raise instead of keeping their "
            "values, as with upstream's trees"
        )
    return (
        "an output kept past its step silently holds data the next replays overwrite: clone "
        "outputs you keep"
    )


def compiled_module_building(log_file: str, build_command: str) -> str:
    return (
        f"It is being built in the background for the processes that start after this one "
        f"(log: {log_file}); `{build_command}` builds it in the foreground."
    )
