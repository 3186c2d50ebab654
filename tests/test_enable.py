"""``inductor_xpugraph.enable(device)`` on a process that cannot run the device: accepted, and
said once, naming what is missing."""

import warnings

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph import enabling


class _NoDevice:
    @staticmethod
    def is_available() -> bool:
        return False


@pytest.fixture
def cuda_missing(monkeypatch):
    """cuda unavailable, whatever this machine has; the registration as it was afterwards."""
    monkeypatch.setattr(enabling.device_interface, "get_interface_for_device", lambda d: _NoDevice)
    monkeypatch.setattr(enabling, "_warned", set())
    was_enabled = "cuda" in inductor_xpugraph.enabled_devices()
    yield
    if not was_enabled:
        inductor_xpugraph.disable("cuda")


def test_enabling_cuda_on_a_torch_built_without_it_warns_once_naming_what_is_missing(
    monkeypatch, cuda_missing
):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.warns(UserWarning) as warned:
        inductor_xpugraph.enable("cuda")
        inductor_xpugraph.enable("cuda")
    (warning,) = [w for w in warned if "inductor_xpugraph.enable" in str(w.message)]
    assert str(warning.message).startswith(
        f"inductor_xpugraph.enable('cuda'): this torch ({torch.__version__}) is built without CUDA"
    )
    assert warning.filename == __file__  # the caller's line
    assert "cuda" in inductor_xpugraph.enabled_devices()


def test_enabling_cuda_where_torch_sees_no_cuda_device_says_so(monkeypatch, cuda_missing):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        inductor_xpugraph.enable("cuda")
    (warning,) = [w for w in warned if "inductor_xpugraph.enable" in str(w.message)]
    assert "sees no cuda device (torch.cuda.is_available() is False)" in str(warning.message)
