"""Runs one scheduled step of T3 over the paged KV cache and samples the next tokens.

Input preparation: every position of a row is either a prompt position (its embedding comes
from the request's precomputed prompt embeddings: conditioning, text, BOS copies; the
unconditional CFG row has its own) or a generated speech token (``speech_emb(token)`` plus, for
variants with learned positions, ``speech_pos_emb(i + 1)`` for the i-th generated token). RoPE /
``wpe`` positions are simply the position in the row. Decode steps, and steps that admit a few
prompts beside them, can replay a captured CUDA graph (``StepGraphs``); on CUDA the sampling
step replays one too (``SamplerGraphs``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from chorus import faults
from chorus.engine.attention import SharedPrefixPlan, SharedPrefixTensors, plan_shared_prefixes
from chorus.engine.paged_cache import AttentionMetadata, PagedKVCache
from chorus.engine.request import Branch
from chorus.engine.sampler_graphs import SamplerGraphs
from chorus.engine.scheduler import SchedulerOutput
from chorus.models.t3.alignment import AlignmentTap, QueryKeeper, alignment_heads
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
class _SamplingState:
    key: tuple
    batch: SamplingBatch
    seen: torch.Tensor  # [R, V] penalty masks of the requests in ``key``, updated in place
    steps: torch.Tensor  # [R] tokens generated so far
    cond_index: torch.Tensor | None
    uncond_index: torch.Tensor | None
    # the state lives in ``SamplerGraphs``' static buffers: ``seen`` and ``steps`` are views
    # there (the graph advances the steps), the indices are None, and ``batch`` is a host copy
    graphed: bool = False


# When decode rows read their shared prefix once per group (chorus.engine.attention.shared_prefix):
# from this many decode rows, with at most this many groups (the CUDA graphs' fixed bound), and
# when grouping saves at least this many prefix K/V token reads per layer and head. Measured on
# an H200 (benchmarks/results/shared-prefix-h200-2026-12-01.json): 8 rows x 400 shared tokens
# (3,200 reads saved) lose 6%, 256 rows x 32 (8,192) gain 7%, 64 rows x 400 (25,600) gain 2.1x;
# the prefix kernel and the merge cost about what ~9,000 token reads do (~15 us a layer).
SHARED_PREFIX_MIN_ROWS = 32
SHARED_PREFIX_MAX_GROUPS = 8
SHARED_PREFIX_MIN_SAVED_TOKENS = 8192

NAN_LOGITS = -2  # ``collect``'s mark of a request whose logits held a NaN (never a token)


@dataclass(eq=False)
class LaunchedStep:
    """A step queued on the device whose tokens have not been read: ``ModelRunner.launch``
    makes it, ``ModelRunner.collect`` reads it. ``row_of``: request id -> its row in
    ``tokens`` (sampling order); ``tokens``: [R] int64 on the device (a buffer a later step may
    rewrite, read in stream order); ``host``: their copy on the host, complete once ``ready``
    (None off CUDA) has passed."""

    output: SchedulerOutput
    row_of: dict[str, int]
    tokens: torch.Tensor | None
    host: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None
    # each request's logits rows (cond, uncond; equal without CFG): ``host`` holds the tokens,
    # then one NaN flag per logits row, so a request with NaN logits is found at collect
    logit_rows: tuple[list[int], list[int]] = ((), ())
    # requests that asked for alignment and sample this step, and their text lengths; their rows
    # of ``alignment`` [requests, longest text] (on the host once ``ready`` has passed)
    alignment_ids: tuple[list[str], list[int]] = ((), ())
    alignment: torch.Tensor | None = None

    def alignment_rows(self) -> dict[str, torch.Tensor]:
        """After ``collect``: per request that asked, the alignment row [text positions] of the
        token it sampled in this step (``chorus.models.t3.alignment``)."""
        ids, lengths = self.alignment_ids
        return {rid: self.alignment[i, :n] for i, (rid, n) in enumerate(zip(ids, lengths))}


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

    def __init__(self, model: T3Model, variant: Variant, cache: PagedKVCache, *, shared_prefix: bool = True):
        self.faults = faults.from_env()  # test-only fault injection (chorus/faults.py); None in use
        self.model = model
        self.variant = variant
        self.cache = cache
        self.device = model.device
        self.block_size = cache.block_size
        self.requests: dict[str, RequestTensors] = {}
        self.alignment_ids: set[str] = set()  # requests that want their alignment rows
        self.last_logits_index: torch.Tensor | None = None  # where the last forward's logits rows were
        self.graphs = None  # a StepGraphs, set by the engine on CUDA
        self.shared_prefix = shared_prefix
        self._plan_cache: tuple[list, np.ndarray, SharedPrefixPlan] | None = None  # (decode seqs, their leading blocks, plan)
        self.sampler_graphs: SamplerGraphs | None = None  # set by the engine on CUDA
        # pinned host buffers (with the event of their last copy) for metadata transfers
        self._staging: list[tuple[torch.Tensor | None, torch.cuda.Event | None]] = [(None, None)] * 4
        self._staging_turn = 0
        self._sampling: _SamplingState | None = None
        # prompt embeddings made in one batch for requests being admitted together (embed_ahead)
        self._ahead: dict[str, tuple[tuple[torch.Tensor, torch.Tensor, bool], torch.Tensor]] = {}

    # -- request lifetime ------------------------------------------------------------------------
    def embed_ahead(self, prompts: dict[str, tuple[torch.Tensor, torch.Tensor, bool]]) -> None:
        """Make the prompt embeddings of requests about to be added, ``{request_id: (cond_embeds,
        text_ids, cfg)}``, in one batch (``T3Model.prefill_embeds_many``); :meth:`add_request`
        then takes them instead of making its own. When the batch cannot be made (one of them is
        invalid), nothing is kept and each request makes its own, so that only the invalid one
        fails. :meth:`forget_ahead` drops what no add took."""
        try:
            with torch.inference_mode():
                embeds = self.model.prefill_embeds_many(list(prompts.values()))
        except Exception:  # noqa: BLE001 - each request then meets its own error in add_request
            return
        self._ahead = {request_id: (prompt, e) for (request_id, prompt), e in zip(prompts.items(), embeds)}

    def forget_ahead(self) -> None:
        self._ahead = {}

    def add_request(self, request_id: str, cond_embeds: torch.Tensor, text_ids: torch.Tensor,
                    cfg: bool, params: SamplingParams) -> None:
        ahead = self._ahead.pop(request_id, None)
        if ahead is not None and _same_prompt(ahead[0], (cond_embeds, text_ids, cfg)):
            embeds = ahead[1]
        else:
            with torch.inference_mode():
                embeds = self.model.prefill_embeds(cond_embeds, text_ids, cfg=cfg)
        self.requests[request_id] = RequestTensors(
            prompt_embeds=embeds, seen_mask=initial_penalty_mask(self.variant, 1, device=self.device),
            params=params,
        )

    def keep_alignment_queries(self, max_tokens: int) -> None:
        """Make the cache keep the alignment heads' queries of every forward of up to
        ``max_tokens`` tokens (before any CUDA graph is captured, so that graphs keep them too);
        nothing for a model without known alignment heads."""
        try:
            heads = alignment_heads(self.model.config.backbone)
        except ValueError:
            return
        self.cache.keeper = QueryKeeper(heads, max_tokens, self.model.config.backbone.head_dim,
                                        dtype=self.model.dtype, device=self.device)

    def want_alignment(self, request_id: str) -> None:
        """Give ``request_id`` (added) an alignment row with each token it samples. Raises
        ValueError for a model without known alignment heads (``alignment_heads``)."""
        if self.cache.keeper is None:
            alignment_heads(self.model.config.backbone)  # raises where none are known
            raise ValueError("this engine keeps no alignment queries: build it with EngineConfig(alignment=True) "
                             "to let requests ask for alignment rows")
        self.alignment_ids.add(request_id)

    def remove_request(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.alignment_ids.discard(request_id)
        if self._sampling is not None and request_id in self._sampling.key[0]:
            self._flush_sampling()

    def _flush_sampling(self) -> None:
        cached, self._sampling = self._sampling, None
        self._hand_back(cached)

    def _hand_back(self, cached: _SamplingState) -> None:
        """Give the penalty masks of a cached composition back to their requests (a copy when
        they live in the sampler graphs' static buffers, which the next load overwrites)."""
        seen = cached.seen.clone() if cached.graphed else cached.seen
        for i, rid in enumerate(cached.key[0]):
            if rid in self.requests:
                self.requests[rid].seen_mask = seen[i:i + 1]

    # -- one step --------------------------------------------------------------------------------
    def prepare(self, out: SchedulerOutput, pending: LaunchedStep | None = None) -> StepInputs:
        """Host-side assembly of embeddings, positions and attention metadata, by numpy over
        the step's row arrays; only rows with prompt positions (prefill chunks) are visited
        one by one.

        ``pending``: the step in flight when ``out`` was scheduled ahead of its commit; every
        generated token ``out`` feeds is then the one its request samples in ``pending``,
        read on the device (never through the host)."""
        bs, seqs = self.block_size, out.seqs
        starts, counts = out.row_starts, out.row_num_tokens
        num_rows = len(seqs)
        q_start = np.zeros(num_rows + 1, dtype=np.int64)
        np.cumsum(counts, out=q_start[1:])
        num_tokens = int(q_start[-1])
        if num_tokens == num_rows:  # one position per row
            row_of, positions = np.arange(num_rows), starts
        else:
            row_of = np.repeat(np.arange(num_rows), counts)
            positions = np.arange(num_tokens) - q_start[row_of] + starts[row_of]
        slots = out.block_tables[row_of, positions // bs].astype(np.int64) * bs + positions % bs
        prompt_lens = np.fromiter((s.num_prompt_tokens for s in seqs), np.int64, num_rows)
        generated = positions - prompt_lens[row_of]  # which generated token each position feeds (< 0: prompt)
        speech_at = np.flatnonzero(generated >= 0)
        speech_rows, speech_generated = row_of[speech_at], generated[speech_at]
        if pending is None:
            speech_tokens = [seqs[r].output_tokens[g] for r, g in zip(speech_rows.tolist(), speech_generated.tolist())]
        else:  # a step scheduled ahead feeds exactly the tokens in flight: their rows in ``pending``
            row_of = pending.row_of
            speech_tokens = [row_of[seqs[r].request_id] for r in speech_rows.tolist()]
        all_speech = len(speech_at) == num_tokens
        ends = starts + counts
        num_decodes = int(np.argmax(counts != 1)) if (counts != 1).any() else num_rows
        plan = self._shared_prefix_plan(seqs, out.block_tables, ends, num_decodes)
        host = [positions, slots, out.block_tables.reshape(-1), ends, q_start,
                q_start[1:][out.row_needs_logits] - 1, np.asarray(speech_tokens, dtype=np.int64),
                speech_generated + 1, speech_at[:0] if all_speech else speech_at]
        if plan is not None:
            host += [plan.prefix_len, plan.group_rows, plan.group_start]
        pos_d, slot_d, table_d, seq_d, qs_d, logit_d, tok_d, spos_d, speech_at_d, *plan_d = self._to_device(host)

        if pending is not None and speech_tokens:
            # a row whose request drew NO_TOKEN in flight is wasted (it stops at that commit);
            # clamping keeps its embedding lookup in range
            tok_d = pending.tokens.index_select(0, tok_d).clamp_(min=0)
        speech = self.model.speech_embeds(tok_d, spos_d) if speech_tokens else None
        if all_speech:
            embeds = speech
        else:
            embeds = self._prompt_embeds(out, prompt_lens, q_start, num_tokens)
            if speech is not None:
                embeds[speech_at_d] = speech
        metadata = AttentionMetadata(
            slot_mapping=slot_d,
            block_tables=table_d.view(out.block_tables.shape).to(torch.int32),
            seq_lens=seq_d.to(torch.int32), query_start_loc=qs_d.to(torch.int32),
            max_query_len=int(counts.max()), max_seq_len=int(ends.max()), num_decodes=num_decodes,
            shared_prefix=None if plan is None else SharedPrefixTensors(
                *(t.to(torch.int32) for t in plan_d), max_groups=plan.num_groups),
        )
        return StepInputs(embeds=embeds, positions=pos_d, metadata=metadata, logits_index=logit_d,
                          num_tokens=num_tokens)

    def _shared_prefix_plan(self, seqs: list, block_tables: np.ndarray, seq_lens: np.ndarray,
                            num_decodes: int) -> SharedPrefixPlan | None:
        """Groups of decode rows that read their shared prefix once per step, when that pays:
        enough decode rows, and enough prefix reads saved to outweigh the extra launches and
        the partials' merge (``SHARED_PREFIX_MIN_SAVED_TOKENS``; the share of the rows' whole
        context does not matter, since their own suffixes are read either way).

        The plan is kept while the same sequences decode with the same leading blocks: shared
        blocks are full cached blocks, and the blocks a row takes while decoding are its own,
        so the same rows never come to share more (a preempted row comes back with new blocks,
        which the table comparison sees)."""
        if not self.shared_prefix or num_decodes < SHARED_PREFIX_MIN_ROWS:
            return None
        plan = self._reuse_plan(seqs, block_tables, num_decodes)
        if plan is None:
            plan = plan_shared_prefixes(block_tables, seq_lens, num_decodes, self.block_size,
                                        max_groups=SHARED_PREFIX_MAX_GROUPS)
            width = max(1, int(plan.prefix_len.max()) // self.block_size)
            self._plan_cache = (seqs[:num_decodes], block_tables[:num_decodes, :width].copy(), plan)
        if plan.num_groups == 0 or plan.prefix_tokens_saved < SHARED_PREFIX_MIN_SAVED_TOKENS:
            return None
        return plan

    def _reuse_plan(self, seqs: list, block_tables: np.ndarray, num_decodes: int) -> SharedPrefixPlan | None:
        if self._plan_cache is None:
            return None
        rows, region, plan = self._plan_cache
        width = region.shape[1]
        if (len(seqs) != plan.prefix_len.shape[0] or len(rows) != num_decodes or block_tables.shape[1] < width
                or any(a is not b for a, b in zip(rows, seqs)) or not np.array_equal(block_tables[:num_decodes, :width], region)):
            return None
        return plan

    def _prompt_embeds(self, out: SchedulerOutput, prompt_lens: np.ndarray, q_start: np.ndarray,
                       num_tokens: int) -> torch.Tensor:
        """[num_tokens, D] with the prompt positions of the step filled in (from each request's
        precomputed prompt embeddings); speech positions are left for the caller."""
        embeds = torch.empty(num_tokens, self.model.config.hidden_size, dtype=self.model.dtype, device=self.device)
        for i in np.flatnonzero(out.row_starts < prompt_lens).tolist():
            seq, start, at = out.seqs[i], int(out.row_starts[i]), int(q_start[i])
            end = min(start + int(out.row_num_tokens[i]), int(prompt_lens[i]))
            prompt = self.requests[seq.request_id].prompt_embeds
            assert prompt.shape[1] == prompt_lens[i], "prompt embeddings and prompt keys disagree"
            embeds[at:at + end - start] = prompt[0 if seq.branch is Branch.COND else 1, start:end]
        return embeds

    def _to_device(self, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """Move int64 host arrays to the device in ONE copy (through a pinned staging buffer on
        CUDA, so the copy is asynchronous and does not wait for the GPU to drain)."""
        sizes = [a.size for a in arrays]
        flat = np.concatenate([a.reshape(-1).astype(np.int64, copy=False) for a in arrays])
        if self.device.type == "cuda":
            # a small ring of pinned buffers: a buffer is rewritten only after its last copy ended
            self._staging_turn = (self._staging_turn + 1) % len(self._staging)
            buffer, done = self._staging[self._staging_turn]
            if done is not None:
                done.synchronize()
            if buffer is None or buffer.numel() < flat.size:
                buffer = torch.empty(max(flat.size * 2, 1 << 16), dtype=torch.int64, pin_memory=True)
            staging = buffer[:flat.size]
            staging.numpy()[:] = flat
            device_flat = staging.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._staging[self._staging_turn] = (buffer, event)
        else:
            device_flat = torch.from_numpy(flat)
        return list(torch.split(device_flat, sizes))

    @torch.inference_mode()
    def forward_logits(self, inputs: StepInputs) -> torch.Tensor:
        """Logits [rows needing logits, V] in fp32; ``last_logits_index`` says where in the
        forward's (possibly padded) batch their positions were."""
        if self.graphs is not None:
            logits = self.graphs.run(inputs)
            if logits is not None:
                self.last_logits_index = self.graphs.last_logits_index
                return logits
        self.last_logits_index = inputs.logits_index
        self.cache.metadata = inputs.metadata
        hidden = self.model(inputs.embeds, inputs.positions, self.cache)
        self.cache.metadata = None
        return self.model.speech_logits(hidden[inputs.logits_index]).float()

    def _alignment_tap(self, out: SchedulerOutput) -> tuple[AlignmentTap, torch.Tensor, list[str], list[int]] | None:
        """A tap on the last position of every conditional row that samples this step for a
        request in ``alignment_ids`` (the query that produces its next token), the index of
        those rows among the step's logits rows, and the requests' ids and text lengths; None
        when there is none."""
        seqs = out.seqs
        needed = out.logits_rows()
        picked = [(j, r) for j, r in enumerate(needed)
                  if seqs[r].branch is Branch.COND and seqs[r].request_id in self.alignment_ids]
        if not picked:
            return None
        rows = [r for _, r in picked]
        ids = [seqs[r].request_id for r in rows]
        prompts = [out.requests[rid].prompt for rid in ids]
        index = np.asarray(rows)
        positions = out.row_starts[index] + out.row_num_tokens[index] - 1
        width, bs = int(positions.max()) + 1, self.block_size
        tables = out.block_tables[index]
        offsets = np.arange(width)
        slots = tables[:, np.minimum(offsets // bs, tables.shape[1] - 1)].astype(np.int64) * bs + offsets % bs
        lengths = [len(p.text_ids) for p in prompts]
        logits_d, pos_d, slots_d, start_d, len_d = self._to_device(
            [np.asarray([j for j, _ in picked]), positions, slots, np.asarray([p.text_start for p in prompts]),
             np.asarray(lengths)])
        tap = AlignmentTap(positions=pos_d, key_slots=slots_d.view(len(rows), width), text_start=start_d,
                           text_len=len_d, max_text=max(lengths))
        return tap, logits_d, ids, lengths

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> dict[str, int]:
        """Compute ``out`` and sample one token for every request whose logits were needed.
        Returns ``{request_id: token}``; ``NO_TOKEN`` marks a request with no finite logit."""
        return self.collect(self.launch(out))

    @torch.inference_mode()
    def launch(self, out: SchedulerOutput, pending: LaunchedStep | None = None) -> LaunchedStep:
        """Queue ``out``'s forward and sampling on the device and start copying its tokens to
        the host; ``collect`` waits for them. ``pending``: the step in flight that ``out`` was
        scheduled ahead of (see ``prepare``)."""
        if out.is_empty:
            return LaunchedStep(out, {}, None)
        inputs = self.prepare(out, pending)
        alignment = self._alignment_tap(out) if self.alignment_ids else None
        logits = self.forward_logits(inputs)
        if self.faults is not None and self.faults.check("t3_step"):
            logits = logits.clone()
            logits[0] = float("nan")
        # rows needing logits: one per plain request, two adjacent ones per CFG pair (read from
        # the sequences directly: building the step's row objects costs more than the loop)
        seqs = out.seqs
        needed = out.logits_rows()
        cond_idx, uncond_idx, cond_rows, request_ids = [], [], [], []
        for i, row in enumerate(needed):
            seq = seqs[row]
            if seq.branch is Branch.COND:
                cond_idx.append(i)
                uncond_idx.append(i)  # replaced below for CFG pairs
                cond_rows.append(row)
                request_ids.append(seq.request_id)
            else:
                uncond_idx[-1] = i
        if not request_ids:
            return LaunchedStep(out, {}, None)
        has_uncond = len(needed) > len(request_ids)
        state = self._sampling_state(out, request_ids, cond_rows, cond_idx, uncond_idx, has_uncond)
        if state.graphed:
            tokens = self.sampler_graphs.sample(logits)
        else:
            cond = logits[state.cond_index]
            uncond = logits[state.uncond_index] if has_uncond else None
            processed = process_logits(cond, state.batch, state.seen, state.steps, uncond_logits=uncond)
            tokens = sample_next_tokens(processed, state.batch, state.steps)
            record_sampled_tokens(self.variant, state.seen, tokens, state.steps)
        step = LaunchedStep(out, {rid: i for i, rid in enumerate(request_ids)}, tokens,
                            logit_rows=(cond_idx, uncond_idx))
        if alignment is not None:
            tap, logits_rows, ids, lengths = alignment
            keeper = self.cache.keeper
            if inputs.num_tokens > keeper.capacity and self.last_logits_index is inputs.logits_index:
                raise RuntimeError(f"a step of {inputs.num_tokens} positions exceeds the {keeper.capacity} "
                                   "whose alignment queries the cache keeps")
            step.alignment_ids = (ids, lengths)
            step.alignment = tap.probabilities(keeper.queries(self.last_logits_index[logits_rows]), keeper.heads,
                                               self.cache.flat_keys)
        # NaN logits must never become a token: flag the rows (argmax would pick a NaN's index)
        flagged = torch.cat([tokens, torch.isnan(logits).any(dim=-1).to(tokens.dtype)])
        if self.device.type == "cuda":  # the copy to the host runs behind the step, on its stream
            step.host = torch.empty(flagged.shape, dtype=flagged.dtype, pin_memory=True)
            step.host.copy_(flagged, non_blocking=True)
            if step.alignment is not None:
                step.alignment = _to_host(step.alignment)
            step.ready = torch.cuda.Event()
            step.ready.record()
        else:
            step.host = flagged  # a new tensor: ``tokens`` may be a buffer the next step rewrites
        return step

    def collect(self, step: LaunchedStep) -> dict[str, int]:
        """Wait for ``step``'s tokens: ``{request_id: token}`` (the step's one host sync);
        ``NAN_LOGITS`` marks a request whose logits (either CFG row) held a NaN."""
        if step.host is None:
            return {}
        if step.ready is not None:
            step.ready.synchronize()
        values = step.host.tolist()
        count = len(step.row_of)
        tokens, nan_rows = values[:count], values[count:]
        result = {rid: (NO_TOKEN if v == NO_TOKEN else int(v)) for rid, v in zip(step.row_of, tokens)}
        if any(nan_rows):
            cond, uncond = step.logit_rows
            for i, rid in enumerate(step.row_of):
                if nan_rows[cond[i]] or nan_rows[uncond[i]]:
                    result[rid] = NAN_LOGITS
        return result

    def _sampling_state(self, out: SchedulerOutput, request_ids: list[str], cond_rows: list[int],
                        cond_idx: list[int], uncond_idx: list[int], has_uncond: bool) -> "_SamplingState":
        """Per-step sampling inputs. In steady decoding the same requests sample every step, so
        the parameter batch, the penalty masks and the index tensors are reused and the step
        counters advance on the device; they are rebuilt only when the composition changes.
        With ``sampler_graphs`` a new composition is loaded into the graphs' static buffers.
        A request's step counter is its tokens before this draw, read from its row's span (the
        span ends where the sampled token goes), so it is right while tokens are in flight."""
        key = (tuple(request_ids), tuple(cond_idx), tuple(uncond_idx) if has_uncond else None)
        cached = self._sampling
        if cached is not None and cached.key == key:
            if not cached.graphed:  # a graph advances its own counters
                cached.steps = cached.steps + 1
            return cached
        if cached is not None:
            self._hand_back(cached)
        states = [self.requests[r] for r in request_ids]
        rows = np.asarray(cond_rows, dtype=np.int64)
        prompt_lens = np.fromiter((out.seqs[r].num_prompt_tokens for r in cond_rows), np.int64, len(cond_rows))
        steps = out.row_starts[rows] + out.row_num_tokens[rows] - prompt_lens
        graphs = self.sampler_graphs
        if graphs is not None and graphs.fits(len(request_ids)):
            batch = SamplingBatch.build([s.params for s in states], self.variant)  # packed on the host
            graphs.load(batch, [s.seen_mask for s in states], steps.tolist(), cond_idx,
                        uncond_idx if has_uncond else None)
            self._sampling = _SamplingState(key=key, batch=batch, seen=graphs.seen, steps=graphs.steps,
                                            cond_index=None, uncond_index=None, graphed=True)
            return self._sampling
        dev = self.device
        index = self._to_device([np.asarray(cond_idx, dtype=np.int64), np.asarray(uncond_idx, dtype=np.int64),
                                 steps])
        self._sampling = _SamplingState(
            key=key, batch=SamplingBatch.build([s.params for s in states], self.variant, device=dev),
            seen=torch.cat([s.seen_mask for s in states]), steps=index[2],
            cond_index=index[0], uncond_index=index[1])
        return self._sampling


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of ``tensor`` made in stream order (complete once the step's event has passed)."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


def _same_prompt(a: tuple[torch.Tensor, torch.Tensor, bool], b: tuple[torch.Tensor, torch.Tensor, bool]) -> bool:
    """Whether two (cond_embeds, text_ids, cfg) are the same inputs (the same tensors)."""
    return a[0] is b[0] and a[1] is b[1] and a[2] == b[2]
