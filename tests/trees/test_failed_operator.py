"""Which operator a failed capture failed in, read from the generated module's line the error
passed through (``trees.failed_operator``)."""

from __future__ import annotations

import pytest

from inductor_xpugraph.trees.failed_operator import operator_that_raised


def generated_call(line: str, directory):
    """``call(args)`` of a module file whose one line is ``line``, which raises."""
    path = directory / "generated_module.py"
    path.write_text(f"def call(args):\n    {line}\n")
    namespace = {name: _Raising() for name in ("torch", "aten", "extern_kernels", "triton_kernel")}
    namespace.update(buf0=None, buf1=None, arg1_1=None)
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["call"]


class _Raising:
    """Any attribute chain; calling it raises, as a device refusing a capture does."""

    def __getattr__(self, name: str) -> _Raising:
        return self

    def __call__(self, *args, **kwargs):
        raise RuntimeError("the device refused it")


def failed_in(line: str, directory):
    call = generated_call(line, directory)
    with pytest.raises(RuntimeError) as raised:
        call([])
    return operator_that_raised(raised.value, call)


@pytest.mark.parametrize(
    "line, name",
    [
        ("buf1 = torch.ops.mylib.sync.default(buf0)", "mylib::sync"),
        ("buf1 = torch.ops.aten.nonzero_static.default(buf0, size=4)", "aten::nonzero_static"),
        ("buf1 = aten.embedding_dense_backward.default(buf0)", "aten::embedding_dense_backward"),
        ("extern_kernels.mm(buf0, arg1_1, out=buf1)", "aten::mm"),
    ],
)
def test_the_line_that_raised_names_its_operator(line, name, tmp_path):
    found = failed_in(line, tmp_path)
    assert found is not None and (found.name, found.line) == (name, line)


def test_a_line_that_calls_no_operator_names_none(tmp_path):
    assert failed_in("triton_kernel.run(buf0, 16)", tmp_path) is None


def test_an_error_that_never_passed_through_the_module_names_none(tmp_path):
    call = generated_call("buf1 = torch.ops.mylib.sync.default(buf0)", tmp_path)
    assert operator_that_raised(RuntimeError("elsewhere"), call) is None
