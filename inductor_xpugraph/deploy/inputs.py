"""The inputs an export was compiled for, checked at every call of the loaded function.

An export is compiled for its example inputs' sizes, strides, dtypes and devices (and the
values of number inputs), as a graph is captured for one set of them: the loaded callable
checks every call's inputs against them and raises ``ValueError`` naming the first that
differs. Without the check, a weight passed at its address with another shape would be read
by the graph with the old one, and a smaller input broadcast into its buffer, silently.
Calls like the last one that passed are checked in C++ (Dynamo's ``TensorGuards``). (Symbolic
sizes would not help: a graph replays one size, and the tree cannot see sizes read inside the
wrapper.) The same check tells ``load`` whether a tensor input requires grad, which, with
grad mode, picks the graph a call runs (``exporting``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch


class InputSignature:
    """The caller's inputs an export was compiled for: each tensor's shape, strides, dtype and
    device, each number's value (other objects are not checked). ``check`` runs at every
    call of a loaded export, before anything else, and says whether a tensor input requires
    grad (``load`` picks the training or the inference graph by it).

    The check in Python (``_check_in_python``) decides. It costs about 0.4 µs per tensor, so
    once a call passes it, a C++ ``TensorGuards`` of that call's tensors (Dynamo's: sizes,
    strides, dtype, device, requires_grad, dispatch keys) answers for the next calls whose
    tensors match it exactly, at about 0.05 µs per tensor. It accepts a subset of what the
    Python check accepts; anything it does not accept goes back to the Python check."""

    def __init__(self, entries: list[dict[str, Any] | None]) -> None:
        self.entries = entries
        self._tensors = [i for i, entry in enumerate(entries) if entry and "shape" in entry]
        self._numbers = [i for i, entry in enumerate(entries) if entry and "value" in entry]
        tensors = [entries[i] for i in self._tensors]
        self._expected_numbers = [entries[i]["value"] for i in self._numbers]
        self._expected = (
            [(torch.Size(e["shape"]), getattr(torch, e["dtype"])) for e in tensors],
            [tuple(e["stride"]) for e in tensors],
            [torch.device(e["device"]) for e in tensors],
            self._expected_numbers,
        )
        self._only_tensors = len(self._tensors) == len(entries)
        self._same_as_verified: Any = None  # a TensorGuards of the last call that passed
        self._verified_requires_grad = False  # whether one of its tensors requires grad

    @staticmethod
    def of(example_inputs: Sequence[Any]) -> InputSignature:
        def entry(value: Any) -> dict[str, Any] | None:
            if isinstance(value, torch.Tensor):
                return {
                    "shape": list(value.shape),
                    "stride": list(value.stride()),
                    "dtype": str(value.dtype).removeprefix("torch."),
                    "device": str(value.device),
                }
            if isinstance(value, (bool, int, float)):
                return {"value": value}
            return None

        return InputSignature([entry(value) for value in example_inputs])

    def check(self, args: Sequence[Any]) -> bool:
        """Raise ``ValueError`` unless ``args`` are what the export was compiled for; else
        whether one of their tensors requires grad (the guard checks ``requires_grad`` too,
        so a call it accepts has the last verified call's answer)."""
        if self._same_as_verified is not None and len(args) == len(self.entries):
            tensors = args if self._only_tensors else [args[i] for i in self._tensors]
            try:
                if self._same_as_verified.check(*tensors) and (
                    self._only_tensors or [args[i] for i in self._numbers] == self._expected_numbers
                ):
                    return self._verified_requires_grad
            except TypeError:  # a tensor's place holds something else
                pass
        self._check_in_python(args)
        tensors = [args[i] for i in self._tensors]
        self._same_as_verified = _guard_of(tensors)
        self._verified_requires_grad = any(tensor.requires_grad for tensor in tensors)
        return self._verified_requires_grad

    def _check_in_python(self, args: Sequence[Any]) -> None:
        try:
            if len(args) == len(self.entries):
                tensors = [args[i] for i in self._tensors]
                found = (
                    list(map(_SHAPE_AND_DTYPE, tensors)),
                    list(map(torch.Tensor.stride, tensors)),
                    list(map(_DEVICE, tensors)),
                    [args[i] for i in self._numbers],
                )
                if found == self._expected:
                    return
        except (AttributeError, TypeError):  # a tensor's place holds something else
            pass
        raise ValueError(self._mismatch(args))

    def _mismatch(self, args: Sequence[Any]) -> str:
        advice = (
            "an export is compiled for its example inputs' shapes, strides, dtypes and "
            "devices: export once for each set of inputs it is called with"
        )
        if len(args) != len(self.entries):
            return (
                f"inductor_xpugraph.deploy: called with {len(args)} inputs; the export takes "
                f"{len(self.entries)} ({advice})"
            )
        for i, entry in enumerate(self.entries):
            if entry is None:
                continue
            wanted = describe_input(entry)
            given = InputSignature.of([args[i]]).entries[0]
            if given is None or describe_input(given) != wanted:
                got = describe_input(given) if given else f"a {type(args[i]).__name__}"
                return (
                    f"inductor_xpugraph.deploy: input {i} is {got}; the export was compiled "
                    f"for {wanted} ({advice})"
                )
        return f"inductor_xpugraph.deploy: the inputs differ from the export's ({advice})"


# Private (tests/test_torch_private_apis.py lists it); without it every call takes the
# Python check.
try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:
    _TensorGuards = None


def _guard_of(tensors: list[torch.Tensor]) -> Any:
    """A ``TensorGuards`` that accepts exactly these tensors' metadata (None without one)."""
    if _TensorGuards is None:
        return None
    try:
        return _TensorGuards(
            *tensors,
            dynamic_dims_sizes=[list(t.shape) for t in tensors],
            dynamic_dims_strides=[list(t.stride()) for t in tensors],
        )
    except Exception:  # a tensor it cannot describe: the Python check answers every call
        return None


_SHAPE_AND_DTYPE = operator.attrgetter("shape", "dtype")
_DEVICE = operator.attrgetter("device")


def describe_input(entry: dict[str, Any]) -> str:
    if "value" in entry:
        return f"the number {entry['value']!r}"
    shape, stride, dtype = tuple(entry["shape"]), tuple(entry["stride"]), entry["dtype"]
    article = "an" if dtype[0] in "aeiou" else "a"  # an int64, a float32
    return f"{article} {dtype} tensor on {entry['device']}, shape {shape}, strides {stride}"
