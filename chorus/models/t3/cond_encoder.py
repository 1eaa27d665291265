"""Conditioning encoder: the embeddings T3 sees before the text.

Layout along time: [speaker (1) | prompt | emotion (0 or 1)], where the prompt part is
either the Perceiver's fixed-size summary of the speech prompt (original, multilingual) or the
raw prompt embeddings (Turbo, Nano). Attribute names follow the checkpoint keys under
``cond_enc.``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chorus.models.t3.backbone import Shapes
from chorus.models.variants import T3Config


class PerceiverAttention(nn.Module):
    """Pre-norm multi-head attention block with a residual on the query stream.

    One LayerNorm serves both streams; q comes from the query stream, k and v from the
    context stream. No mask, no positions.
    """

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        assert dim % num_heads == 0
        self.num_heads = num_heads
        self.norm = nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.proj_out = nn.Linear(dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        return x.view(batch, length, self.num_heads, dim // self.num_heads).transpose(1, 2)

    def forward(self, query: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        q_in, kv_in = self.norm(query), self.norm(context)
        q, k, v = self._split(self.to_q(q_in)), self._split(self.to_k(kv_in)), self._split(self.to_v(kv_in))
        out = F.scaled_dot_product_attention(q, k, v)
        batch, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, length, -1)
        return query + self.proj_out(out)


class Perceiver(nn.Module):
    """Resamples a variable-length prompt to ``num_queries`` embeddings.

    The same attention block runs twice (shared weights): learned queries attend to the
    prompt, then the result attends to itself.
    """

    def __init__(self, num_queries: int, dim: int, num_heads: int):
        super().__init__()
        self.pre_attention_query = nn.Parameter(torch.zeros(1, num_queries, dim))
        self.attn = PerceiverAttention(dim, num_heads)

    def forward(self, prompt: torch.Tensor) -> torch.Tensor:
        queries = self.pre_attention_query.expand(prompt.shape[0], -1, -1)
        summary = self.attn(queries, prompt)
        return self.attn(summary, summary)


class T3CondEncoder(nn.Module):
    def __init__(self, config: T3Config):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.spkr_enc = nn.Linear(config.speaker_embed_size, d)
        self.emotion_adv_fc = nn.Linear(1, d, bias=False) if config.emotion_adv else None
        self.perceiver = (
            Perceiver(config.perceiver_queries, d, config.perceiver_heads)
            if config.use_perceiver else None
        )

    def forward(
        self, speaker_emb: torch.Tensor, prompt_embeds: torch.Tensor | None,
        exaggeration: float | None,
    ) -> torch.Tensor:
        """speaker_emb [B, S]; prompt_embeds [B, P, D] (speech embeddings of the prompt tokens,
        positions included where the variant has them) or None; exaggeration is required
        exactly when the variant has an emotion token. Returns [B, C, D]."""
        speaker = self.spkr_enc(speaker_emb.reshape(-1, self.config.speaker_embed_size))[:, None]
        parts = [speaker]
        if prompt_embeds is not None:
            parts.append(self.perceiver(prompt_embeds) if self.perceiver is not None else prompt_embeds)
        if self.emotion_adv_fc is not None:
            if exaggeration is None:
                raise ValueError("this variant needs an exaggeration value")
            value = torch.full(
                (speaker.shape[0], 1, 1), float(exaggeration),
                dtype=speaker.dtype, device=speaker.device,
            )
            parts.append(self.emotion_adv_fc(value))
        return torch.cat(parts, dim=1)

    @staticmethod
    def checkpoint_shapes(config: T3Config) -> Shapes:
        """Every key below ``cond_enc.`` -> shape."""
        d = config.hidden_size
        shapes: Shapes = {
            "spkr_enc.weight": (d, config.speaker_embed_size),
            "spkr_enc.bias": (d,),
        }
        if config.emotion_adv:
            shapes["emotion_adv_fc.weight"] = (d, 1)
        if config.use_perceiver:
            shapes["perceiver.pre_attention_query"] = (1, config.perceiver_queries, d)
            shapes["perceiver.attn.norm.weight"] = (d,)
            shapes["perceiver.attn.norm.bias"] = (d,)
            for name in ("to_q", "to_k", "to_v", "proj_out"):
                shapes[f"perceiver.attn.{name}.weight"] = (d, d)
                shapes[f"perceiver.attn.{name}.bias"] = (d,)
        return shapes
