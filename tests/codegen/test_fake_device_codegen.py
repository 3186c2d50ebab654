"""Real xpu/cuda wrapper source, generated on the CPU with fake devices, graphs the right callables.

Each source comes from a fresh subprocess (see ``fake_devices.py``) and is generated once per
(device, partition, extension) combination: six generations in all, plus one with static inputs
and two of an attention model. The generated code is never executed; its structure is checked
with ``ast`` so that line breaks inside the emitted calls don't matter.
"""

from __future__ import annotations

import ast
import concurrent.futures
import functools
import importlib
import inspect
import re
from typing import Any

import pytest
import torch
from support.fake_devices import (
    PATCHED_CUDA_FUNCTIONS,
    PRIVATE_TORCH_APIS,
    FakeDeviceInterface,
    generate_wrapper_source,
)
from torch._dynamo.device_interface import DeviceInterface

RUNTIME_IMPORT = "import inductor_xpugraph.trees as _graph_trees"
FLASH_ATTENTION = "aten::_scaled_dot_product_flash_attention"
FLASH_ATTENTION_CALL = "torch.ops.aten._scaled_dot_product_flash_attention.default("


@functools.cache
def wrapper_source(device: str, *, partition: bool, extension: bool) -> str:
    return generate_wrapper_source(
        device, partition=partition, extension_devices=(device,) if extension else ()
    )


@functools.cache
def generated(device: str, **options: Any) -> str:
    """``generate_wrapper_source``, once per device and options (all hashable)."""
    return generate_wrapper_source(device, **options)


# Sources single tests read, by what they compile (``generated``'s arguments).
ALIGNED_STATIC = dict(device="cuda", partition=False, extension_devices=("cuda",), static=True)
MIN_PARTITION_100 = dict(
    device="xpu",
    partition=True,
    extension_devices=("xpu",),
    inductor_settings=(("triton.cudagraph_min_partition_size", 100),),
)
SIZED_BY_A_CUSTOM_OP = dict(device="xpu", partition=True, extension_devices=("xpu",), unbacked=True)
SIZED_BY_AN_UNSAFE_OP = dict(
    SIZED_BY_A_CUSTOM_OP,
    inductor_settings=(("cudagraph_unsafe_unbacked_ops", ("xpugraph_tests::count_positive",)),),
)
MM_NEVER_CAPTURED = dict(
    device="xpu", partition=True, extension_devices=("xpu",), never_capture_ops=("aten::mm",)
)


def this_torch_has(options: dict[str, Any]) -> bool:
    """Whether the installed torch has every Inductor setting ``options`` sets."""
    config = torch._inductor.config
    for name, _ in options.get("inductor_settings", ()):
        owner, _, leaf = name.rpartition(".")
        if not hasattr(getattr(config, owner) if owner else config, leaf):
            return False
    return True


@functools.cache
def attention_source(
    device: str,
    extension_devices: tuple[str, ...],
    never: tuple = (),
    xpu_recording: str = "command-buffer",
) -> str:
    return generate_wrapper_source(
        device,
        partition=True,
        extension_devices=extension_devices,
        attention=True,
        never_capture_ops=never,
        xpu_recording=xpu_recording,
    )


@pytest.fixture(scope="module", autouse=True)
def sources_generated_two_at_a_time(request):
    """Each source is a fresh process of 10-25 s on one core: where most of this module runs,
    the common ones are generated two at a time first (CI machines have two cores)."""
    here = request.node.path
    selected = sum(item.path == here for item in request.session.items)
    if selected < 10:
        return
    jobs = [
        functools.partial(wrapper_source, device, partition=partition, extension=extension)
        for device in ("xpu", "cuda")
        for partition in (True, False)
        for extension in (True, False)
    ]
    jobs += [
        functools.partial(attention_source, "xpu", ("xpu",)),
        functools.partial(attention_source, "cuda", ("xpu",), (FLASH_ATTENTION,)),
    ]
    singles = (
        ALIGNED_STATIC,
        MIN_PARTITION_100,
        SIZED_BY_A_CUSTOM_OP,
        SIZED_BY_AN_UNSAFE_OP,
        MM_NEVER_CAPTURED,
    )
    jobs += [functools.partial(generated, **o) for o in singles if this_torch_has(o)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for done in pool.map(lambda job: job(), jobs):
            assert done  # a failed generation raises here, naming its command


def module_statements(source: str) -> list[ast.stmt]:
    return ast.parse(source).body


def last_assignment(source: str, name: str) -> tuple[int, ast.expr]:
    """(statement index, value) of the last module-level ``name = ...``."""
    found = [
        (index, statement.value)
        for index, statement in enumerate(module_statements(source))
        if isinstance(statement, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in statement.targets)
    ]
    assert found, f"the wrapper never assigns `{name}` at module level"
    return found[-1]


def definition_index(source: str, name: str) -> int:
    """Index of the first module-level statement that defines `name` (def, class or assignment)."""
    for index, statement in enumerate(module_statements(source)):
        if isinstance(statement, (ast.FunctionDef, ast.ClassDef)) and statement.name == name:
            return index
        if isinstance(statement, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in statement.targets
        ):
            return index
    raise AssertionError(f"the wrapper never defines `{name}` at module level")


def runtime_import_index(source: str) -> int:
    for index, statement in enumerate(module_statements(source)):
        if isinstance(statement, ast.Import) and any(
            alias.name == "inductor_xpugraph.trees" and alias.asname == "_graph_trees"
            for alias in statement.names
        ):
            return index
    raise AssertionError(f"no module-level `{RUNTIME_IMPORT}` in the wrapper")


def graphified(expression: ast.expr) -> tuple[str, str]:
    """(wrapped name, device) of a ``_graph_trees.graphify(<name>, device=<str>, ...)`` call."""
    source = ast.unparse(expression)
    assert (
        isinstance(expression, ast.Call)
        and ast.unparse(expression.func) == "_graph_trees.graphify"
        and expression.args
        and isinstance(expression.args[0], ast.Name)
    ), f"expected `_graph_trees.graphify(<callable>, ...)`, found `{source}`"
    devices = [k.value for k in expression.keywords if k.arg == "device"]
    assert len(devices) == 1 and isinstance(devices[0], ast.Constant), (
        f"expected a literal device= keyword in `{source}`"
    )
    return expression.args[0].id, devices[0].value


def runner_partitions(source: str) -> tuple[int, list[ast.expr]]:
    """(statement index, elements) of the last ``runner = Runner(partitions=[...])``."""
    index, value = last_assignment(source, "runner")
    assert (
        isinstance(value, ast.Call)
        and ast.unparse(value.func) == "Runner"
        and len(value.keywords) == 1
        and value.keywords[0].arg == "partitions"
        and isinstance(value.keywords[0].value, ast.List)
    ), f"expected `runner = Runner(partitions=[...])`, found `{ast.unparse(value)}`"
    return index, value.keywords[0].value.elts


def partition_names(source: str) -> list[str]:
    return [
        statement.name
        for statement in module_statements(source)
        if isinstance(statement, ast.FunctionDef) and statement.name.startswith("partition_")
    ]


def function_source(source: str, name: str) -> str:
    """The source of the module-level function ``name``, or of ``Runner.<name>``."""
    for statement in module_statements(source):
        if isinstance(statement, ast.ClassDef) and statement.name == "Runner":
            for method in statement.body:
                if isinstance(method, ast.FunctionDef) and f"Runner.{method.name}" == name:
                    return ast.get_source_segment(source, method)
        if isinstance(statement, ast.FunctionDef) and statement.name == name:
            return ast.get_source_segment(source, statement)
    raise AssertionError(f"the wrapper defines no `{name}`")


def test_stock_xpu_wrapper_is_xpu_code_without_graph_trees():
    for partition in (False, True):
        source = wrapper_source("xpu", partition=partition, extension=False)
        assert "empty_strided_xpu((8, 8), (8, 1), torch.float32)" in source
        assert "_graph_trees" not in source


def test_stock_xpu_wrapper_with_a_cpu_op_is_split_into_partitions():
    source = wrapper_source("xpu", partition=True, extension=False)
    _, partitions = runner_partitions(source)

    assert partition_names(source) == ["partition_0", "partition_1"]
    assert [ast.unparse(p) for p in partitions] == ["partition_0", "partition_1"]


def test_stock_xpu_wrapper_without_partitions_defines_a_plain_call():
    source = wrapper_source("xpu", partition=False, extension=False)
    assert isinstance(module_statements(source)[definition_index(source, "call")], ast.FunctionDef)
    assert not partition_names(source)


@pytest.mark.parametrize("device", ["xpu", "cuda"])
@pytest.mark.parametrize("partition", [False, True], ids=["call", "partitions"])
def test_extension_wrapper_compiles_as_python(device, partition):
    source = wrapper_source(device, partition=partition, extension=True)
    compile(source, f"<{device} wrapper>", "exec")


@pytest.mark.parametrize("device", ["xpu", "cuda"])
@pytest.mark.parametrize("partition", [False, True], ids=["call", "partitions"])
def test_extension_wrapper_imports_the_graph_tree_runtime(device, partition):
    source = wrapper_source(device, partition=partition, extension=True)
    assert RUNTIME_IMPORT in source.splitlines()


@pytest.mark.parametrize("device", ["xpu", "cuda"])
@pytest.mark.parametrize("partition", [False, True], ids=["call", "partitions"])
def test_extension_wrapper_still_runs_its_kernels_on_the_device(device, partition):
    source = wrapper_source(device, partition=partition, extension=True)
    stock = wrapper_source(device, partition=partition, extension=False)
    # The device guard is Inductor's choice (torch 2.15 leaves it out for one device): ours
    # keeps whatever the stock wrapper has.
    guard = f"with torch.{device}._DeviceGuard(0):"
    assert (guard in source) == (guard in stock)
    assert f"empty_strided_{device}((8, 8), (8, 1), torch.float32)" in source
    # The stream's name is Inductor's: ``stream0`` on torch 2.11, ``raw_stream0`` on 2.13.
    assert re.search(r"triton_poi_\w+\.run\(.*, stream=(raw_)?stream0\)", source)


@pytest.mark.parametrize("device", ["xpu", "cuda"])
def test_extension_wraps_call_in_graphify_without_partitions(device):
    source = wrapper_source(device, partition=False, extension=True)
    call_index, value = last_assignment(source, "call")

    assert graphified(value) == ("call", f"{device}:0")
    assert definition_index(source, "call") < call_index
    assert runtime_import_index(source) < call_index
    assert not partition_names(source)


def test_extension_names_the_static_inputs_the_kernels_take_as_aligned():
    """Inductor checks no static input's alignment at each call: those aligned when it
    compiled (``w``, not ``v``, a view 4 bytes into its storage) are named for the runtime,
    which checks them on every call that is not a replay."""
    source = generated(**ALIGNED_STATIC)
    _, value = last_assignment(source, "call")
    keywords = {
        k.arg: ast.literal_eval(k.value) for k in value.keywords if k.arg.endswith("inputs")
    }

    assert keywords["static_inputs"] == (1, 2)
    assert keywords["aligned_inputs"] == (1,)
    assert "checked on every call that is not a replay: input 1)" in source


@pytest.mark.parametrize("device", ["xpu", "cuda"])
def test_extension_wraps_each_partition_in_graphify_inside_a_new_runner(device):
    source = wrapper_source(device, partition=True, extension=True)
    runner_index, partitions = runner_partitions(source)
    wrapped = [graphified(partition) for partition in partitions]

    assert partition_names(source) == ["partition_0", "partition_1"]
    assert wrapped == [("partition_0", f"{device}:0"), ("partition_1", f"{device}:0")]
    assert runtime_import_index(source) < runner_index
    assert definition_index(source, "Runner") < runner_index
    for name in ("call", "recursively_apply_fns"):
        index, value = last_assignment(source, name)
        assert index > runner_index and ast.unparse(value) == f"runner.{name}", (
            f"`{name}` must be rebound to the graphified runner, found `{ast.unparse(value)}`"
        )


def test_partitions_below_upstreams_min_partition_size_are_not_graphed():
    """``triton.cudagraph_min_partition_size``: Inductor runs smaller partitions inline in
    ``call``, so the wrapper graphs none of them and says why."""
    if not this_torch_has(MIN_PARTITION_100):
        pytest.skip(f"torch {torch.__version__} has no triton.cudagraph_min_partition_size")
    source = generated(**MIN_PARTITION_100)
    assert "graphify(" not in source
    assert "fewer kernels than triton.cudagraph_min_partition_size (100)" in source


def test_kernels_sized_by_upstreams_unsafe_unbacked_ops_are_not_graphed():
    """``cudagraph_unsafe_unbacked_ops``: Inductor keeps the kernels that use a size such an op
    returned out of the partitions, so the wrapper graphs the partition before it only."""
    if not this_torch_has(SIZED_BY_AN_UNSAFE_OP):
        pytest.skip(f"torch {torch.__version__} has no cudagraph_unsafe_unbacked_ops")
    sources = [generated(**SIZED_BY_A_CUSTOM_OP), generated(**SIZED_BY_AN_UNSAFE_OP)]
    graphed = [[line for line in s.splitlines() if "graphify(" in line] for s in sources]
    assert [len(lines) for lines in graphed] == [2, 1]
    assert "partition_0" in graphed[1][0]


def test_xpu_attention_runs_the_flash_kernel_ungraphed_between_two_graphed_partitions():
    source = attention_source("xpu", ("xpu",))
    _, partitions = runner_partitions(source)
    call = function_source(source, "Runner.call")
    order = [
        call.index(text)
        for text in ("self.partitions[0](", FLASH_ATTENTION_CALL, "self.partitions[1](")
    ]

    assert [graphified(p) for p in partitions] == [
        ("partition_0", "xpu:0"),
        ("partition_1", "xpu:0"),
    ]
    assert order == sorted(order)
    for name in partition_names(source):
        assert FLASH_ATTENTION_CALL not in function_source(source, name)


def test_the_partition_after_xpu_attention_takes_its_output_not_its_tuple():
    """Flash attention returns a tuple (output, log-sum-exp, ...): the indexing that takes
    the output out of it runs in ``call``, so the next partition takes a tensor, which a
    replay copies, not the tuple, which it would bake in and record again for."""
    source = attention_source("xpu", ("xpu",))
    call = function_source(source, "Runner.call")
    (line,) = [line for line in call.splitlines() if FLASH_ATTENTION_CALL in line]
    kernel = line.split("=")[0].strip()

    assert f"{kernel}[0]" in call
    for name in partition_names(source):
        assert f"{kernel}[" not in function_source(source, name)


def test_xpu_attention_is_graphed_where_the_device_records_natively():
    """Native recording (torch >= 2.14 off Data Center GPU Max) records the flash kernels'
    work-group scratch memory: nothing is partitioned out, and no graph is lost."""
    source = attention_source("xpu", ("xpu",), xpu_recording="native")
    assert "# Not graphed" not in source
    assert "record_skip" not in source
    assert any(
        FLASH_ATTENTION_CALL in function_source(source, name) for name in partition_names(source)
    )


def test_xpu_attention_wrapper_says_which_op_runs_ungraphed_why_and_where():
    source = attention_source("xpu", ("xpu",))
    lines = [line.strip() for line in source.splitlines()]
    (index,) = [i for i, line in enumerate(lines) if FLASH_ATTENTION_CALL in line]
    where = "fake_devices.py:"  # the line of FlashAttention.forward that calls the op
    why = f"{FLASH_ATTENTION} is not captured on xpu: its sycl-tla flash-attention kernels"

    assert lines[index - 1].startswith("# Not graphed (") and where in lines[index - 1]
    assert lines[index - 1].endswith("(intel/torch-xpu-ops#3142)") and why in lines[index - 1]
    assert "# Partitioned out, run un-graphed by `call` between the partitions:" in lines
    (skip,) = [s for s in module_statements(source) if "record_skip" in ast.unparse(s)]
    reason, *_ = skip.value.args
    keywords = {k.arg: ast.literal_eval(k.value) for k in skip.value.keywords}
    assert ast.literal_eval(reason).startswith(why)
    assert keywords["graph"] == "0_inference:call" and where in keywords["source"]


def test_a_listed_op_inductor_cannot_partition_around_keeps_the_graph_uncaptured():
    """``aten::mm`` is an extern kernel, not a fallback kernel: Inductor would capture it with
    the partition it sits in. (The graph's CPU matmul runs un-graphed anyway.)"""
    source = generated(**MM_NEVER_CAPTURED)
    reason = (
        "aten::mm is not captured: listed in inductor_xpugraph.config.never_capture_ops "
        "(Inductor partitions around fallback kernels only, and lowers it otherwise)"
    )

    assert "_graph_trees.graphify(" not in source
    assert f"# NOT captured, runs un-graphed: {reason}" in source.splitlines()


def test_graphs_of_a_device_the_extension_does_not_graph_keep_the_listed_op():
    """Upstream's cuda graphs, with the extension on for xpu only: Inductor's own partitions,
    with ``never_capture_ops`` naming the op, are unchanged."""
    source = attention_source("cuda", ("xpu",), (FLASH_ATTENTION,))

    assert "_graph_trees" not in source
    assert partition_names(source) == ["partition_0"]
    assert FLASH_ATTENTION_CALL in function_source(source, "partition_0")


@pytest.mark.parametrize("partition", [False, True], ids=["call", "partitions"])
def test_extension_keeps_every_module_level_name_of_the_stock_wrapper(partition):
    def module_level_names(source: str) -> set[str]:
        names = set()
        for statement in module_statements(source):
            if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
                names.add(statement.name)
            elif isinstance(statement, ast.Assign):
                names.update(t.id for t in statement.targets if isinstance(t, ast.Name))
        return names

    stock = module_level_names(wrapper_source("xpu", partition=partition, extension=False))
    extended = module_level_names(wrapper_source("xpu", partition=partition, extension=True))

    assert stock - extended == set()
    if partition:
        assert {"runner", "call", "recursively_apply_fns"} <= extended


def _resolve(dotted: str) -> object:
    """Import the longest importable module prefix of `dotted`, then getattr the rest."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute)
        return target
    raise ImportError(dotted)


def test_private_torch_apis_used_by_fake_device_codegen_still_exist():
    missing = []
    for dotted in PRIVATE_TORCH_APIS:
        try:
            _resolve(dotted)
        except (ImportError, AttributeError) as error:
            missing.append(f"{dotted} ({error})")
    missing += [
        f"torch._dynamo.device_interface.DeviceInterface.{name}"
        for name in vars(FakeDeviceInterface)
        if not name.startswith("__") and not hasattr(DeviceInterface, name)
    ]
    missing += [
        f"torch._dynamo.device_interface.DeviceInterface.Worker.{name}"
        for name in vars(FakeDeviceInterface.Worker)
        if not name.startswith("__") and not hasattr(DeviceInterface.Worker, name)
    ]
    missing += [
        f"torch.cuda.{name}" for name in PATCHED_CUDA_FUNCTIONS if not hasattr(torch.cuda, name)
    ]
    assert not missing, (
        "fake-device codegen (tests/support/fake_devices.py) relies on private torch APIs "
        "that are gone in torch " + torch.__version__ + ":\n  " + "\n  ".join(missing)
    )

    def parameters(dotted: str) -> list[str]:
        return list(inspect.signature(_resolve(dotted)).parameters)

    assert parameters("torch._dynamo.device_interface.register_interface_for_device") == [
        "device",
        "device_interface",
    ]
    # torch 2.15 added an optional include_cpu; the fake accepts any arguments.
    assert parameters("torch._inductor.scheduler.has_triton") in ([], ["include_cpu"])
    assert parameters("torch.utils._triton.triton_hash_with_backend") == []
    assert parameters("torch._inductor.fx_passes.joint_graph.lazy_init")[:1] == ["input_device"]
    assert parameters("torch._inductor.compile_fx.compile_fx")[:2] == [
        "model_",
        "example_inputs_",
    ]
    assert "inner_exception" in parameters("torch._inductor.exc.InductorError")
    # A class attribute that Inductor calls with the source when set (None by default).
    assert "save_output_code" in vars(_resolve("torch._inductor.graph.GraphLowering"))
