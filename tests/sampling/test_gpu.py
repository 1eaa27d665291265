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
