"""Runs one scheduled step of T3 over the paged KV cache and samples the next tokens.

Input preparation: every position of a row is either a prompt position (its embedding comes
from the request's precomputed prompt embeddings: conditioning, text, BOS copies; the
unconditional CFG row has its own) or a generated speech token (``speech_emb(token)`` plus, for
variants with learned positions, ``speech_pos_emb(i + 1)`` for the i-th generated token). RoPE /
``wpe`` positions are simply the position in the row. Decode-only steps can replay a captured
CUDA graph (``CudaGraphDecoder``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from chorus.engine.paged_cache import AttentionMetadata, PagedKVCache
from chorus.engine.request import Branch, Request
from chorus.engine.scheduler import SchedulerOutput
from chorus.models.t3.model import T3Model
from chorus.models.variants import Variant
from chorus.sampling import (
    NO_TOKEN, SamplingBatch, SamplingParams, initial_penalty_mask, process_logits, record_sampled_tokens,
    sample_next_tokens,
)


@dataclass
class RequestTensors:
    """Per-request device state kept by the runner while the request lives."""

    prompt_embeds: torch.Tensor  # [rows, L, D]
    seen_mask: torch.Tensor  # [1, V] repetition-penalty set
    params: SamplingParams


@dataclass
class StepInputs:
    embeds: torch.Tensor  # [N, D]
    positions: torch.Tensor  # [N]
    metadata: AttentionMetadata
    logits_index: torch.Tensor  # [rows needing logits] index of their last token in the flat batch
    num_tokens: int


class ModelRunner:
    """Owns the model, the paged cache and per-request tensors; turns a ``SchedulerOutput``
    into sampled tokens."""

    def __init__(self, model: T3Model, variant: Variant, cache: PagedKVCache):
        self.model = model
        self.variant = variant
        self.cache = cache
        self.device = model.device
        self.block_size = cache.block_size
        self.requests: dict[str, RequestTensors] = {}
        self.graphs = None  # a CudaGraphDecoder, set by the engine on CUDA

    # -- request lifetime ------------------------------------------------------------------------
    def add_request(self, request_id: str, cond_embeds: torch.Tensor, text_ids: torch.Tensor,
                    cfg: bool, params: SamplingParams) -> None:
        with torch.inference_mode():
            embeds = self.model.prefill_embeds(cond_embeds, text_ids, cfg=cfg)
        self.requests[request_id] = RequestTensors(
            prompt_embeds=embeds, seen_mask=initial_penalty_mask(self.variant, 1, device=self.device),
            params=params,
        )

    def remove_request(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    # -- one step --------------------------------------------------------------------------------
    def prepare(self, out: SchedulerOutput) -> StepInputs:
        """Host-side assembly of embeddings, positions and attention metadata."""
        model, bs = self.model, self.block_size
        pieces: list[tuple[str, object]] = []
        speech_tokens: list[int] = []
        speech_positions: list[int] = []
        positions: list[np.ndarray] = []
        slots: list[np.ndarray] = []
        seq_lens, q_lens, tables = [], [], []
        for row in out.rows:
            request: Request = out.requests[row.request_id]
            state = self.requests[row.request_id]
            prompt_len = state.prompt_embeds.shape[1]
            start, end = row.start, row.end
            if start < prompt_len:
                branch = 0 if row.branch is Branch.COND else 1
                pieces.append(("prompt", state.prompt_embeds[branch, start:min(end, prompt_len)]))
            if end > prompt_len:
                first = max(start, prompt_len)
                count = end - first
                pieces.append(("speech", (len(speech_tokens), count)))
                for pos in range(first, end):
                    generated = pos - prompt_len
                    speech_tokens.append(request.output_tokens[generated])
                    speech_positions.append(generated + 1)
            pos = np.arange(start, end, dtype=np.int64)
            table = np.asarray(row.block_table, dtype=np.int64)
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            seq_lens.append(end)
            q_lens.append(end - start)
            tables.append(row.block_table)

        speech = None
        if speech_tokens:
            tok = torch.tensor(speech_tokens, dtype=torch.long).to(self.device, non_blocking=True)
            sp = torch.tensor(speech_positions, dtype=torch.long).to(self.device, non_blocking=True)
            speech = model.speech_embeds(tok, sp)
        parts = [p if kind == "prompt" else speech[p[0]:p[0] + p[1]] for kind, p in pieces]
        embeds = parts[0] if len(parts) == 1 else torch.cat(parts)

        max_blocks = max(len(t) for t in tables)
        table_array = np.zeros((len(tables), max_blocks), dtype=np.int32)
        for i, t in enumerate(tables):
            table_array[i, :len(t)] = t
        q_start = np.zeros(len(q_lens) + 1, dtype=np.int32)
        np.cumsum(q_lens, out=q_start[1:])
        num_decodes = 0
        while num_decodes < len(q_lens) and q_lens[num_decodes] == 1:
            num_decodes += 1
        to_dev = lambda a: torch.from_numpy(a).to(self.device, non_blocking=True)  # noqa: E731
        metadata = AttentionMetadata(
            slot_mapping=to_dev(np.concatenate(slots)),
            block_tables=to_dev(table_array),
            seq_lens=to_dev(np.asarray(seq_lens, dtype=np.int32)),
            query_start_loc=to_dev(q_start),
            max_query_len=max(q_lens), max_seq_len=max(seq_lens), num_decodes=num_decodes,
        )
        logits_rows = out.logits_rows()
        logits_index = to_dev(q_start[1:][logits_rows].astype(np.int64) - 1)
        return StepInputs(embeds=embeds, positions=to_dev(np.concatenate(positions)),
                          metadata=metadata, logits_index=logits_index, num_tokens=int(q_start[-1]))

    @torch.inference_mode()
    def forward_logits(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [rows needing logits, V] in fp32."""
        if self.graphs is not None and self.graphs.can_run(inputs):
            return self.graphs.run(inputs)
        self.cache.metadata = inputs.metadata
        hidden = self.model(inputs.embeds, inputs.positions, self.cache)
        self.cache.metadata = None
        return self.model.speech_logits(hidden[inputs.logits_index]).float()

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[str, int]:
        """Compute ``out`` and sample one token for every request whose logits were needed.
        Returns ``{request_id: token}``; ``NO_TOKEN`` marks a request with no finite logit."""
        if out.is_empty:
            return {}
        inputs = self.prepare(out)
        logits = self.forward_logits(inputs)
        rows = [out.rows[i] for i in out.logits_rows()]
        # rows needing logits: one per plain request, two adjacent ones per CFG pair
        cond_idx, uncond_idx, request_ids = [], [], []
        for i, row in enumerate(rows):
            if row.branch is Branch.COND:
                cond_idx.append(i)
                uncond_idx.append(i)  # replaced below for CFG pairs
                request_ids.append(row.request_id)
            else:
                uncond_idx[-1] = i
        if not request_ids:
            return {}
        states = [self.requests[r] for r in request_ids]
        dev = self.device
        cond = logits[torch.tensor(cond_idx, device=dev)]
        uncond = logits[torch.tensor(uncond_idx, device=dev)] if len(rows) > len(request_ids) else None
        batch = SamplingBatch.build([s.params for s in states], self.variant, device=dev)
        steps = torch.tensor([len(out.requests[r].output_tokens) for r in request_ids],
                             dtype=torch.int64).to(dev, non_blocking=True)
        seen = torch.cat([s.seen_mask for s in states])
        processed = process_logits(cond, batch, seen, steps, uncond_logits=uncond)
        tokens = sample_next_tokens(processed, batch, steps)
        record_sampled_tokens(self.variant, seen, tokens, steps)
        for i, state in enumerate(states):
            state.seen_mask = seen[i:i + 1]
        values = tokens.tolist()  # the step's one host sync
        return {rid: (NO_TOKEN if v == NO_TOKEN else int(v)) for rid, v in zip(request_ids, values)}
