"""Static per-layer scales of an FP8 KV cache, and the synthetic prompt that calibrates them.

An FP8 e4m3 pool stores ``fp8(x / scale)`` and reads ``fp8 * scale``, with one fp32 scale per
layer for K and one for V. e4m3 is a float format (3 mantissa bits, finite range 2^-9 ..
448), so the scale does not change the relative rounding error of values inside the range; it
only moves the range: too small a scale saturates large values at 448 * scale, too large a
scale flushes small ones to zero. Two static rules:

- ``"calibrated"`` (the default): one forward of a synthetic prompt built from the model's own
  tables (a random voice's conditioning, random text, BOS and random speech tokens, each with
  its learned positions, fixed seed) records max |k| and max |v| per layer, and the scale is
  ``amax * CALIBRATION_MARGIN / 448`` rounded UP to a power of two: the largest value seen
  lands at or below ``448 / CALIBRATION_MARGIN`` (headroom for larger values in real prompts),
  and dividing by a power of two is exact, so inside e4m3's range the stored values round
  exactly as with scale 1.0 while the range itself follows the layer. Deterministic (same
  model, same scales), computed once when the engine is built.
- ``"unit"``: every scale 1.0, the usual default of engines without calibration data. Exact
  for values in [2^-6, 448] up to rounding, but a layer whose K/V are small loses them to
  subnormals and a layer with outliers above 448 saturates. Measured on random-weight models
  it is as accurate as a non-power-of-two calibrated scale (docs/engine.md): e4m3 being a
  float format, an arbitrary scale only reshuffles which values round up or down.

Scales never change while serving: CUDA graphs read them from device memory, and a request's
tokens never depend on what else ran before it. ``chorus.engine.kv_accuracy`` measures both
rules (docs/engine.md, "FP8 KV cache").
"""
from __future__ import annotations

import torch

from chorus.engine.attention.reference import FP8_E4M3_MAX
from chorus.engine.paged_cache import AttentionMetadata, PagedKVCache
from chorus.models.t3.model import T3Model

KV_SCALE_RULES = ("calibrated", "unit")
DEFAULT_KV_SCALE_RULE = "calibrated"
CALIBRATION_MARGIN = 2.0
# a layer whose calibration K or V is all zeros still gets a usable (tiny, positive) scale
_MIN_AMAX = 1e-6


def synthetic_prompt(model: T3Model, *, seed: int = 0, text_tokens: int = 64, prompt_tokens: int = 150,
                     speech_tokens: int = 64) -> torch.Tensor:
    """[L, D] embeddings of a request as the model sees it, from random ids and a random voice:
    conditioning (a unit-norm speaker embedding and ``prompt_tokens`` random speech codes, or
    fewer where the model's tables are shorter), framed random text, BOS, then
    ``speech_tokens`` random generated speech tokens fed back as in decoding."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    speaker = torch.rand(1, cfg.speaker_embed_size, generator=gen)
    speaker = speaker / speaker.norm()
    limit = cfg.speech_pos_rows if cfg.learned_positions else cfg.backbone.max_positions
    prompt = torch.randint(0, cfg.num_speech_codes, (1, min(prompt_tokens, cfg.speech_cond_prompt_len, limit // 4)),
                           generator=gen)
    with torch.inference_mode():
        cond = model.encode_conditioning(speaker, prompt, 0.5)
        text = torch.randint(1, cfg.text_vocab_size, (text_tokens,), generator=gen)
        prefill = model.prefill_embeds(cond, text, cfg=False)[0]
        tokens = torch.randint(0, cfg.num_speech_codes, (speech_tokens,), generator=gen).to(model.device)
        positions = torch.arange(1, speech_tokens + 1, device=model.device)
        speech = model.speech_embeds(tokens, positions if cfg.learned_positions else None)
        embeds = torch.cat([prefill, speech.to(prefill.dtype)])
    return embeds[: cfg.backbone.max_positions]


def observe_kv_amax(model: T3Model, embeds: torch.Tensor, block_size: int = 16) -> torch.Tensor:
    """Max |k| and max |v| per layer ``[layers, 2]`` (fp32, on the model's device) over one
    causal forward of ``embeds [L, D]`` as a single row, on a scratch cache in the model's dtype."""
    bb = model.config.backbone
    length = embeds.shape[0]
    blocks = -(-length // block_size)
    device = model.device
    scratch = PagedKVCache(bb.num_layers, blocks, block_size, bb.num_kv_heads, bb.head_dim,
                           dtype=model.dtype, device=device)
    scratch.observed_amax = torch.zeros(bb.num_layers, 2, dtype=torch.float32, device=device)
    scratch.metadata = AttentionMetadata.single_row(0, length, blocks, device)
    with torch.inference_mode():
        model(embeds.to(device=device, dtype=model.dtype), torch.arange(length, device=device), scratch)
    return scratch.observed_amax.clone()


def kv_scales(model: T3Model, rule: str = DEFAULT_KV_SCALE_RULE) -> torch.Tensor:
    """The static scales ``[layers, 2]`` (fp32, on the model's device) of ``rule``."""
    if rule not in KV_SCALE_RULES:
        raise ValueError(f"kv scale rule must be one of {KV_SCALE_RULES}, got {rule!r}")
    layers = model.config.backbone.num_layers
    if rule == "unit":
        return torch.ones(layers, 2, dtype=torch.float32, device=model.device)
    amax = observe_kv_amax(model, synthetic_prompt(model))
    return power_of_two_at_least(amax.clamp_min(_MIN_AMAX) * (CALIBRATION_MARGIN / FP8_E4M3_MAX))


def power_of_two_at_least(x: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= x, elementwise (x > 0, fp32)."""
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2^exponent, mantissa in [0.5, 1)
    return torch.ldexp(torch.ones_like(x), torch.where(mantissa == 0.5, exponent - 1, exponent))
