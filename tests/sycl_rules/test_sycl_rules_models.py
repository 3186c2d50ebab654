"""Models on the CPU under SYCL Graph's rules (``sycl_rules.on_cpu``), as torch's XPU runtime
of 2.13, 2.14 (both recording modes) and 2.15 meets them: outputs equal eager's, no exception
reaches the caller, and ``report()`` says of every graph whether it is captured, and if not,
why. A transformer block's attention forward is left out of graphs before 2.15 (oneDNN's kernel
fails capture, intel/torch-xpu-ops#5069) and captured from 2.15; its backward (sycl-tla flash,
work-group scratch memory) is left out under command buffers and captured under native
recording; a graph running ``torch.fft`` (oneMKL) is left out everywhere. Inductor does not
split CPU graphs into partitions, so on the CPU the graph that runs a listed operator runs
un-graphed whole (on an Intel GPU, Inductor partitions around it:
tests/codegen/test_fake_device_codegen.py)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from support.stand_in_rule_sets import RULE_SET_IDS, RULE_SETS

import inductor_xpugraph
from inductor_xpugraph import sycl_rules
from inductor_xpugraph.diagnostics.report_records import CallableState
from inductor_xpugraph.sycl_rules import RELEASES
from inductor_xpugraph.trees.backends.xpu_recording import COMMAND_BUFFER, NATIVE

ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"
#: (release, recording mode): the rule sets of the must-show matrix.


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


def why_each_graph() -> dict[str, str]:
    """Every graph of the report that ran since the last ``reset()``: "captured", or the
    reasons it is not."""
    report = inductor_xpugraph.report()
    ran = [c for c in report.callables if c.sizes_seen]
    reasons: dict[str, list[str]] = {}
    for event in report.events:
        if event.graph is not None:
            reasons.setdefault(event.graph, []).append(event.reason)
    said = {}
    for graph in {c.graph for c in ran} | set(reasons):
        graphed = any(c.graph == graph and c.state is CallableState.GRAPHED for c in ran)
        said[graph] = "captured" if graphed else "; ".join(reasons.get(graph, []))
    return said


@pytest.fixture(autouse=True)
def fresh_counters():
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("release, recording", RULE_SETS, ids=RULE_SET_IDS)
def test_block_inference_equals_eager_with_attention_left_out_where_refused(release, recording):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 8, 16)
    attention_captured = release >= "2.15"
    with torch.no_grad():
        expected = model(x)
        with sycl_rules.on_cpu(release, recording=recording) as device:
            compiled = torch.compile(model, mode="reduce-overhead")
            outputs = [compiled(x).clone() for _ in range(4)]
            stats = inductor_xpugraph.stats()
            left_out = skipped_for(ATTENTION)
            said = why_each_graph()
            assert not [q for q in device.queues() if q.state == "recording"]
    for out in outputs:
        torch.testing.assert_close(out, expected)
    assert stats["capture_failures"] == 0 and stats["fallbacks"] == 0
    assert bool(left_out) is not attention_captured
    assert said and all(said.values()), said
    if attention_captured:
        assert stats["records"] >= 1 and stats["replays"] >= 2
        assert set(said.values()) == {"captured"}
    else:
        assert stats["records"] == 0
        assert "intel/torch-xpu-ops#5069" in left_out[0]
        assert "does not split CPU graphs into partitions" in left_out[0]


@pytest.mark.parametrize("release, recording", RULE_SETS, ids=RULE_SET_IDS)
def test_block_training_equals_eager_with_the_backward_left_out_under_command_buffers(
    release, recording
):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 8, 16)
    reference = Block()
    reference.load_state_dict(model.state_dict())
    reference(x).sum().backward()
    with sycl_rules.on_cpu(release, recording=recording):
        compiled = torch.compile(model, mode="reduce-overhead")
        for _ in range(3):
            model.zero_grad()
            compiled(x).sum().backward()
        stats = inductor_xpugraph.stats()
        backward_left_out = skipped_for(ATTENTION + "_backward")
        said = why_each_graph()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)
    assert stats["capture_failures"] == 0 and stats["fallbacks"] == 0
    assert said and all(said.values()), said
    forward_captured = release >= "2.15"  # oneDNN's attention stands for the forward
    backward_captured = recording == NATIVE  # flash backward: work-group scratch memory
    captured = {
        graph.split(":")[0].split("_")[-1]: why == "captured" for graph, why in said.items()
    }
    assert captured == {"forward": forward_captured, "backward": backward_captured}, said
    assert bool(backward_left_out) is not backward_captured
    if backward_left_out:
        assert "intel/torch-xpu-ops#3142" in backward_left_out[0]


class Spectral(torch.nn.Module):
    """A linear layer, a real FFT (oneMKL on xpu) and another linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(16, 16)
        self.out = torch.nn.Linear(9, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.fft.rfft(self.inp(x).relu()).abs())


@pytest.mark.parametrize("release, recording", RULE_SETS, ids=RULE_SET_IDS)
def test_an_fft_model_equals_eager_with_its_fft_graph_left_out(release, recording):
    torch.manual_seed(0)
    model, x = Spectral(), torch.randn(4, 16)
    with torch.no_grad():
        expected = model(x)
        with sycl_rules.on_cpu(release, recording=recording):
            compiled = torch.compile(model, mode="reduce-overhead")
            outputs = [compiled(x).clone() for _ in range(3)]
            stats = inductor_xpugraph.stats()
            said = why_each_graph()
    for out in outputs:
        torch.testing.assert_close(out, expected)
    assert stats["capture_failures"] == 0 and stats["records"] == 0
    (reason,) = said.values()
    assert "aten::_fft_r2c is not captured" in reason and "oneMKL" in reason


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


def test_hugging_face_generate_equals_eager_under_each_rule_set():
    """A two-layer Llama's greedy ``generate`` (its dynamic cache passed from step to step) gives
    eager's tokens on every call under every rule set, and the report says of each graph
    whether it is captured or why not."""
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
        for release, recording in RULE_SETS:
            torch._dynamo.reset()
            inductor_xpugraph.reset()
            with sycl_rules.on_cpu(release, recording=recording):
                model.forward = torch.compile(model.forward, mode="reduce-overhead")
                for _ in range(2):
                    tokens = model.generate(prompt, max_new_tokens=6, do_sample=False)
                    assert torch.equal(tokens, expected), (release, recording)
                said = why_each_graph()
                assert said and all(said.values()), (release, recording, said)
                assert inductor_xpugraph.stats()["capture_failures"] == 0
            del model.forward


def test_on_cpu_leaves_nothing_behind_across_every_release_and_mode():
    """One process, every release and recording mode in turn, the first with a failed
    ``capture_end`` that stops captures on its stand-in device (torch 2.13's host routing):
    each later rule set records and replays, and ``stats()`` gives no advice to enable the
    package (docs/xpu.md loops over releases the same way)."""
    from inductor_xpugraph.diagnostics.report import not_enabled_hint

    rule_sets = [("2.13", COMMAND_BUFFER)] + [
        (release, mode)
        for release in RELEASES
        for mode in (COMMAND_BUFFER, NATIVE)
        if (release, mode) != ("2.13", COMMAND_BUFFER)
        and (mode == COMMAND_BUFFER or release >= "2.14")
    ]
    x = torch.randn(4, 8)
    for index, (release, mode) in enumerate(rule_sets):
        torch._dynamo.reset()
        inductor_xpugraph.reset()
        with sycl_rules.on_cpu(release, recording=mode) as device:
            compiled = torch.compile(lambda t: (t * 2).sin() + 1, mode="reduce-overhead")
            compiled(x)  # the warmup
            if index == 0:
                device.fail_next("end_recording", "UR_RESULT_ERROR_DEVICE_LOST")
            outputs = [compiled(x).clone() for _ in range(3)]
            counts = inductor_xpugraph.stats()
        for out in outputs:
            torch.testing.assert_close(out, (x * 2).sin() + 1)
        if index == 0:
            assert counts["capture_failures"] == 1 and counts["records"] == 0
        else:
            assert counts["records"] == 1 and counts["replays"] >= 2, (release, mode, counts)
            assert not_enabled_hint(counts) is None


def test_graphs_on_a_device_that_cannot_record_are_counted_skips_with_the_reason():
    """After a failed ``capture_end`` on 2.13 the stand-in device records no more graphs: after
    ``reset()`` a new model's graphs are skips that say why, and ``stats()`` gives no advice
    to enable the package (it is enabled)."""
    from inductor_xpugraph.diagnostics.report import not_enabled_hint

    x = torch.randn(4, 8)
    with sycl_rules.on_cpu("2.13") as device:
        compiled = torch.compile(lambda t: t.cos() * 2, mode="reduce-overhead")
        compiled(x)
        device.fail_next("end_recording", "UR_RESULT_ERROR_DEVICE_LOST")
        compiled(x)
        torch._dynamo.reset()
        inductor_xpugraph.reset()
        again = torch.compile(lambda t: t.sin() * 2, mode="reduce-overhead")
        for _ in range(3):
            torch.testing.assert_close(again(x), x.sin() * 2)
        counts = inductor_xpugraph.stats()
        said = why_each_graph()
    assert counts["records"] == 0 and counts["skips"] == 3
    (reason,) = said.values()
    assert "cpu:0 records no graph in this process" in reason and "host" in reason
    assert not_enabled_hint(counts) is None


def test_reset_and_model_churn_never_capture_into_a_latched_pool_on_torch_2_13():
    """torch 2.13's allocator asserts on a capture into a pool whose graphs all went: the tree
    takes a fresh pool after ``reset()`` and after its models were deleted, so it records
    again with no failed capture (and the stand-in saw pools parked)."""
    x = torch.randn(4, 8)
    with sycl_rules.on_cpu("2.13") as device:
        for round in range(3):
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
            compiled = torch.compile(model, mode="reduce-overhead")
            with torch.no_grad():
                expected = model(x)
                for _ in range(3):
                    torch.testing.assert_close(compiled(x), expected)
            if round == 0:
                inductor_xpugraph.reset()
            else:
                del model, compiled
                torch._dynamo.reset()
                gc.collect()
        counts = inductor_xpugraph.stats()
        parked = set(device.parked_pools)
    assert counts["capture_failures"] == 0 and counts["records"] >= 2
    assert parked, "no pool was dropped: the latch was never armed"
