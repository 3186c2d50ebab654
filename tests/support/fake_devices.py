"""Generate the real Inductor wrapper source for "xpu" and "cuda" on a CPU-only machine.

Inductor writes the Python wrapper module of a compiled graph without touching the device:
lowering, scheduling and kernel codegen only need device *descriptions*. So, on the CPU build of
torch, we compile an FX graph of fake "xpu"/"cuda" tensors (``FakeTensorMode``) with
``compile_fx`` after a handful of targeted patches of private torch APIs:

1. a fake ``DeviceInterface`` for the device (available, one device, H100-like properties,
   Triton-capable), registered with ``register_interface_for_device``;
2. ``torch._inductor.scheduler.has_triton`` -> True (Triton itself is not installed: codegen
   only writes Triton source, it never imports ``triton``);
3. cuda only: ``torch.cuda.get_device_properties/get_device_capability/current_device/
   device_count``, which Inductor calls directly rather than through the interface;
4. ``torch.utils._triton.triton_hash_with_backend`` -> a fixed hash (PyTorch's own
   test_triton_extension_backend.py mocks the same function);
5. ``torch._inductor.fx_passes.joint_graph.lazy_init`` -> no-op (it traces pattern-matcher
   replacements on the fake device, which needs real kernels).

The generated module is never imported or executed (it imports ``triton``): the
``GraphLowering.save_output_code`` hook (what ``torch._inductor.utils.run_and_get_code`` uses)
keeps the source and raises a sentinel that stops the compilation right there.

The patches are process-wide and irreversible, so every generation runs in a fresh process
(``fresh_processes``: forked from a server that imported torch and Inductor, and nothing
else). ``PRIVATE_TORCH_APIS`` lists what is patched, for the canary test that fails loudly
when a torch upgrade moves one of them.
Only inference graphs can be generated this way: fake accelerator tensors with
``requires_grad`` abort the process.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch._dynamo import device_interface

from .fresh_processes import fork_server

REPO_ROOT = Path(__file__).resolve().parents[2]

# Every private torch API (and config entry) this harness patches or relies on.
PRIVATE_TORCH_APIS = (
    "torch._dynamo.device_interface.DeviceInterface",
    "torch._dynamo.device_interface.get_interface_for_device",
    "torch._dynamo.device_interface.register_interface_for_device",
    "torch._inductor.scheduler.has_triton",
    "torch.utils._triton.triton_hash_with_backend",
    "torch._inductor.fx_passes.joint_graph.lazy_init",
    "torch._inductor.graph.GraphLowering.save_output_code",
    "torch._inductor.exc.InductorError",
    "torch._inductor.compile_fx.compile_fx",
    "torch._inductor.config.force_disable_caches",
    "torch._inductor.config.graph_partition",
    "torch._inductor.config.triton.cudagraphs",
)

# torch.cuda functions replaced on "cuda" (Inductor calls them directly).
PATCHED_CUDA_FUNCTIONS = (
    "get_device_properties",
    "get_device_capability",
    "current_device",
    "device_count",
)


def generate_wrapper_source(
    device: str,
    *,
    partition: bool,
    extension_devices: tuple[str, ...],
    static: bool = False,
    attention: bool = False,
    never_capture_ops: tuple[str, ...] = (),
    inductor_settings: tuple[tuple[str, object], ...] = (),
    unbacked: bool = False,
    xpu_recording: str = "command-buffer",
) -> str:
    """Return the Python wrapper source Inductor generates for a small graph on `device`.

    `device` is "xpu" or "cuda". ``triton.cudagraphs`` is on (what ``mode="reduce-overhead"``
    does). `partition=True` compiles a graph with a CPU matmul in the middle, with
    ``graph_partition`` on (the default): ``def partition_0``, ``def partition_1`` and
    ``Runner(partitions=[partition_0, partition_1])``. `partition=False` compiles
    ``(x @ w).relu() + 1`` with ``graph_partition`` off, which gives a plain ``def call(args)``
    (with cudagraphs and ``graph_partition`` on, even a graph without CPU ops becomes
    ``partition_0`` inside a ``Runner``). ``inductor_xpugraph.enable(d)`` is called for each d in
    `extension_devices`; an empty tuple gives stock Inductor. `static=True` compiles
    ``(x @ w).relu() + v`` instead, ``w`` and ``v`` static inputs (as an export names them),
    ``v`` a view that starts 4 bytes into its storage. `attention=True` (with `partition`)
    compiles ``flash_attention(q.relu(), k, v) + 1`` (a module's ``forward``) through
    ``aten._scaled_dot_product_flash_attention``, what ``F.scaled_dot_product_attention`` runs
    on xpu when training (the CPU build cannot pick a kernel for a fake device, so the test
    names the op). `unbacked=True` (with `partition`) compiles ``(x @ w).relu()`` and a
    tensor sized by ``xpugraph_tests::count_positive``, a custom op that returns a
    data-dependent (unbacked) size. `never_capture_ops` and `xpu_recording` (how the fake xpu
    device records, which decides its do-not-capture list: command buffers by default, whatever
    the installed torch) are set in ``inductor_xpugraph.config``;
    `inductor_settings`, (name, value) pairs, in Inductor's config. Runs in a fresh process
    (``fresh_processes``).
    """
    options = dict(
        partition=partition,
        extension_devices=extension_devices,
        static=static,
        attention=attention,
        never_capture_ops=never_capture_ops,
        inductor_settings=inductor_settings,
        unbacked=unbacked,
        xpu_recording=xpu_recording,
    )
    with (
        tempfile.TemporaryDirectory(prefix="fake-device-codegen-") as tmp,
        concurrent.futures.ProcessPoolExecutor(1, mp_context=fork_server()) as child,
    ):
        try:
            return child.submit(_generate, device, tmp, **options).result()
        except Exception as error:
            raise RuntimeError(f"wrapper generation failed for {device}, {options}") from error


# ---------------------------------------------------------------------------------------------
# Everything below runs in the subprocess (the canary test also reads the fake's member names).


class FakeDeviceProperties:
    """H100-like; these fields end up in the ``DeviceProperties(...)`` of every Triton kernel."""

    name = "Fake H100 (inductor_xpugraph tests)"  # torch 2.15 reads it on "cuda"
    major = 9
    multi_processor_count = 132  # xpu reads it too, before its own gpu_subslice_count
    max_threads_per_multi_processor = 2048
    regs_per_multiprocessor = 65536
    warp_size = 32
    # CacheBase.get_system reads this on "cuda": the CPU build has no torch.version.cuda, so it
    # takes the ROCm branch.
    gcnArchName = "fake"


def _fake_properties(device=None) -> FakeDeviceProperties:
    return FakeDeviceProperties()


class FakeDeviceInterface(device_interface.DeviceInterface):
    """One available, Triton-capable device, index 0, that is never touched."""

    class Worker:
        current_device = staticmethod(lambda: 0)
        # DeviceInterface.get_device_properties delegates here.
        get_device_properties = staticmethod(_fake_properties)

    is_available = staticmethod(lambda: True)
    device_count = staticmethod(lambda: 1)
    current_device = staticmethod(lambda: 0)
    get_compute_capability = staticmethod(lambda device=None: 90)
    is_triton_capable = staticmethod(lambda device=None: True)
    raise_if_triton_unavailable = staticmethod(lambda device=None: None)


def _install_fake_device(device: str) -> None:
    """Make Inductor believe that `device` is present (patches 1 and 3)."""
    # The first lookup registers the defaults, which would overwrite ours: trigger it first.
    device_interface.get_interface_for_device("cpu")
    device_interface.register_interface_for_device(device, FakeDeviceInterface)
    if device == "cuda":
        torch.cuda.get_device_properties = _fake_properties
        torch.cuda.get_device_capability = lambda device=None: (9, 0)
        torch.cuda.current_device = lambda: 0
        torch.cuda.device_count = lambda: 1


def _install_codegen_patches() -> None:
    """Let Inductor emit Triton kernels without Triton and without pattern-matcher tracing."""
    import torch._inductor.fx_passes.joint_graph
    import torch._inductor.scheduler
    import torch.utils._triton

    torch._inductor.scheduler.has_triton = lambda *args, **kwargs: True  # 2.15: include_cpu
    torch.utils._triton.triton_hash_with_backend = lambda: "FAKE" * 16
    torch._inductor.fx_passes.joint_graph.lazy_init = lambda *args, **kwargs: None


class _SourceCaptured(Exception):
    """Raised from the save_output_code hook to stop before the module is imported."""


def _define_count_positive() -> Any:
    """A custom op that returns a data-dependent size (an unbacked SymInt when traced)."""

    @torch.library.custom_op("xpugraph_tests::count_positive", mutates_args=())
    def count_positive(x: torch.Tensor) -> int:
        return int((x > 0).sum())

    @count_positive.register_fake
    def _(x):
        return torch.library.get_ctx().new_dynamic_size()

    return count_positive


def _capture_wrapper_source(
    device: str, partition: bool, static: bool, attention: bool, unbacked: bool = False
) -> str:
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.exc import InductorError
    from torch._inductor.graph import GraphLowering
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    def matmul_relu_add(x, w):
        return (x @ w).relu() + 1

    def with_cpu_matmul(x, w):
        # A CPU extern kernel, not a CPU pointwise op: that one would be a C++ kernel, compiled
        # with the C++ compiler during codegen (~12 s).
        y = (x @ w).relu()
        on_cpu = y.cpu()
        return (on_cpu @ on_cpu).to(y.device) + 1

    def matmul_relu_add_static(x, w, v):
        return (x @ w).relu() + v

    def sized_by_a_custom_op(x, w):
        y = (x @ w).relu()
        n = torch.ops.xpugraph_tests.count_positive(y)
        torch._check(n <= 64)
        return y * 2, torch.zeros(n, device=y.device) + 3

    class FlashAttention(torch.nn.Module):
        def forward(self, q, k, v):
            out = torch.ops.aten._scaled_dot_product_flash_attention(q.relu(), k, v)[0]
            return out + 1

    sources = []

    def save_output_code(code: str) -> None:
        sources.append(code)
        raise _SourceCaptured

    GraphLowering.save_output_code = save_output_code
    fn = with_cpu_matmul if partition else matmul_relu_add
    if unbacked:
        _define_count_positive()
        fn = sized_by_a_custom_op
    static_inputs = contextlib.nullcontext()
    # A data-dependent size needs a shape environment to live in.
    with FakeTensorMode(shape_env=ShapeEnv() if unbacked else None):
        inputs = [torch.randn(8, 8, device=device), torch.randn(8, 8, device=device)]
        if attention:
            fn = FlashAttention()
            shape = (2, 4, 16, 64)
            inputs = [torch.randn(shape, device=device, dtype=torch.float16) for _ in range(3)]
        if static:
            import inductor_xpugraph

            fn = matmul_relu_add_static
            inputs.append(torch.randn(65, device=device).as_strided((8, 8), (8, 1), 1))
            static_inputs = inductor_xpugraph.config.patch(_export_static_inputs=(1, 2))
        try:
            with static_inputs:
                # Stack traces (of frames named forward) give the wrapper the op's source
                # line, as Dynamo's would.
                compile_fx(make_fx(fn, record_stack_traces=attention)(*inputs), inputs)
        except InductorError as error:
            if not isinstance(error.inner_exception, _SourceCaptured):
                raise
    if len(sources) != 1:
        raise RuntimeError(f"expected one wrapper module, Inductor produced {len(sources)}")
    return sources[0]


def _generate(
    device: str,
    tmp: str,
    *,
    partition: bool,
    extension_devices: tuple[str, ...],
    static: bool,
    attention: bool,
    never_capture_ops: tuple[str, ...],
    inductor_settings: tuple[tuple[str, object], ...],
    unbacked: bool,
    xpu_recording: str,
) -> str:
    """``generate_wrapper_source``, in the fresh process."""
    # force_disable_caches still writes kernels to a fresh dir under the cache dir.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor-cache")
    sys.path.insert(0, str(REPO_ROOT))
    _install_fake_device(device)
    _install_codegen_patches()

    import torch._inductor.config as inductor_config

    inductor_config.force_disable_caches = True
    inductor_config.triton.cudagraphs = True
    inductor_config.graph_partition = partition
    for name, value in inductor_settings:
        owner, _, leaf = name.rpartition(".")  # "triton.x" is inductor_config.triton.x
        setattr(getattr(inductor_config, owner) if owner else inductor_config, leaf, value)

    if extension_devices or never_capture_ops:
        import inductor_xpugraph

        for extension_device in extension_devices:
            inductor_xpugraph.enable(extension_device)
        inductor_xpugraph.config.never_capture_ops = tuple(never_capture_ops)
        inductor_xpugraph.config.xpu_recording = xpu_recording

    return _capture_wrapper_source(device, partition, static, attention, unbacked)
