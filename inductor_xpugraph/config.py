"""Settings of inductor_xpugraph (a torch ConfigModule).

Every value can be set in code (``inductor_xpugraph.config.warmup_runs = 2``), patched
(``with inductor_xpugraph.config.patch(warmup_runs=2): ...``) or given from the environment
with the variable named next to it (booleans as 1/0, true/false, yes/no, on/off). Each value
is checked wherever it comes from: a bad one set in code raises ValueError naming the setting
and what it accepts, and changes nothing; a bad one from the environment is warned about at
import and ignored, the setting keeping its default (``_settings``). The whole module is
registered as Inductor's per-device codegen config, so it is part of the FX graph cache key:
changing a value never returns a wrapper that was generated under another value.
"""

import sys

from torch.utils._config_module import install_config_module

from ._settings import checked_config_class as _checked_config_class
from ._settings import from_environment as _from_environment

# Only settings below: install_config_module turns every other module-level value into one.

# Eager runs of a callable before it is captured. The first call autotunes and lazily
# initialises kernels and library handles; none of that may happen inside a capture.
# This, the thrash guard's and the size settings below are read when a graph is compiled, on
# the compiling thread, and baked into its graphify(...) call (trees.recording_policy, which
# also reads upstream's triton.skip_cudagraph_warmup, force_cudagraphs_warmup,
# cudagraph_capture_sizes and cudagraph_dynamic_shape_rerecord_limit / _warn_limit).
warmup_runs: int = _from_environment("warmup_runs", "INDUCTOR_XPUGRAPH_WARMUP_RUNS", 1)

# Thrash guard: a callable that would record again more than ``rerecord_limit`` times within
# ``rerecord_window`` generations runs un-graphed from then on: recording that often costs
# more than replaying saves. Recording again: for addresses of its static inputs no kept
# recording has (a parameter, buffer or KV cache moved, or came back after the bound on
# variants dropped its recording), or below a dropped variant of a graph before it
# (trees.recording_policy). An input re-created once per request (``generate`` allocates a
# new static KV cache per call) records once per request and stays graphed.
rerecord_limit: int = _from_environment("rerecord_limit", "INDUCTOR_XPUGRAPH_RERECORD_LIMIT", 8)
rerecord_window: int = _from_environment("rerecord_window", "INDUCTOR_XPUGRAPH_RERECORD_WINDOW", 64)

# Recordings kept per callable and place in the tree for different addresses of its static
# inputs (parameters, buffers, ``mark_static_address`` tensors such as a KV cache): when a set
# of addresses comes back, its recording replays. Past this many, the least recently used one
# is dropped, with the recordings below it. Recording those again counts toward
# ``rerecord_limit``.
static_input_variants: int = _from_environment(
    "static_input_variants", "INDUCTOR_XPUGRAPH_STATIC_INPUT_VARIANTS", 4
)

# One recording is kept per distinct set of integer (symbolic size) inputs. Past this many
# a warning is logged once; with ``skip_dynamic_graphs`` further sizes run un-graphed instead.
dynamic_shape_warn_limit: int = _from_environment(
    "dynamic_shape_warn_limit", "INDUCTOR_XPUGRAPH_DYNAMIC_SHAPE_WARN_LIMIT", 8
)
skip_dynamic_graphs: bool = _from_environment(
    "skip_dynamic_graphs", "INDUCTOR_XPUGRAPH_SKIP_DYNAMIC_GRAPHS", False
)

# When a step ends, outputs of its forward and inference graphs that the caller still holds
# are copied out of the pool and keep their values (one device copy per output kept), instead
# of raising the stale-output error when read (upstream's
# ``triton.cudagraph_trees_generation_cloning = "user_visible"``, torch >= 2.15, does the same
# here). Gradients are always kept this way. Read when a graph is compiled.
generation_cloning: bool = _from_environment(
    "generation_cloning", "INDUCTOR_XPUGRAPH_GENERATION_CLONING", False
)

# A parameter or other static input a graph only reads, whose memory moves under it (the same
# storage at a new address: FSDP2 frees each layer's gathered parameters after use and gathers
# them again at the next step), is copied into the graph at each replay, like any other input,
# instead of being recorded again at nearly every step (trees.inputs). False: such moves are
# recorded as variants, and the thrash guard counts them. Read when a graph is compiled.
copy_moving_inputs: bool = _from_environment(
    "copy_moving_inputs", "INDUCTOR_XPUGRAPH_COPY_MOVING_INPUTS", True
)

# A recording keeps the memory of the state it writes (a cache's tensors) after the caller
# drops that state, so that the next request's state, laid out the same, moves in (one device
# copy) and the recording replays, instead of a new capture per request (trees.recorded_state).
# It costs one state's memory between requests, and a second while the next request's state
# is made. False: that memory is freed with the state, and new state is recorded again. Read
# when a graph is compiled.
keep_state_memory: bool = _from_environment(
    "keep_state_memory", "INDUCTOR_XPUGRAPH_KEEP_STATE_MEMORY", True
)

# An input that another graph produced (an output of an earlier graph of the step) is not
# copied: the recording bakes in its address. After it moved this many times at one place in
# the tree (0: never), the callable's recordings there either copy it, like any other input
# ("copy"), or the callable runs un-graphed there ("skip"). Upstream's
# ``triton.cudagraph_managed_input_rerecord_limit`` and ``_action`` (torch >= 2.15), with the
# same defaults, replace them where set. Read when a graph is compiled.
managed_input_rerecord_limit: int = _from_environment(
    "managed_input_rerecord_limit", "INDUCTOR_XPUGRAPH_MANAGED_INPUT_RERECORD_LIMIT", 5
)
managed_input_rerecord_action: str = _from_environment(
    "managed_input_rerecord_action", "INDUCTOR_XPUGRAPH_MANAGED_INPUT_RERECORD_ACTION", "copy"
)

# GiB the device's graph pool reserves when it is made (0: none): one large segment that the
# recordings carve up, instead of segments added one at a time as graphs are recorded (less
# fragmentation). Upstream's ``triton.cudagraph_initial_mempool_allocation_gb`` (torch >= 2.15)
# replaces it where set. A device whose allocator cannot place memory in a pool outside a
# capture says once that it has no effect there. Read when a graph is compiled; the callable
# that first records or warms up in a new pool decides.
initial_pool_allocation_gb: float = _from_environment(
    "initial_pool_allocation_gb", "INDUCTOR_XPUGRAPH_INITIAL_POOL_ALLOCATION_GB", 0.0
)

# A step that cannot end, because outputs the caller keeps may still be backpropagated,
# records each call of a graph below the last (an evaluation loop without torch.no_grad()
# that keeps its outputs). Once a graph has this many recordings on the current path, its
# further calls in that step run un-graphed instead: the tree stops growing. A model that
# calls one graph more often per step (layers sharing compiled code) needs a higher value.
pending_backward_records_limit: int = _from_environment(
    "pending_backward_records_limit", "INDUCTOR_XPUGRAPH_PENDING_BACKWARD_RECORDS_LIMIT", 64
)

# Where the backend's allocator can checkpoint a pool (cuda; xpu where torch has the
# ``_xpu_*`` checkpoint bindings, torch 2.15), let sibling branches of a tree share memory
# (trees.memory.CheckpointedPool). False keeps every graph's outputs allocated for its whole
# life ("owned outputs"): the portable strategy, the one on xpu without those bindings; turn
# this off to measure it. Read when a device's tree is created or reset.
allocator_checkpointing: bool = _from_environment(
    "allocator_checkpointing", "INDUCTOR_XPUGRAPH_ALLOCATOR_CHECKPOINTING", True
)

# A capture that fails (a device that cannot record an op the code runs, such as an Intel
# GPU's SYCL Graph refusing a fused attention kernel) never fails the call: that call runs
# un-graphed with its own arguments, the callable runs un-graphed from then on, and the
# device's message is logged once and counted (``stats()``'s "capture_failures"). True gives
# the caller the capture's error instead (the callable still runs un-graphed after it).
capture_failure_raises: bool = _from_environment(
    "capture_failure_raises", "INDUCTOR_XPUGRAPH_CAPTURE_FAILURE_RAISES", False
)

# Operators never captured, on every device, in addition to the device's own list of what its
# graphs cannot record (``trees.backends.unrecordable_ops``): Inductor partitions the graph
# around them, so the rest is still graphed. Names as Inductor's
# ``custom_should_partition_ops`` takes them: "namespace::op" or "namespace::op.overload"; the
# environment variable takes a comma-separated list.
never_capture_ops: tuple = _from_environment(
    "never_capture_ops", "INDUCTOR_XPUGRAPH_NEVER_CAPTURE_OPS", ()
)
# Operators of a device's own do-not-capture list that are captured anyway: where a newer
# driver records them (``python -m inductor_xpugraph doctor`` tries each on this machine).
allow_capture_ops: tuple = _from_environment(
    "allow_capture_ops", "INDUCTOR_XPUGRAPH_ALLOW_CAPTURE_OPS", ()
)

# Check, around every call of a graph loaded while this is on, that no output the caller
# still holds from earlier in the step changed (trees.debug_checks): costs a copy and a
# comparison per live output per call. For debugging suspected corruption, off by default.
debug_checks: bool = _from_environment("debug_checks", "INDUCTOR_XPUGRAPH_DEBUG_CHECKS", False)

# Set by ``deploy.export(..., static_inputs=...)`` while it compiles, never by hand: positions
# of the exported function's inputs that keep their address from call to call (weights passed
# as inputs), captured without a copy like a compiled module's parameters. A setting so that
# it is part of the cache key: an export never gets a wrapper generated without it.
_export_static_inputs: tuple = ()

# The graph class of the xpu backend: "xpu" is torch.xpu.XPUGraph (torch >= 2.11); "accelerator"
# is torch.accelerator.Graph (torch >= 2.13; trees.backends.accelerator_graphs), the class a
# PrivateUse1 device always uses. cuda always uses torch.cuda.CUDAGraph. Read when a device's
# tree is created.
xpu_graph_api: str = _from_environment("xpu_graph_api", "INDUCTOR_XPUGRAPH_XPU_GRAPH_API", "xpu")

# How torch's XPUGraph records on the xpu devices of this process, which decides what the xpu
# do-not-capture list holds (trees.backends.xpu_recording): "auto" as found on the running
# torch (what the build settles, else a probe capture on the device, once per process, else
# the release's rule: torch >= 2.14 natively through Level Zero except on Data Center GPU
# Max), or "command-buffer" / "native" where you know better. Read at each compile.
xpu_recording: str = _from_environment("xpu_recording", "INDUCTOR_XPUGRAPH_XPU_RECORDING", "auto")

install_config_module(sys.modules[__name__])
_checked_config_class(sys.modules[__name__])
