"""CPU and CUDA agree: same noise bits, same processed logits, same tokens; no host syncs."""
from __future__ import annotations

import pytest
import torch

from chorus.models.variants import get_variant
from chorus.sampling import (
    SamplingBatch, SamplingParams, initial_penalty_mask, process_logits, record_sampled_tokens, sample_next_tokens,
)
from chorus.sampling.counter_rng import seed_lanes, split_seed, uniform_hash
from tests.sampling.fake_decode import generate
from tests.sampling.test_parity import check_en_order_parity, check_turbo_order_parity

pytestmark = pytest.mark.gpu

EN = get_variant("original")
TURBO = get_variant("turbo")


def _mixed_params(variant):
    overrides = [dict(), dict(temperature=0.0), dict(temperature=1.3, top_p=0.7), dict(repetition_penalty=1.0),
                 dict(top_k=20, min_new_tokens=4), dict(top_p=0.2, temperature=0.5)]
    return [SamplingParams.for_variant(variant, seed=1000 + i, **o) for i, o in enumerate(overrides * 4)]


def test_noise_bits_are_identical_on_cpu_and_cuda():
    seeds = [0, 1, 2**32, 2**63 + 5, 2**64 - 1, 987654321]
    lanes = seed_lanes(torch.tensor([split_seed(s) for s in seeds], dtype=torch.int64))
    steps = torch.tensor([0, 1, 2**31, 2**32 - 1, 17, 999])
    cpu = uniform_hash(lanes, steps, 8194)
    cuda = uniform_hash(lanes.cuda(), steps.cuda(), 8194)
    assert torch.equal(cpu, cuda.cpu())


@pytest.mark.parametrize("variant", [EN, TURBO], ids=lambda v: v.name)
def test_processed_logits_agree_on_cpu_and_cuda(variant):
    params = _mixed_params(variant)
    vocab = variant.t3.speech_vocab_size
    g = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(len(params), vocab, generator=g) * 3, torch.randn(len(params), vocab, generator=g) * 3
    steps = torch.arange(len(params))
    out = {}
    for device in ("cpu", "cuda"):
        batch = SamplingBatch.build(params, variant, device)
        seen = initial_penalty_mask(variant, len(params), device)
        seen[:, :50] = True
        out[device] = process_logits(cond.to(device), batch, seen, steps.to(device),
                                     uncond_logits=uncond.to(device) if variant.t3.supports_cfg else None).cpu()
    assert torch.equal(torch.isneginf(out["cpu"]), torch.isneginf(out["cuda"]))
    assert (out["cpu"].softmax(-1) - out["cuda"].softmax(-1)).abs().max() <= 1e-6


@pytest.mark.parametrize("variant", [EN, TURBO], ids=lambda v: v.name)
def test_cpu_and_cuda_sample_identical_tokens(variant):
    requests = list(enumerate(_mixed_params(variant)))
    starts = [3 * i for i in range(len(requests))]
    assert generate(variant, requests, starts, 16, "cpu") == generate(variant, requests, starts, 16, "cuda")


@pytest.mark.parametrize("variant", [EN, TURBO], ids=lambda v: v.name)
def test_a_decode_step_needs_no_host_sync(variant):
    params = _mixed_params(variant)
    vocab = variant.t3.speech_vocab_size
    batch = SamplingBatch.build(params, variant, "cuda")
    seen = initial_penalty_mask(variant, len(params), "cuda")
    logits = torch.randn(len(params), vocab, device="cuda")
    uncond = torch.randn(len(params), vocab, device="cuda") if variant.t3.supports_cfg else None
    steps = torch.zeros(len(params), dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        processed = process_logits(logits, batch, seen, steps, uncond_logits=uncond)
        tokens = sample_next_tokens(processed, batch, steps)
        record_sampled_tokens(variant, seen, tokens, steps)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.device.type == "cuda" and tokens.dtype == torch.int64


def test_processing_matches_transformers_processors_on_cuda():
    """The parity cases of test_parity.py with both sides on CUDA (needs transformers only)."""
    pytest.importorskip("transformers")
    check_en_order_parity("cuda")
    check_turbo_order_parity("turbo", "cuda")


def test_top_p_in_top_k_equals_the_full_sort_on_cuda():
    from chorus.sampling.processors import apply_top_k, apply_top_k_top_p, apply_top_p
    from tests.sampling.test_top_p_in_top_k import random_case, top_p_stable_sort

    g = torch.Generator().manual_seed(5)
    for _ in range(100):
        logits, top_k, max_top_k, cutoff = random_case(g, "cuda")
        expected = top_p_stable_sort(apply_top_k(logits, top_k, max_top_k), cutoff)
        assert torch.equal(apply_top_k_top_p(logits, top_k, max_top_k, cutoff), expected)
    # at the real vocabulary sizes torch.sort on CUDA is a stable radix sort: the same masks
    for vocab in (6563, 8194):
        logits = (torch.randn(16, vocab, generator=g) * 3).to(torch.bfloat16).float().cuda()
        top_k = torch.randint(1, 1500, (16,), generator=g).cuda()
        cutoff = (1 - torch.rand(16, 1, generator=g)).cuda()
        expected = apply_top_p(apply_top_k(logits, top_k, 1500), cutoff)
        assert torch.equal(apply_top_k_top_p(logits, top_k, 1500, cutoff), expected)


# ------------------------------------------------------------------------------ the Triton sampler
def _random_seeds(g, n):
    edges = [0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
    return edges + [x * 4 + 3 for x in torch.randint(0, 2**62, (n - len(edges),), generator=g).tolist()]


@pytest.mark.parametrize("vocab", [6563, 8194])
def test_triton_sampler_hashes_and_noise_are_bit_identical_to_torch_on_cuda(vocab):
    from chorus.sampling.counter_rng import gumbel_noise
    from chorus.sampling.triton_sampler import gumbel_noise_triton, uniform_hash_triton

    g = torch.Generator().manual_seed(vocab)
    lanes = seed_lanes(torch.tensor([split_seed(s) for s in _random_seeds(g, 256)], dtype=torch.int64)).cuda()
    for steps in (torch.zeros(256, dtype=torch.int64), torch.randint(0, 2**40, (256,), generator=g)):
        steps = steps.cuda()
        assert torch.equal(uniform_hash_triton(lanes, steps, vocab), uniform_hash(lanes, steps, vocab))
        assert torch.equal(gumbel_noise_triton(lanes, steps, vocab), gumbel_noise(lanes, steps, vocab))


def _many_rows(variant, rows, g):
    """``rows`` requests cycling through mixed parameters (a fifth of them greedy), random seeds."""
    overrides = [dict(), dict(temperature=0.0), dict(temperature=1.3), dict(repetition_penalty=1.0),
                 dict(temperature=0.5)]
    if not variant.t3.supports_cfg:
        overrides += [dict(top_k=20), dict(top_p=0.3)]
    return [SamplingParams.for_variant(variant, seed=s, **overrides[i % len(overrides)])
            for i, s in enumerate(_random_seeds(g, rows))]


@pytest.mark.parametrize("variant", [EN, TURBO], ids=lambda v: v.name)
def test_triton_sampler_tokens_equal_the_torch_path_on_cuda(variant):
    """256 rows x 50 steps of processed logits (filters, greedy rows, exhausted rows): the kernel
    draws the torch path's token in every row at every step."""
    rows, vocab = 256, variant.t3.speech_vocab_size
    g = torch.Generator().manual_seed(1)
    batch = SamplingBatch.build(_many_rows(variant, rows, g), variant, "cuda")
    seen = initial_penalty_mask(variant, rows, "cuda")
    steps = torch.randint(0, 1000, (rows,), generator=g).cuda()
    for _ in range(50):
        cond = (torch.randn(rows, vocab, generator=g) * 3).cuda()
        uncond = (torch.randn(rows, vocab, generator=g) * 3).cuda() if variant.t3.supports_cfg else None
        processed = process_logits(cond, batch, seen, steps, uncond_logits=uncond)
        processed[torch.randint(0, rows, (4,), generator=g).cuda()] = float("-inf")  # exhausted rows
        expected = sample_next_tokens(processed, batch, steps, backend="torch")
        tokens = sample_next_tokens(processed, batch, steps, backend="triton")
        assert torch.equal(tokens, expected)
        record_sampled_tokens(variant, seen, tokens, steps)
        steps += 1


def test_triton_sampler_all_greedy_batch_equals_the_torch_path_on_cuda():
    params = [SamplingParams.for_variant(TURBO, temperature=0.0) for _ in range(64)]
    batch = SamplingBatch.build(params, TURBO, "cuda")
    logits = (torch.randn(64, 6563) * 3).to(torch.bfloat16).float().cuda()  # bf16 values: many ties
    logits[3] = float("-inf")
    steps = torch.zeros(64, dtype=torch.int64, device="cuda")
    tokens = sample_next_tokens(logits, batch, steps, backend="triton")
    assert torch.equal(tokens, sample_next_tokens(logits, batch, steps, backend="torch"))


def test_triton_sampler_replays_in_a_cuda_graph():
    """Captured once, the launch draws the eager path's tokens for new logits and steps."""
    rows, vocab = 8, 8194
    params = [SamplingParams.for_variant(EN, seed=100 + i, temperature=0.0 if i == 2 else 0.8) for i in range(rows)]
    batch = SamplingBatch.build(params, EN, "cuda")
    logits = torch.zeros(rows, vocab, device="cuda")
    steps = torch.zeros(rows, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sample_next_tokens(logits, batch, steps)  # warm-up: compiles the kernel outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = sample_next_tokens(logits, batch, steps)
    g = torch.Generator().manual_seed(3)
    for step in range(5):
        logits.copy_(torch.randn(rows, vocab, generator=g) * 2)
        steps.fill_(step)
        graph.replay()
        assert torch.equal(tokens, sample_next_tokens(logits, batch, steps, backend="torch"))
