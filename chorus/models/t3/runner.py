"""One request, step by step, over a contiguous KV cache: the exact reference path.

This is what the batched engine is compared against. It does not sample: the caller picks
each token (and combines the CFG rows) and feeds it back with :meth:`T3SingleSequence.decode`.
"""
from __future__ import annotations

import torch

from chorus.models.t3.alignment import AlignmentTap, QueryKeeper, alignment_heads
from chorus.models.t3.model import T3Model


class T3SingleSequence:
    """Prefill and decode of one request; with CFG two rows run side by side.

    Row 0 is conditional, row 1 (CFG only) unconditional. Each call returns the logits of the
    last position of every row, [rows, speech_vocab].
    """

    def __init__(
        self, model: T3Model, cond_embeds: torch.Tensor, text_ids: torch.Tensor, cfg: bool,
        *, max_new_tokens: int = 1000, alignment: bool = False,
    ):
        """cond_embeds: [1, C, D] from ``model.encode_conditioning``; text_ids: tokenizer
        output [Lt] (the model adds SOT/EOT where its variant needs them). ``alignment``: keep
        :attr:`alignment_map` (Llama variants only, ``chorus.models.t3.alignment``)."""
        self.model = model
        self._heads = alignment_heads(model.config.backbone) if alignment else None
        # one [1, text positions] row per query that produced a speech token (the last BOS copy,
        # then each fed token): the conditional row's attention on its framed text
        self._alignment_rows: list[torch.Tensor] = []
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
        self._text_span = (cond_embeds.shape[1], prefill_len - config.bos_copies)
        if self._heads is not None:
            self.cache.keeper = QueryKeeper(self._heads, self.rows * prefill_len, config.backbone.head_dim,
                                            dtype=model.dtype, device=model.device)
        self.tokens_fed = 0  # sampled tokens fed back so far
        self._prefilled = False

    @torch.inference_mode()
    def _run(self, embeds: torch.Tensor) -> torch.Tensor:
        """embeds [rows, n, D] -> logits of each row's last new position [rows, V]."""
        rows, n, dim = embeds.shape
        positions = self.cache.begin_step(n)
        hidden = self.model(embeds.reshape(rows * n, dim), positions, self.cache)
        if self._heads is not None:
            self._alignment_rows.append(self._alignment(positions[:n]).cpu())
        self.cache.end_step()
        return self.model.speech_logits(hidden.view(rows, n, dim)[:, -1])

    def _alignment(self, positions: torch.Tensor) -> torch.Tensor:
        """The alignment rows of row 0's new positions from the last BOS copy on (their flat
        indices are 0..n-1), from the queries the forward kept."""
        text_start, text_end = self._text_span
        first = text_end + self.model.config.bos_copies - 1
        wanted = torch.nonzero(positions >= first).flatten()
        width = int(positions[-1]) + 1
        device = positions.device
        count = len(wanted)
        tap = AlignmentTap(
            positions=positions[wanted], key_slots=torch.arange(width, device=device).expand(count, width),  # row 0
            text_start=torch.full((count,), text_start, device=device),
            text_len=torch.full((count,), text_end - text_start, device=device), max_text=text_end - text_start)
        cache = self.cache
        heads, head_dim = cache.keys.shape[-2:]
        return tap.probabilities(cache.keeper.queries(wanted), self._heads,
                                 lambda layer: (cache.keys[layer].view(-1, heads, head_dim), None))

    @property
    def alignment_map(self) -> torch.Tensor:
        """[speech tokens produced so far, text positions] (CPU, float32): row k is the mean over
        the alignment heads of the attention from the query that produced speech token k to the
        framed text (SOT and EOT included) on the conditional row."""
        assert self._heads is not None, "T3SingleSequence(alignment=True) keeps the alignment map"
        text_start, text_end = self._text_span
        return torch.cat(self._alignment_rows) if self._alignment_rows else torch.zeros(0, text_end - text_start)

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
