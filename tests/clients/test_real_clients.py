"""Real clients: Hugging Face ``generate`` with a static cache, torchvision ResNet-18 and a BERT
encoder on cuda (``-m gpu``; ``benchmarks/real_clients.py`` times them against upstream); and,
on the emulator too, decode loops that feed each step's outputs into the next step (an LSTM
cell sampler, Hugging Face GPT-2 passing its dynamic KV cache back). Random weights.
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


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_hf_generate_with_one_static_cache_kept_across_calls_records_once(device):
    """The README's lever for short requests: one ``StaticCache`` passed to every ``generate``
    and reset between calls never moves, so the decode step records once and replays in every
    later call. (``generate`` allocating a new cache per call records each time, and with
    fewer than about 8 decode steps per call trips the thrash guard.)"""
    transformers = pytest.importorskip("transformers")
    from transformers import CompileConfig

    model = small_llama(device)
    prompt = torch.randint(1, 1000, (1, 8), device=device)
    new_tokens, calls = 6, 12
    config = CompileConfig(mode="reduce-overhead")
    config._compile_all_devices = True  # the CPU emulator too
    cache = transformers.StaticCache(config=model.config, max_cache_len=8 + new_tokens)

    def generate_with_cache(**options):
        cache.reset()
        return model.generate(
            prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
            past_key_values=cache, **options,
        )  # fmt: skip

    expected = generate_with_cache(disable_compile=True)
    kept = [generate_with_cache(compile_config=config) for _ in range(calls)]
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["fallbacks"]) == (1, 0), stats
    decode_steps = calls * (new_tokens - 1)
    assert stats["replays"] == decode_steps - 1 - inductor_xpugraph.config.warmup_runs, stats
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


def test_an_lstm_cell_sampler_feeding_its_state_back_replays_as_eager(device):
    """A char-RNN sampling loop: the state (h, c) and the sampled token of each step are the
    next step's inputs (Note [Outputs passed back in])."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(50, 32).to(device)
    cell = torch.nn.LSTMCell(32, 64).to(device)
    head = torch.nn.Linear(64, 50).to(device)

    def step(token, h, c):
        h, c = cell(embed(token), (h, c))
        return head(h).argmax(-1), h, c

    def sample(fn, steps=10):
        token = torch.zeros(2, dtype=torch.long, device=device)
        h, c = torch.zeros(2, 64, device=device), torch.zeros(2, 64, device=device)
        tokens = []
        with torch.no_grad():
            for _ in range(steps):
                token, h, c = fn(token, h, c)
                tokens.append(token.clone())
        return torch.stack(tokens), h.clone()

    expected_tokens, expected_h = sample(step)
    tokens, h = sample(torch.compile(step, mode="reduce-overhead"))
    assert torch.equal(tokens, expected_tokens)
    torch.testing.assert_close(h, expected_h)
    stats = inductor_xpugraph.stats()
    assert (stats["records"], stats["replays"], stats["fallbacks"]) == (1, 8, 0), stats


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_hf_gpt2_decode_passing_its_dynamic_cache_back_matches_eager(device):
    """The dynamic KV cache a step returns is the next step's input: upstream's trees raise
    here at the first decode step. Each step has a new cache length, so each is warmed up
    (un-graphed) for its size: this checks the loop runs and matches eager, not speed."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=64, vocab_size=100, n_positions=64, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(device).eval()

    def decode(fn, steps=6):
        ids, past, logits = torch.tensor([[1, 2, 3]], device=device), None, []
        with torch.no_grad():
            for _ in range(steps):
                out = fn(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits.append(out.logits[:, -1].clone())
                ids = out.logits[:, -1:].argmax(-1)
        return torch.cat(logits)

    expected = decode(model)
    torch.testing.assert_close(
        decode(torch.compile(model, mode="reduce-overhead")), expected, rtol=1e-4, atol=1e-4
    )
