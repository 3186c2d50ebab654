"""Real clients on cuda: Hugging Face ``generate`` with a static cache, torchvision ResNet-18 and
a BERT encoder, random weights. Needs the GPU machine (``-m gpu``) and transformers /
torchvision; ``benchmarks/real_clients.py`` times the same clients against upstream.
"""

import pytest
import torch

import inductor_xpugraph


def small_llama(device):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device).eval()


def generate(model, prompt, mode):
    from transformers import CompileConfig

    return model.generate(
        prompt, max_new_tokens=24, min_new_tokens=24, do_sample=False,
        cache_implementation="static", compile_config=CompileConfig(mode=mode),
    )  # fmt: skip


def test_hf_generate_with_a_static_cache_stays_graphed_across_calls(cuda_each_strategy):
    """Each ``generate`` allocates a new KV cache (a static-address input), at a new address
    while the caller keeps earlier results: one recording per call at most, never a fallback
    (it used to fall back to eager after 9 calls)."""
    model = small_llama(cuda_each_strategy)
    prompt = torch.randint(1, 1000, (2, 8), device=cuda_each_strategy)
    expected = generate(model, prompt, "default")  # Inductor's kernels, no graphs
    torch._dynamo.reset()
    kept = [generate(model, prompt, "reduce-overhead") for _ in range(16)]  # results kept
    before_last = inductor_xpugraph.stats()
    kept += [generate(model, prompt, "reduce-overhead") for _ in range(4)]
    stats = inductor_xpugraph.stats()
    assert stats["fallbacks"] == 0, stats
    # Every decode step is graphed: replayed, or recorded for the call's new cache.
    records = stats["records"] - before_last["records"]
    assert records <= 4 and stats["replays"] - before_last["replays"] == 4 * 23 - records, stats
    for tokens in kept:
        assert torch.equal(tokens, expected), (tokens, expected)


def test_torchvision_resnet18_replays_match_eager(cuda_device):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).to(cuda_device).eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(8, 3, 224, 224, device=cuda_device)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-3, atol=1e-3)
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"]) == (1, 3)


def test_bert_encoder_replays_match_eager_at_two_batch_sizes(cuda_device):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).to(cuda_device).eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for batch in (1, 16, 1, 16):
            ids = torch.randint(0, config.vocab_size, (batch, 64), device=cuda_device)
            for _ in range(3):
                got = compiled(ids).last_hidden_state
                torch.testing.assert_close(got, model(ids).last_hidden_state, rtol=1e-3, atol=1e-3)
    assert inductor_xpugraph.stats()["fallbacks"] == 0
    assert inductor_xpugraph.stats()["replays"] >= 8
