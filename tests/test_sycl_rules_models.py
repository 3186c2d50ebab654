"""A small transformer on the CPU under SYCL Graph's rules (``sycl_rules.on_cpu``), as torch's
XPU runtime of 2.13 and 2.15 meets them: outputs equal eager's, no exception reaches the
caller, the attention forward is left out of graphs on 2.13 (oneDNN's kernel fails capture
there, intel/torch-xpu-ops#5069) and captured on 2.15, its backward (sycl-tla flash) is left
out on both, and ``report()`` names what runs un-graphed and why. Inductor does not split CPU
graphs into partitions, so on the CPU the graph that runs a listed operator runs un-graphed
whole (on an Intel GPU, Inductor partitions around it: tests/test_fake_device_codegen.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import inductor_xpugraph
from inductor_xpugraph import sycl_rules

ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(2, 8, 16)).relu()


def skipped_for(reason_part: str) -> list[str]:
    return [e.reason for e in inductor_xpugraph.report().events if reason_part in e.reason]


@pytest.fixture(autouse=True)
def fresh_counters():
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("release, attention_captured", [("2.13", False), ("2.15", True)])
def test_inference_equals_eager_with_attention_left_out_where_the_release_refuses_it(
    release, attention_captured
):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 8, 16)
    with torch.no_grad():
        expected = model(x)
        with sycl_rules.on_cpu(release) as device:
            compiled = torch.compile(model, mode="reduce-overhead")
            outputs = [compiled(x).clone() for _ in range(4)]
            stats = inductor_xpugraph.stats()
            left_out = skipped_for(ATTENTION)
            assert not [q for q in device.queues() if q.state == "recording"]
    for out in outputs:
        torch.testing.assert_close(out, expected)
    assert stats["capture_failures"] == 0 and stats["fallbacks"] == 0
    assert bool(left_out) is not attention_captured
    if attention_captured:
        assert stats["records"] >= 1 and stats["replays"] >= 2
    else:
        assert stats["records"] == 0
        assert "intel/torch-xpu-ops#5069" in left_out[0]
        assert "does not split CPU graphs into partitions" in left_out[0]


@pytest.mark.parametrize("release", ["2.13", "2.15"])
def test_training_equals_eager_with_the_attention_backward_left_out(release):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 8, 16)
    reference = Block()
    reference.load_state_dict(model.state_dict())
    reference(x).sum().backward()
    with sycl_rules.on_cpu(release):
        compiled = torch.compile(model, mode="reduce-overhead")
        for _ in range(3):
            model.zero_grad()
            compiled(x).sum().backward()
        stats = inductor_xpugraph.stats()
        backward_left_out = skipped_for(ATTENTION + "_backward")
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)
    assert stats["capture_failures"] == 0 and stats["fallbacks"] == 0
    # the forward records where its attention is captured (2.15); the backward never does
    assert stats["records"] == (1 if release == "2.15" else 0)
    assert backward_left_out and "intel/torch-xpu-ops#3142" in backward_left_out[0]


def test_an_attention_the_release_refuses_fails_its_capture_and_the_call_still_returns():
    """With the oneDNN entry lifted (``allow_capture_ops``) on 2.13, the capture meets SYCL's
    refusal: the call returns eager's result, the callable runs un-graphed after, said once."""
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 8, 16)
    lifted = ("aten::_scaled_dot_product_fused_attention_overrideable",)
    with torch.no_grad():
        expected = model(x)
        with sycl_rules.on_cpu("2.13"), inductor_xpugraph.config.patch(allow_capture_ops=lifted):
            compiled = torch.compile(model, mode="reduce-overhead")
            outputs = [compiled(x).clone() for _ in range(3)]
            stats = inductor_xpugraph.stats()
            refused = skipped_for("Graph nodes cannot depend on events from outside the graph")
    for out in outputs:
        torch.testing.assert_close(out, expected)
    assert stats["capture_failures"] == 1
    assert refused


def test_hugging_face_generate_equals_eager_under_each_release():
    """A two-layer Llama's greedy ``generate`` (its dynamic cache passed from step to step) gives
    eager's tokens on every call, whether the release leaves attention out (2.13) or not."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=6, do_sample=False)
        for release in ("2.13", "2.15"):
            torch._dynamo.reset()
            with sycl_rules.on_cpu(release):
                model.forward = torch.compile(model.forward, mode="reduce-overhead")
                for _ in range(2):
                    tokens = model.generate(prompt, max_new_tokens=6, do_sample=False)
                    assert torch.equal(tokens, expected), release
            del model.forward
