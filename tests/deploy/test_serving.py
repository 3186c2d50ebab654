"""A loaded export in a serving loop: the README's deployment example, on every device.

A model exported with its parameters as inputs (they require grad) holds an inference graph
and training graphs; calls under ``torch.no_grad()`` or ``torch.inference_mode()`` run the
inference graph (no autograd history, one recording replayed), calls with grad on run the
training graphs, as a ``torch.compile``d model would.
"""

import json

import pytest
import torch

import inductor_xpugraph
from inductor_xpugraph.deploy import export, load

CALLS = 10


def make_model(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model.to(device)


def weights_of(model):
    return [*dict(model.named_parameters()).values(), *dict(model.named_buffers()).values()]


@pytest.fixture(scope="module")
def exported_model(tmp_path_factory):
    """``(model, path)`` for a device: the README's export (grad on, parameters requiring grad,
    the weights static), made once per device for the module."""
    made = {}

    def exported_for(device):
        if device not in made:
            model = make_model(device)
            state = {**dict(model.named_parameters()), **dict(model.named_buffers())}

            def fn(*args):
                return torch.func.functional_call(model, dict(zip(state, args[:-1])), (args[-1],))

            path = tmp_path_factory.mktemp(f"serving-{device}") / "model"
            example = [*state.values(), torch.randn(4, 8, device=device)]
            export(fn, example, path, static_inputs=range(len(state)))
            made[device] = model, path
        return made[device]

    return exported_for


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_a_serving_loop_over_a_loaded_export_replays_one_graph(device, exported_model, grad_mode):
    model, path = exported_model(device)
    served = load(path)
    weights = weights_of(model)
    with grad_mode():
        for _ in range(CALLS):
            x = torch.randn(4, 8, device=device)
            (out,) = served(*weights, x)
            assert not out.requires_grad and out.grad_fn is None
            torch.testing.assert_close(out, model(x))
    stats = inductor_xpugraph.stats()
    assert stats["records"] == 1 and stats["replays"] >= CALLS - 2, stats


def test_a_loaded_export_called_with_grad_on_builds_autograd_history(device, exported_model):
    """Grad on and the weights requiring grad: the training graphs run, and backward gives
    the weights the gradients eager gives them."""
    model, path = exported_model(device)
    if not json.loads((path / "inductor_xpugraph.json").read_text())["training"]:
        pytest.skip(f"torch {torch.__version__} saved no training graphs (export warned)")
    served = load(path)
    weights = weights_of(model)
    x = torch.randn(4, 8, device=device)
    for _ in range(3):
        (out,) = served(*weights, x)
        assert out.requires_grad
        compiled_grads = torch.autograd.grad(out.sum(), weights)
    eager_grads = torch.autograd.grad(model(x).sum(), weights)
    for compiled, eager in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(compiled, eager)
