"""Canary: the private torch APIs the extension itself relies on still exist.

A torch upgrade that moves one of these must fail here, by name, rather than deep inside a
compile or a replay.
"""

import importlib

import pytest
import torch

PRIVATE_APIS = [
    # codegen/registration.py
    "torch._inductor.codegen.common.register_backend_for_device",
    "torch._inductor.codegen.common.register_device_op_overrides",
    "torch._inductor.codegen.common.init_backend_registration",
    "torch._inductor.codegen.common.get_device_op_overrides",
    "torch._inductor.codegen.common.device_codegens",
    "torch._inductor.codegen.common.custom_backend_passes",
    "torch._inductor.codegen.common.custom_backend_codegen_configs",
    "torch._inductor.codegen.common.device_op_overrides_dict",
    "torch._inductor.codegen.cpu_device_op_overrides.CpuDeviceOpOverrides",
    "torch._inductor.codegen.cuda.device_op_overrides.CUDADeviceOpOverrides",
    "torch._inductor.codegen.xpu.device_op_overrides.XPUDeviceOpOverrides",
    # codegen/wrapper.py, eligibility.py, cache_key.py
    "torch._inductor.codegen.wrapper.PythonWrapperCodegen.generate_after_suffix",
    "torch._inductor.codegen.wrapper.PythonWrapperCodegen.create",
    "torch._inductor.utils.count_tangents",
    "torch._inductor.utils.get_first_incompatible_cudagraph_node",
    "torch._inductor.custom_graph_pass.CustomGraphModulePass",
    "torch._guards.TracingContext.try_get",
    "torch._library.fake_class_registry.FakeScriptObject",
    # eligibility.assumed_aligned_inputs: Inductor's own rule for inputs it takes as aligned
    "torch._inductor.utils.is_gpu",
    "torch._inductor.utils.tensor_is_aligned",
    "torch._inductor.utils.maybe_get_suppress_shape_guards_ctx",
    # trees/
    "torch._dynamo.mutation_guard.GenerationTracker",
    "torch._inductor.cudagraph_trees.MarkStepBox",
    "torch._inductor.cudagraph_trees.mark_step_begin",
    "torch._C._stash_obj_in_tls",
    "torch._C._get_obj_in_tls",
    "torch._C._is_key_in_tls",
    "torch.xpu.XPUGraph",
    "torch.xpu.graph_pool_handle",
    "torch.xpu.is_current_stream_capturing",
    "torch._C._xpu_endAllocateToPool",  # backends/device_graphs.py: a failed capture
    "torch._C._xpu_releasePool",
    "torch._C._construct_storage_from_data_pointer",
    "torch._C._storage_Use_Count",
    "torch.UntypedStorage._new_with_weak_ptr",
    "torch._inductor.utils.ALIGNMENT",  # graphed_callable: the static inputs' alignment check
    # trees/source_lines.py: the graph Dynamo is compiling, and the compile a backward is of
    "torch._dynamo.symbolic_convert.tls",
    "torch._guards.CompileContext.current_compile_id",
    # deploy/inputs.py: a loaded export's input check in C++; without it, the check in Python
    "torch._C._dynamo.guards.TensorGuards",
    # deploy/exporting.py: the export's static inputs told to Inductor (standalone_compile
    # passes its options to compile_fx, whose inner_compile this is)
    "torch._inductor.compile_fx.compile_fx_inner",
    # diagnostics/cpp_compiler.py: the C++ compiler Inductor's CPU kernels need, looked for as
    # Inductor looks, and its error where there is none
    "torch._inductor.config.cpp.cxx",
    "torch._inductor.config.is_fbcode",
    "torch._inductor.exc.InvalidCxxCompiler",
    # enabling.py: whether the process can run a device, as Inductor asks
    "torch._dynamo.device_interface.get_interface_for_device",
]

# trees/backends/cuda.py: allocator checkpoints, in CUDA builds only.
CUDA_PRIVATE_APIS = [
    "torch._C._cuda_getCheckpointState",
    "torch._C._cuda_setCheckpointPoolState",
    "torch._C._cuda_checkPoolLiveAllocations",
    "torch._C._free_And_Remove_DeleterFn",
    "torch._C._has_Standard_Deleter",
    "torch._C._cuda_clearCublasWorkspaces",  # wrapped (backends/cuda.py)
    # trees/backends/device_graphs.py: what a failed capture leaves undone
    "torch._C._cuda_endAllocateToPool",
    "torch._C._cuda_releasePool",
    # trees/invalidation.py: stale outputs (elsewhere the C++ extension does the same)
    "torch._C._set_storage_access_error_msg",
    "torch._C._set_storage_data_ptr_access_error_msg",
    # trees/recording.py: the replay's address check in C++; without it a Python loop does
    # the same check, slower, and nothing else would say so
    "torch._C._tensors_data_ptrs_at_indices_equal",
]


def resolve(path):
    module_path, _, attr = path.rpartition(".")
    while module_path:
        try:
            obj = importlib.import_module(module_path)
            break
        except ImportError:
            module_path, _, parent = module_path.rpartition(".")
            attr = f"{parent}.{attr}"
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("path", PRIVATE_APIS)
def test_private_torch_api_still_exists(path):
    try:
        resolve(path)
    except AttributeError as error:
        pytest.fail(f"torch {torch.__version__} no longer has {path}: {error}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA build and device")
@pytest.mark.parametrize("path", CUDA_PRIVATE_APIS)
def test_private_cuda_api_still_exists(path):
    test_private_torch_api_still_exists(path)


def test_generation_counters_have_the_expected_shape():
    from torch._dynamo.mutation_guard import GenerationTracker
    from torch._inductor.cudagraph_trees import MarkStepBox, mark_step_begin

    assert isinstance(GenerationTracker.generation, int)
    before = MarkStepBox.mark_step_counter
    mark_step_begin()
    assert MarkStepBox.mark_step_counter != before
    MarkStepBox.mark_step_counter = before


def test_a_storage_swap_exists_for_handing_gradients_over():
    """``_swap_data_ptr_`` from torch 2.13; older torch uses the compiled module's swap."""
    from inductor_xpugraph.trees.invalidation import can_copy_out_of_pool

    if not hasattr(torch.UntypedStorage, "_swap_data_ptr_"):
        assert torch.__version__ < "2.13", f"torch {torch.__version__} lost _swap_data_ptr_"
    assert can_copy_out_of_pool()


def test_the_extensions_storage_swap_moves_data_as_torchs_does():
    """The swap torch 2.11 uses, checked on any torch: tensors over the first storage keep
    their values in new memory; the second storage takes over the old memory, unowned."""
    from inductor_xpugraph import native

    extension = native.load()
    if extension is None:
        pytest.skip("no compiled module for this torch (tests/test_native.py says why)")
    owner = torch.arange(8.0)
    memory = owner.untyped_storage()
    unowned = torch._C._construct_storage_from_data_pointer(
        memory.data_ptr(), memory.device, memory.nbytes()
    )
    held = torch.empty(0).set_(unowned, 0, (8,), (1,))
    fresh = torch.UntypedStorage(memory.nbytes())
    fresh.copy_(unowned)
    extension.swap_storage_data(unowned._cdata, fresh._cdata)
    owner.fill_(-1.0)  # the graph writes its memory again
    assert held.tolist() == [float(i) for i in range(8)]
    assert held.data_ptr() != memory.data_ptr() and unowned.resizable()
    assert fresh.data_ptr() == memory.data_ptr() and not fresh.resizable()
