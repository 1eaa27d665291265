"""What FP8 linears cost in accuracy, set beside what bf16 already costs.

One request's conditional row (its voice and text prompt) is run teacher-forced through three
forwards of the same weights: (a) fp32, (b) the low-precision dtype (bf16), (c) that dtype with
FP8 linears (``Backbone.use_fp8``). The tokens fed after the prompt are the greedy choices of (a),
so the three never diverge in their inputs and every step compares like with like. Each
compared step (the prompt's last position, then each decode step) gives three speech-logit
vectors, compared by cosine similarity (in fp32) and by their top-1 token.

The rule (docs/engine.md, "FP8 linears"): FP8 is within the error we already accept when its
distance from bf16 is no larger than bf16's from fp32, i.e. cosine(c, b) >= cosine(b, a) in
mean and in min over the steps, and the top-1 agreement of c with b >= that of b with a.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from chorus.models.loading import dtype_name
from chorus.models.t3.model import T3Model


def _cosines(x: torch.Tensor, y: torch.Tensor) -> tuple[float, ...]:
    return tuple(torch.nn.functional.cosine_similarity(x, y, dim=-1).tolist())


def _agreement(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x.argmax(dim=-1) == y.argmax(dim=-1)).float().mean())


def _summary(cosines: tuple[float, ...]) -> dict:
    return {"mean": round(sum(cosines) / len(cosines), 6), "min": round(min(cosines), 6)}


@dataclass(frozen=True)
class Fp8Error:
    """Per compared step, the logits cosines of the three pairs; and the top-1 agreement rates."""

    low_dtype: str
    cosine_low_vs_fp32: tuple[float, ...]  # cosine(b, a)
    cosine_fp8_vs_fp32: tuple[float, ...]  # cosine(c, a)
    cosine_fp8_vs_low: tuple[float, ...]  # cosine(c, b)
    agreement_low_vs_fp32: float  # agreement(b, a)
    agreement_fp8_vs_low: float  # agreement(c, b)
    agreement_fp8_vs_fp32: float  # agreement(c, a)

    @property
    def within_low_precision_error(self) -> bool:
        """The rule: FP8 is no farther from bf16 than bf16 is from fp32 (cosine mean and min,
        top-1 agreement)."""
        fp8, low = _summary(self.cosine_fp8_vs_low), _summary(self.cosine_low_vs_fp32)
        return (fp8["mean"] >= low["mean"] and fp8["min"] >= low["min"]
                and self.agreement_fp8_vs_low >= self.agreement_low_vs_fp32)

    def as_dict(self) -> dict:
        low = self.low_dtype
        return {"steps": len(self.cosine_fp8_vs_low), "low_dtype": low,
                f"cosine_{low}_vs_fp32": _summary(self.cosine_low_vs_fp32),
                "cosine_fp8_vs_fp32": _summary(self.cosine_fp8_vs_fp32),
                f"cosine_fp8_vs_{low}": _summary(self.cosine_fp8_vs_low),
                f"top1_agreement_{low}_vs_fp32": round(self.agreement_low_vs_fp32, 4),
                f"top1_agreement_fp8_vs_{low}": round(self.agreement_fp8_vs_low, 4),
                "top1_agreement_fp8_vs_fp32": round(self.agreement_fp8_vs_fp32, 4),
                f"within_{low}_error": self.within_low_precision_error,
                "rule": f"cosine(fp8, {low}) >= cosine({low}, fp32) in mean and min, and top-1 agreement "
                        f"(fp8, {low}) >= ({low}, fp32)"}


def teacher_forced_logits(model: T3Model, prompt: torch.Tensor, steps: int,
                          tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speech logits [1 + steps, vocab] (fp32) of the prompt's last position and of ``steps``
    tokens fed after it, and those tokens [steps]: ``tokens`` when given, else the greedy
    speech codes of these logits."""
    cfg = model.config
    cache = model.new_contiguous_cache(rows=1, max_len=prompt.shape[0] + steps)
    embeds, out, fed = prompt.to(device=model.device, dtype=model.dtype), [], []
    for step in range(steps + 1):
        positions = cache.begin_step(embeds.shape[0])
        logits = model.speech_logits(model(embeds, positions, cache)[-1]).float()
        cache.end_step()
        out.append(logits)
        if step == steps:
            break
        token = (logits[: cfg.num_speech_codes].argmax() if tokens is None else tokens[step]).reshape(1)
        fed.append(token)
        speech_pos = torch.tensor([step + 1], device=model.device)
        embeds = model.speech_embeds(token.to(model.device), speech_pos if cfg.learned_positions else None)
        embeds = embeds.to(model.dtype)
    return torch.stack(out), torch.cat(fed) if fed else torch.zeros(0, dtype=torch.long)


@torch.inference_mode()
def measure_fp8_error(exact: T3Model, low: T3Model, prompt_of: Callable[[T3Model], torch.Tensor],
                      decode_steps: int = 64) -> Fp8Error:
    """``exact``: the model in fp32; ``low``: the same weights in bf16 (or fp16), whose FP8
    linears are switched on for (c) and off again after. ``prompt_of(model)``: the request's
    prompt embeddings [L, D] as that model computes them (its conditioning included)."""
    assert exact.dtype == torch.float32 and low.dtype != torch.float32, (exact.dtype, low.dtype)
    prompt, max_positions = prompt_of(exact), exact.config.backbone.max_positions
    if prompt.shape[0] + decode_steps > max_positions:
        raise ValueError(f"a prompt of {prompt.shape[0]} positions + {decode_steps} decode steps exceeds the "
                         f"model's {max_positions} positions")
    a, tokens = teacher_forced_logits(exact, prompt, decode_steps)
    low_prompt = prompt_of(low)
    b, _ = teacher_forced_logits(low, low_prompt, decode_steps, tokens)
    low.tfmr.use_fp8(True)
    try:
        c, _ = teacher_forced_logits(low, low_prompt, decode_steps, tokens)
    finally:
        low.tfmr.use_fp8(False)
    a, b, c = (x.cpu() for x in (a, b, c))
    return Fp8Error(dtype_name(low.dtype), _cosines(b, a), _cosines(c, a), _cosines(c, b),
                    _agreement(b, a), _agreement(c, b), _agreement(c, a))
