"""Per-row sampling parameters of one batch as device tensors.

Build a ``SamplingBatch`` when the batch composition changes (rows admitted, finished,
preempted or reordered) and reuse it for every decode step in between: building costs a few
host-to-device copies, using it costs nothing on the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from chorus.models.variants import SamplingStep, Variant
from chorus.sampling.counter_rng import seed_lanes, split_seed
from chorus.sampling.params import SamplingParams

# Stored for rows that never allow EOS (ignore_eos): no step count reaches it.
_NEVER = 2**62


@dataclass(frozen=True)
class SamplingBatch:
    """Row r of every tensor belongs to the r-th request; one variant (one order) per batch.

    Rows whose parameter turns a step off carry a neutral value for it (temperature 1,
    min_p 0, top_k 0, top-p cutoff -1, penalty 1, cfg 0), so that row passes through the step
    unchanged. Greedy rows carry neutral values for temperature, min-p, top-k and top-p.
    """

    order: tuple[SamplingStep, ...]
    eos_token_id: int
    cfg_weight: Tensor  # [R, 1] fp32
    repetition_penalty: Tensor  # [R, 1] fp32
    temperature: Tensor  # [R, 1] fp32
    min_p: Tensor  # [R, 1] fp32
    top_k: Tensor  # [R] int64
    top_p_cutoff: Tensor  # [R, 1] fp32: 1 - top_p (computed in float64, as the reference does)
    greedy: Tensor  # [R] bool
    min_new_tokens: Tensor  # [R] int64; EOS banned while step < this
    seed_lanes: Tensor  # [R, 2] int64 (uint32 values), see counter_rng
    # Host-side summary, so steps no row needs are skipped without looking at device values.
    active_steps: frozenset[SamplingStep]
    max_top_k: int
    bans_eos: bool
    any_greedy: bool
    all_greedy: bool
    # top-p directly follows top-k and every row with top-p on has k > 0: the nucleus is taken
    # over the top-k candidates, without sorting the vocabulary (``apply_top_k_top_p``)
    top_p_in_top_k: bool

    @property
    def num_rows(self) -> int:
        return int(self.greedy.shape[0])

    @property
    def device(self) -> torch.device:
        return self.greedy.device

    @classmethod
    def build(cls, params: Sequence[SamplingParams], variant: Variant,
              device: torch.device | str = "cpu") -> SamplingBatch:
        """Tensors for ``params`` (one per row, in row order) served by ``variant``.

        Raises ValueError if a row sets a parameter the variant does not run; build requests'
        parameters with ``SamplingParams.for_variant`` to avoid that.
        """
        if not params:
            raise ValueError("a SamplingBatch needs at least one row")
        for row, p in enumerate(params):
            unsupported = p.unsupported_by(variant)
            if unsupported:
                raise ValueError(
                    f"row {row}: variant {variant.name} does not support {unsupported}; "
                    "build the parameters with SamplingParams.for_variant(variant, ...)")
        order = variant.sampling.order
        assert "cfg" not in order or order[0] == "cfg", f"CFG must come first, got {order}"
        sampled = [not p.greedy for p in params]

        def floats(values: list[float]) -> Tensor:
            return torch.tensor(values, dtype=torch.float32).unsqueeze(1).to(device)

        temperature = [p.temperature if s else 1.0 for p, s in zip(params, sampled)]
        min_p = [p.min_p if s else 0.0 for p, s in zip(params, sampled)]
        top_k = [p.top_k if s else 0 for p, s in zip(params, sampled)]
        top_p = [p.top_p if s else 1.0 for p, s in zip(params, sampled)]
        cfg = [p.cfg_weight for p in params]
        penalty = [p.repetition_penalty for p in params]
        shortest = [_NEVER if p.ignore_eos else p.min_new_tokens for p in params]

        active: set[SamplingStep] = set()
        for step, values, off in (
            ("cfg", cfg, 0.0), ("repetition_penalty", penalty, 1.0), ("temperature", temperature, 1.0),
            ("min_p", min_p, 0.0), ("top_k", top_k, 0), ("top_p", top_p, 1.0),
        ):
            if step in order and any(v != off for v in values):
                active.add(step)  # type: ignore[arg-type]

        ran = [s for s in order if s in active]
        top_p_in_top_k = ("top_k" in active and "top_p" in active
                          and ran.index("top_p") == ran.index("top_k") + 1
                          and all(k > 0 for k, p in zip(top_k, top_p) if p < 1.0))

        seed_words = np.array([split_seed(p.seed) for p in params], dtype=np.int64)
        return cls(
            order=order,
            eos_token_id=variant.t3.stop_speech_token,
            cfg_weight=floats(cfg),
            repetition_penalty=floats(penalty),
            temperature=floats(temperature),
            min_p=floats(min_p),
            top_k=torch.tensor(top_k, dtype=torch.int64).to(device),
            top_p_cutoff=floats([1.0 - p if p < 1.0 else -1.0 for p in top_p]),
            greedy=torch.tensor([not s for s in sampled], dtype=torch.bool).to(device),
            min_new_tokens=torch.tensor(shortest, dtype=torch.int64).to(device),
            seed_lanes=torch.from_numpy(seed_lanes(seed_words)).to(device),
            active_steps=frozenset(active),
            max_top_k=max(top_k),
            bans_eos=any(s > 0 for s in shortest),
            any_greedy=not all(sampled),
            all_greedy=not any(sampled),
            top_p_in_top_k=top_p_in_top_k,
        )
