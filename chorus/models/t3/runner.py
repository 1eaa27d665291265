"""One request, step by step, over a contiguous KV cache: the exact reference path.

This is what the batched engine is compared against. It does not sample: the caller picks
each token (and combines the CFG rows) and feeds it back with :meth:`T3SingleSequence.decode`.
"""
from __future__ import annotations

import torch

from chorus.models.t3.model import T3Model


class T3SingleSequence:
    """Prefill and decode of one request; with CFG two rows run side by side.

    Row 0 is conditional, row 1 (CFG only) unconditional. Each call returns the logits of the
    last position of every row, [rows, speech_vocab].
    """

    def __init__(
        self, model: T3Model, cond_embeds: torch.Tensor, text_ids: torch.Tensor, cfg: bool,
        *, max_new_tokens: int = 1000,
    ):
        """cond_embeds: [1, C, D] from ``model.encode_conditioning``; text_ids: tokenizer
        output [Lt] (the model adds SOT/EOT where its variant needs them)."""
        self.model = model
        self.rows = 2 if cfg else 1
        with torch.inference_mode():
            self._prefill_embeds = model.prefill_embeds(cond_embeds, text_ids, cfg=cfg)
        prefill_len = self._prefill_embeds.shape[1]
        config = model.config
        if model.speech_pos_emb is not None and max_new_tokens >= model.speech_pos_emb.rows:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} exceeds the {model.speech_pos_emb.rows - 1} "
                "speech positions this model can feed back"
            )
        if prefill_len + max_new_tokens > config.backbone.max_positions:
            raise ValueError(
                f"{prefill_len} prompt + {max_new_tokens} new tokens exceed the model's "
                f"{config.backbone.max_positions} positions"
            )
        self.max_new_tokens = max_new_tokens
        self.cache = model.new_contiguous_cache(self.rows, prefill_len + max_new_tokens)
        self.tokens_fed = 0  # sampled tokens fed back so far
        self._prefilled = False

    @torch.inference_mode()
    def _run(self, embeds: torch.Tensor) -> torch.Tensor:
        """embeds [rows, n, D] -> logits of each row's last new position [rows, V]."""
        rows, n, dim = embeds.shape
        positions = self.cache.begin_step(n)
        hidden = self.model(embeds.reshape(rows * n, dim), positions, self.cache)
        self.cache.end_step()
        return self.model.speech_logits(hidden.view(rows, n, dim)[:, -1])

    def prefill(self) -> torch.Tensor:
        """Run [cond | text | BOS]; returns the logits for the first speech token [rows, V]."""
        assert not self._prefilled, "prefill runs once"
        self._prefilled = True
        return self._run(self._prefill_embeds)

    def decode(self, token: int) -> torch.Tensor:
        """Feed the token chosen from the previous logits to every row; returns the next
        logits [rows, V]."""
        assert self._prefilled, "decode before prefill"
        if self.tokens_fed >= self.max_new_tokens:
            raise ValueError(f"already fed max_new_tokens={self.max_new_tokens} tokens")
        model = self.model
        tokens = torch.tensor([token], dtype=torch.long, device=model.device)
        speech_positions = torch.tensor([self.tokens_fed + 1], dtype=torch.long, device=model.device)
        with torch.inference_mode():
            embed = model.speech_embeds(tokens, speech_positions)
        self.tokens_fed += 1
        return self._run(embed.expand(self.rows, 1, -1))
