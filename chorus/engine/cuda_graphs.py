"""CUDA-graph capture of T3's steps: decode steps per batch-size bucket, and steps that admit
(prompt positions beside the decode rows) per (decode rows, prompt positions) bucket.

A decode step (every row computes one new position) is dominated by kernel launches at small
batch sizes; replaying a captured graph removes them. Graphs are captured for row counts
1, 2, 4, 8, ... up to ``max_rows``; a step with n rows replays the smallest bucket >= n with the
extra rows padded (slot -1: nothing written; context 0: output ignored). Buckets from
``shared_prefix_rows`` rows have a second graph whose attention takes a shared-prefix plan
(copied into static buffers before the replay).

A **mixed step** (decode rows first, then up to ``MIXED_PROMPT_ROWS`` rows with prompt
positions, the step that admits a request beside the running ones) ran eagerly before: hundreds
of PyTorch calls, each handing the GIL to the server's other threads and waiting to get it back,
which made such a step several times longer than a decode step under load (docs/engine.md,
"Where an admission's time goes"). It now replays a graph of the bucket (decode rows, prompt
positions) that holds it when one was captured (``mixed_token_buckets``): the step's flat batch
is laid out in the bucket's padded one by ``lay_out_mixed`` (the decode rows padded to their
bucket as above, then the prompt rows, then zero-length rows and unwritten positions up to the
bucket), about twenty device-to-device copies. The captured attention plans its launches from the
bucket's sizes (host-known; the kernels find each row by ``query_start_loc`` and skip padding),
so the same graph serves every step of the bucket.

All graphs share one memory pool and one set of static input buffers. Exactness: a replay
runs eager mode's kernels on the padded shapes, with the launch choices of its bucket (the
query-block size, KV splits, no shared-prefix path in a mixed graph), so logits agree with an
eager step's up to the order of floating-point reductions; a GPU test checks replays' tokens
against eager mode, and CPU tests check the padded layout against the step's own (the model on
the reference path; the Triton kernels under their interpreter).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from chorus import capture_gate
from chorus.engine.attention import SharedPrefixTensors
from chorus.engine.config import MIN_MIXED_GRAPH_TOKENS
from chorus.engine.paged_cache import AttentionMetadata, PagedKVCache
from chorus.models.t3.model import T3Model

# prompt rows a mixed graph takes: a step admitting more (a burst of arrivals) runs eagerly
MIXED_PROMPT_ROWS = 8


def default_buckets(max_rows: int) -> list[int]:
    sizes, n = [], 1
    while n < max_rows:
        sizes.append(n)
        n *= 2
    sizes.append(max_rows)
    return sizes


def mixed_token_buckets(max_tokens: int) -> list[int]:
    """Prompt-position buckets of the mixed graphs: 64, 128, ... below ``max_tokens``, then
    ``max_tokens`` (0: none)."""
    if max_tokens <= 0:
        return []
    sizes, n = [], MIN_MIXED_GRAPH_TOKENS
    while n < max_tokens:
        sizes.append(n)
        n *= 2
    sizes.append(max_tokens)
    return sizes


@dataclass
class StepBuffers:
    """Static inputs of a captured forward (the tokens' and rows' arrays at their largest);
    a replay reads the leading part its bucket covers."""

    embeds: torch.Tensor  # [tokens, D]
    positions: torch.Tensor  # [tokens]
    slot_mapping: torch.Tensor  # [tokens]
    block_tables: torch.Tensor  # [rows, max_blocks] int32
    seq_lens: torch.Tensor  # [rows] int32
    query_start_loc: torch.Tensor  # [rows + 1] int32
    logits_index: torch.Tensor  # [rows]

    @classmethod
    def allocate(cls, tokens: int, rows: int, max_blocks: int, hidden: int, dtype: torch.dtype,
                 device: torch.device | str) -> StepBuffers:
        return cls(
            embeds=torch.zeros(tokens, hidden, dtype=dtype, device=device),
            positions=torch.zeros(tokens, dtype=torch.long, device=device),
            slot_mapping=torch.full((tokens,), -1, dtype=torch.long, device=device),
            block_tables=torch.zeros(rows, max_blocks, dtype=torch.int32, device=device),
            seq_lens=torch.zeros(rows, dtype=torch.int32, device=device),
            query_start_loc=torch.arange(rows + 1, dtype=torch.int32, device=device),
            logits_index=torch.zeros(rows, dtype=torch.long, device=device),
        )


@dataclass(frozen=True)
class MixedBucket:
    """A mixed graph's padded batch: ``decode_rows`` one-token rows (the step's decode rows,
    then padding), then ``MIXED_PROMPT_ROWS`` rows over ``prompt_tokens`` positions (the
    step's prompt rows, then zero-length rows; positions past the last row are computed and
    never written to the cache)."""

    decode_rows: int
    prompt_tokens: int

    @property
    def rows(self) -> int:
        return self.decode_rows + MIXED_PROMPT_ROWS

    @property
    def tokens(self) -> int:
        return self.decode_rows + self.prompt_tokens

    def metadata(self, buffers: StepBuffers, max_seq_len: int) -> AttentionMetadata:
        """The padded batch's attention metadata over ``buffers`` (host bounds: the bucket's)."""
        rows, tokens = self.rows, self.tokens
        return AttentionMetadata(
            slot_mapping=buffers.slot_mapping[:tokens], block_tables=buffers.block_tables[:rows],
            seq_lens=buffers.seq_lens[:rows], query_start_loc=buffers.query_start_loc[:rows + 1],
            max_query_len=max(self.prompt_tokens, 2), max_seq_len=max_seq_len, num_decodes=self.decode_rows)


def lay_out_mixed(inputs, bucket: MixedBucket, buffers: StepBuffers) -> int:
    """Copy a mixed step's inputs (``model_runner.StepInputs``: decode rows first) into the
    bucket's padded layout in ``buffers``; returns how many logits rows it asks for (the
    leading ``logits_index`` entries, each pointing at its row's position in the padded
    batch). The bucket must hold the step: ``num_decodes <= decode_rows``, at most
    ``MIXED_PROMPT_ROWS`` prompt rows and ``prompt_tokens`` prompt positions."""
    meta = inputs.metadata
    decodes, rows, tokens = meta.num_decodes, meta.seq_lens.shape[0], inputs.num_tokens
    prompt_rows, prompt_tokens = rows - decodes, tokens - decodes
    pad_rows, at = bucket.decode_rows, bucket.decode_rows  # where the prompt rows / positions start
    assert decodes <= pad_rows and 0 < prompt_rows <= MIXED_PROMPT_ROWS and prompt_tokens <= bucket.prompt_tokens, \
        (decodes, prompt_rows, prompt_tokens, bucket)
    b = buffers
    for source, target in ((inputs.embeds, b.embeds), (inputs.positions, b.positions),
                           (meta.slot_mapping, b.slot_mapping)):
        target[:decodes].copy_(source[:decodes])
        target[at:at + prompt_tokens].copy_(source[decodes:tokens])
    b.slot_mapping[decodes:pad_rows].fill_(-1)
    b.slot_mapping[at + prompt_tokens:bucket.tokens].fill_(-1)
    width = meta.block_tables.shape[1]
    b.block_tables[:decodes, :width].copy_(meta.block_tables[:decodes])
    b.block_tables[pad_rows:pad_rows + prompt_rows, :width].copy_(meta.block_tables[decodes:])
    b.seq_lens[:decodes].copy_(meta.seq_lens[:decodes])
    b.seq_lens[decodes:pad_rows].fill_(0)
    b.seq_lens[pad_rows:pad_rows + prompt_rows].copy_(meta.seq_lens[decodes:])
    b.seq_lens[pad_rows + prompt_rows:bucket.rows].fill_(0)
    qsl = b.query_start_loc
    torch.arange(pad_rows + 1, out=qsl[:pad_rows + 1])  # the decode rows' one position each
    torch.add(meta.query_start_loc[decodes + 1:], pad_rows - decodes, out=qsl[pad_rows + 1:pad_rows + prompt_rows + 1])
    qsl[pad_rows + prompt_rows + 1:bucket.rows + 1].fill_(at + prompt_tokens)
    index = inputs.logits_index
    count = index.shape[0]
    # positions of prompt rows move by the decode rows' padding
    torch.add(index, (index >= decodes).to(index.dtype), alpha=pad_rows - decodes, out=b.logits_index[:count])
    b.logits_index[count:bucket.rows].zero_()
    return count


class StepGraphs:
    """Captured forwards (embeds -> fp32 speech logits) for a model and its paged cache: decode
    steps per row bucket and, with ``mixed_token_buckets``, mixed steps per
    (decode rows, prompt positions) bucket."""

    def __init__(self, model: T3Model, cache: PagedKVCache, *, max_rows: int, max_blocks_per_row: int,
                 max_seq_len: int, buckets: list[int] | None = None, shared_prefix_rows: int | None = None,
                 shared_prefix_max_groups: int = 8, mixed_token_buckets: list[int] | None = None):
        """``shared_prefix_rows``: decode buckets from this many rows also get a graph that reads
        a shared-prefix plan with up to ``shared_prefix_max_groups`` groups (None: none do).
        ``mixed_token_buckets``: prompt positions of the mixed graphs, one graph per decode
        bucket (and none) and each of these (None or empty: mixed steps run eagerly)."""
        assert model.device.type == "cuda", "CUDA graphs need a CUDA model"
        self.model, self.cache = model, cache
        self.buckets = sorted(buckets or default_buckets(max_rows))
        self.max_rows = self.buckets[-1]
        self.max_seq_len = max_seq_len
        self.mixed = [MixedBucket(d, t) for d in [0, *self.buckets] for t in sorted(mixed_token_buckets or [])]
        dev, hidden = model.device, model.config.hidden_size
        n = self.max_rows
        largest = max([n, *(m.tokens for m in self.mixed)])
        most_rows = max([n, *(m.rows for m in self.mixed)])
        self.buffers = StepBuffers.allocate(largest, most_rows, max_blocks_per_row, hidden, model.dtype, dev)
        self._decode_starts = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.logits = torch.zeros(most_rows, model.config.speech_vocab_size, dtype=torch.float32, device=dev)
        # the shared-prefix plan (``AttentionMetadata.shared_prefix``) of buckets that have a
        # graph with it: rows past the step's are in no group
        self.shared_buckets = [b for b in self.buckets if shared_prefix_rows is not None and b >= shared_prefix_rows]
        self.shared_max_groups = shared_prefix_max_groups
        self.prefix_len = torch.zeros(n, dtype=torch.int32, device=dev)
        self.group_rows = torch.arange(n, dtype=torch.int32, device=dev)
        self.group_start = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self._row_ids = torch.arange(n, dtype=torch.int32, device=dev)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.mixed_graphs: dict[MixedBucket, torch.cuda.CUDAGraph] = {}
        self.replays = {"decode": 0, "mixed": 0}  # steps served by each kind of graph
        # where the last replay's logits rows were in its padded batch (the cache's kept
        # alignment queries are in that layout)
        self.last_logits_index: torch.Tensor | None = None
        self._capture_all()

    # -- capture ---------------------------------------------------------------------------------
    def _decode_metadata(self, rows: int, shared: bool) -> AttentionMetadata:
        b = self.buffers
        return AttentionMetadata(
            slot_mapping=b.slot_mapping[:rows], block_tables=b.block_tables[:rows],
            seq_lens=b.seq_lens[:rows], query_start_loc=self._decode_starts[:rows + 1],
            max_query_len=1, max_seq_len=self.max_seq_len, num_decodes=rows,
            shared_prefix=SharedPrefixTensors(self.prefix_len[:rows], self.group_rows[:rows],
                                              self.group_start[:rows + 1], self.shared_max_groups)
            if shared else None,
        )

    def _forward(self, tokens: int, metadata: AttentionMetadata, logits_rows: int, gather: bool) -> None:
        """``gather``: logits at ``logits_index`` (a mixed batch) rather than at every position."""
        b = self.buffers
        self.cache.metadata = metadata
        hidden = self.model(b.embeds[:tokens], b.positions[:tokens], self.cache)
        if gather:
            hidden = hidden[b.logits_index[:logits_rows]]
        self.logits[:logits_rows] = self.model.speech_logits(hidden).float()
        self.cache.metadata = None

    def _capture(self, forward, pool, stream) -> torch.cuda.CUDAGraph:
        for _ in range(2):  # warm up (Triton autotuning, cuBLAS workspaces) outside capture
            forward()
        graph = torch.cuda.CUDAGraph()
        # other threads (another model version serving beside this one loading) keep running:
        # the gate holds off their device-wide synchronisations meanwhile
        with capture_gate.capture(graph, pool=pool, stream=stream):
            forward()
        return graph

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=self.model.device)
        stream.wait_stream(torch.cuda.current_stream())
        b = self.buffers
        with torch.cuda.stream(stream):
            # the largest first, so that the shared pool is sized once
            for bucket in sorted(self.mixed, key=lambda m: (m.tokens, m.rows), reverse=True):
                b.seq_lens.zero_()  # padding throughout: nothing is read or written in the pool
                b.slot_mapping.fill_(-1)
                b.query_start_loc[:bucket.rows + 1].copy_(torch.arange(bucket.rows + 1, device=b.seq_lens.device)
                                                          .clamp_(max=bucket.tokens))
                meta = bucket.metadata(b, self.max_seq_len)
                self.mixed_graphs[bucket] = self._capture(
                    lambda m=meta, t=bucket.tokens, r=bucket.rows: self._forward(t, m, r, gather=True), pool, stream)
            b.seq_lens.zero_()
            for rows in reversed(self.buckets):
                for shared in (False, True) if rows in self.shared_buckets else (False,):
                    meta = self._decode_metadata(rows, shared)
                    self.graphs[rows, shared] = self._capture(
                        lambda m=meta, r=rows: self._forward(r, m, r, gather=False), pool, stream)
        torch.cuda.current_stream().wait_stream(stream)
        capture_gate.synchronize()

    # -- replay ----------------------------------------------------------------------------------
    def run(self, inputs) -> torch.Tensor | None:
        """Replay the graph that holds this step (``model_runner.StepInputs``); returns its
        logits [rows needing logits, V] (a fresh tensor), or None when no graph holds it (the
        caller runs it eagerly)."""
        meta = inputs.metadata
        if meta.block_tables.shape[1] > self.buffers.block_tables.shape[1]:
            return None
        if meta.max_query_len == 1:
            return self._run_decode(inputs)
        bucket = self._mixed_bucket(inputs)
        if bucket is None:
            return None
        count = lay_out_mixed(inputs, bucket, self.buffers)
        self.last_logits_index = self.buffers.logits_index[:count]
        self.mixed_graphs[bucket].replay()
        self.replays["mixed"] += 1
        return self.logits[:count].clone()

    def _mixed_bucket(self, inputs) -> MixedBucket | None:
        meta = inputs.metadata
        decodes = meta.num_decodes
        prompt_rows, prompt_tokens = meta.seq_lens.shape[0] - decodes, inputs.num_tokens - decodes
        if prompt_rows > MIXED_PROMPT_ROWS:
            return None
        return next((m for m in self.mixed if m.decode_rows >= decodes and m.prompt_tokens >= prompt_tokens), None)

    def _run_decode(self, inputs) -> torch.Tensor | None:
        meta = inputs.metadata
        rows = meta.seq_lens.shape[0]
        if rows > self.max_rows or inputs.logits_index.shape[0] != rows:
            return None
        bucket = next(b for b in self.buckets if b >= rows)
        buf = self.buffers
        buf.embeds[:rows].copy_(inputs.embeds)
        buf.positions[:rows].copy_(inputs.positions)
        buf.slot_mapping[:rows].copy_(meta.slot_mapping)
        buf.slot_mapping[rows:bucket].fill_(-1)
        buf.block_tables[:rows, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        buf.seq_lens[:rows].copy_(meta.seq_lens)
        buf.seq_lens[rows:bucket].fill_(0)
        plan = meta.shared_prefix
        shared = plan is not None and bucket in self.shared_buckets and plan.max_groups <= self.shared_max_groups
        if shared:  # device-to-device copies of the plan, padded to the bucket
            self.prefix_len[:rows].copy_(plan.prefix_len)
            self.prefix_len[rows:bucket].fill_(0)
            self.group_rows[:rows].copy_(plan.group_rows)
            self.group_rows[rows:bucket].copy_(self._row_ids[rows:bucket])
            self.group_start[:rows + 1].copy_(plan.group_start)
            self.group_start[rows + 1:bucket + 1].copy_(plan.group_start[rows:].expand(bucket - rows))
        self.graphs[bucket, shared].replay()
        self.last_logits_index = inputs.logits_index  # row i's one position is position i
        self.replays["decode"] += 1
        return self.logits[:rows].clone()
