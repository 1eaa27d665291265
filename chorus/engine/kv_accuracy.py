"""What an FP8 KV cache costs in accuracy: the logits with it against the model-dtype cache.

One row is prefilled and then decoded for a few steps through two paged caches side by side,
one in the model's dtype (bf16 on GPU) and one in FP8 with the engine's static scales. Both
are fed the same tokens (greedy from the model-dtype logits, so the two never diverge in
their inputs and every step compares like with like), and each step's speech logits are
compared by cosine similarity (in fp32) and by their top-1 token. The attention backend is
the engine's (Triton kernels on CUDA), so the measurement covers the code that serves.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from chorus.engine.kv_quant import DEFAULT_KV_SCALE_RULE, kv_scales, synthetic_prompt
from chorus.engine.paged_cache import AttentionMetadata, PagedKVCache, resolve_kv_cache_dtype
from chorus.models.t3.model import T3Model


@dataclass(frozen=True)
class KVAccuracy:
    """Per compared step (the prefill's last position, then each decode step): the cosine of
    the logits and whether the top-1 tokens agree."""

    kv_cache_dtype: str
    scale_rule: str
    cosines: tuple[float, ...]
    top1_agree: tuple[bool, ...]

    @property
    def min_cosine(self) -> float:
        return min(self.cosines)

    @property
    def mean_cosine(self) -> float:
        return sum(self.cosines) / len(self.cosines)

    @property
    def top1_agreement(self) -> float:
        return sum(self.top1_agree) / len(self.top1_agree)

    def as_dict(self) -> dict:
        return {"kv_cache_dtype": self.kv_cache_dtype, "scale_rule": self.scale_rule,
                "steps": len(self.cosines), "logits_cosine_min": round(self.min_cosine, 6),
                "logits_cosine_mean": round(self.mean_cosine, 6),
                "top1_agreement": round(self.top1_agreement, 4)}


def _logits(model: T3Model, cache: PagedKVCache, embeds: torch.Tensor, start: int, blocks: int) -> torch.Tensor:
    count = embeds.shape[0]
    cache.metadata = AttentionMetadata.single_row(start, count, blocks, model.device)
    positions = torch.arange(start, start + count, device=model.device)
    hidden = model(embeds, positions, cache)
    cache.metadata = None
    return model.speech_logits(hidden[-1:]).float()[0]


@torch.inference_mode()
def measure_kv_accuracy(model: T3Model, prompt_embeds: torch.Tensor | None = None, *,
                        kv_cache_dtype: str = "fp8_e4m3", scale_rule: str = DEFAULT_KV_SCALE_RULE,
                        decode_steps: int = 8, block_size: int = 16,
                        attention_backend: str = "auto") -> KVAccuracy:
    """Logits through a ``kv_cache_dtype`` cache against the model-dtype cache.

    prompt_embeds: ``[L, D]`` (e.g. ``model.prefill_embeds(cond, text_ids, cfg=False)[0]``);
    None takes ``kv_quant.synthetic_prompt`` with another seed than the calibration's.
    Compares ``1 + decode_steps`` logits: the prompt's last position, then each decode step.
    """
    if prompt_embeds is None:
        prompt_embeds = synthetic_prompt(model, seed=1)
    prompt_embeds = prompt_embeds.to(device=model.device, dtype=model.dtype)
    assert prompt_embeds.ndim == 2, "prompt_embeds is one row: [L, D]"
    cfg, bb = model.config, model.config.backbone
    length = prompt_embeds.shape[0]
    if length + decode_steps > bb.max_positions:
        raise ValueError(f"prompt of {length} positions + {decode_steps} decode steps exceeds the "
                         f"model's {bb.max_positions} positions")
    blocks = -(-(length + decode_steps) // block_size)
    dtype = resolve_kv_cache_dtype(kv_cache_dtype, model.dtype)
    caches = [PagedKVCache(bb.num_layers, blocks, block_size, bb.num_kv_heads, bb.head_dim, dtype=d,
                           device=model.device, backend=attention_backend) for d in (model.dtype, dtype)]
    if caches[1].quantized:
        caches[1].set_kv_scales(kv_scales(model, scale_rule))
    ref, test = (_logits(model, c, prompt_embeds, 0, blocks) for c in caches)
    cosines, agree = [], []
    for step in range(decode_steps + 1):
        cosines.append(float(torch.nn.functional.cosine_similarity(ref, test, dim=0)))
        agree.append(bool(ref.argmax() == test.argmax()))
        if step == decode_steps:
            break
        token = ref[: cfg.num_speech_codes].argmax().reshape(1)
        speech_pos = torch.tensor([step + 1], device=model.device)
        embeds = model.speech_embeds(token, speech_pos if cfg.learned_positions else None).to(model.dtype)
        ref, test = (_logits(model, c, embeds, length + step, blocks) for c in caches)
    return KVAccuracy(kv_cache_dtype, scale_rule, tuple(cosines), tuple(agree))
