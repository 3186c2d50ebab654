"""How the runtime's messages name inputs (``trees.inputs.InputNames``): the skip line for
written inputs that are new tensors at each call names the first two and how many more, each
with a source file outside the working directory by its name alone."""

from inductor_xpugraph.trees import messages
from inductor_xpugraph.trees.inputs import InputNames

LIBRARY = "/opt/venv/lib/python3.12/site-packages/transformers/cache_utils.py"
READER = "read by L['self'].model.layers.0.self_attn (LlamaAttention)"


def cache_inputs(count: int) -> InputNames:
    """A decode step's cache tensors, as codegen names them: each read in a library's file."""
    return InputNames(
        {i: f"arg{i}_1, {READER} at {LIBRARY}:{482 + i % 2} in update" for i in range(count)}
    )


def test_an_input_read_in_a_file_outside_the_working_directory_is_named_by_the_files_name():
    names = InputNames(
        {
            0: f"arg0_1, {READER} at {LIBRARY}:482 in update",
            1: "arg1_1, read at models/mlp.py:7 in forward",
        }
    )
    assert names.describe([0]) == f"input 0 (arg0_1, {READER} at cache_utils.py:482 in update)"
    assert names.describe([1]) == "input 1 (arg1_1, read at models/mlp.py:7 in forward)"


def test_the_skip_line_for_sixteen_new_cache_tensors_names_two_and_the_count_briefly():
    line = messages.unsafe_mutation(cache_inputs(16).describe(list(range(16)), shown=2))
    assert line.startswith(
        f"writes inputs 0 (arg0_1, {READER} at cache_utils.py:482 in update), "
        f"1 (arg1_1, {READER} at cache_utils.py:483 in update) and 14 more, new tensors"
    )
    assert len(line) < 480
