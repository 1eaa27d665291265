"""CUDA-graph capture of T3's decode step, one graph per batch-size bucket.

A decode step (every row computes one new position) is dominated by kernel launches at small
batch sizes; replaying a captured graph removes them. Graphs are captured for row counts
1, 2, 4, 8, ... up to ``max_rows``; a step with n rows replays the smallest bucket >= n with the
extra rows padded (slot -1: nothing written; context 0: output ignored). Buckets from
``shared_prefix_rows`` rows have a second graph whose attention takes a shared-prefix plan
(copied into static buffers before the replay). All graphs share one memory pool and one set of
static input buffers. Exactness: a replay computes the same
kernels as eager mode on the same shapes, which a GPU test checks.
"""
from __future__ import annotations

import torch

from chorus import capture_gate
from chorus.engine.attention import SharedPrefixTensors
from chorus.engine.paged_cache import AttentionMetadata, PagedKVCache
from chorus.models.t3.model import T3Model


def default_buckets(max_rows: int) -> list[int]:
    sizes, n = [], 1
    while n < max_rows:
        sizes.append(n)
        n *= 2
    sizes.append(max_rows)
    return sizes


class CudaGraphDecoder:
    """Captured decode forwards (embeds -> fp32 speech logits) for a model and its paged cache."""

    def __init__(self, model: T3Model, cache: PagedKVCache, *, max_rows: int, max_blocks_per_row: int,
                 max_seq_len: int, buckets: list[int] | None = None, shared_prefix_rows: int | None = None,
                 shared_prefix_max_groups: int = 8):
        """``shared_prefix_rows``: buckets from this many rows also get a graph that reads a
        shared-prefix plan with up to ``shared_prefix_max_groups`` groups (None: none do)."""
        assert model.device.type == "cuda", "CUDA graphs need a CUDA model"
        self.model, self.cache = model, cache
        self.buckets = sorted(buckets or default_buckets(max_rows))
        self.max_rows = self.buckets[-1]
        self.max_seq_len = max_seq_len
        dev, hidden = model.device, model.config.hidden_size
        n = self.max_rows
        self.embeds = torch.zeros(n, hidden, dtype=model.dtype, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.block_tables = torch.zeros(n, max_blocks_per_row, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.logits = torch.zeros(n, model.config.speech_vocab_size, dtype=torch.float32, device=dev)
        # the shared-prefix plan (``AttentionMetadata.shared_prefix``) of buckets that have a
        # graph with it: rows past the step's are in no group
        self.shared_buckets = [b for b in self.buckets if shared_prefix_rows is not None and b >= shared_prefix_rows]
        self.shared_max_groups = shared_prefix_max_groups
        self.prefix_len = torch.zeros(n, dtype=torch.int32, device=dev)
        self.group_rows = torch.arange(n, dtype=torch.int32, device=dev)
        self.group_start = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        self._row_ids = torch.arange(n, dtype=torch.int32, device=dev)
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._capture_all()

    def _metadata(self, rows: int, shared: bool) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:rows], block_tables=self.block_tables[:rows],
            seq_lens=self.seq_lens[:rows], query_start_loc=self.query_start_loc[:rows + 1],
            max_query_len=1, max_seq_len=self.max_seq_len, num_decodes=rows,
            shared_prefix=SharedPrefixTensors(self.prefix_len[:rows], self.group_rows[:rows],
                                              self.group_start[:rows + 1], self.shared_max_groups)
            if shared else None,
        )

    def _forward(self, rows: int, shared: bool) -> None:
        self.cache.metadata = self._metadata(rows, shared)
        hidden = self.model(self.embeds[:rows], self.positions[:rows], self.cache)
        self.logits[:rows] = self.model.speech_logits(hidden).float()
        self.cache.metadata = None

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=self.model.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for rows in reversed(self.buckets):
                for shared in (False, True) if rows in self.shared_buckets else (False,):
                    for _ in range(2):  # warm up (Triton autotuning, cuBLAS workspaces) outside capture
                        self._forward(rows, shared)
                    graph = torch.cuda.CUDAGraph()
                    # other threads (another model version serving beside this one loading) keep
                    # running: the gate holds off their device-wide synchronisations meanwhile
                    with capture_gate.capture(graph, pool=pool, stream=stream):
                        self._forward(rows, shared)
                    self.graphs[rows, shared] = graph
        torch.cuda.current_stream().wait_stream(stream)
        capture_gate.synchronize()

    def can_run(self, inputs) -> bool:
        meta = inputs.metadata
        rows = meta.seq_lens.shape[0]
        return (meta.max_query_len == 1 and rows <= self.max_rows and inputs.logits_index.shape[0] == rows
                and meta.block_tables.shape[1] <= self.block_tables.shape[1])

    def run(self, inputs) -> torch.Tensor:
        """Replay for a decode-only step; returns logits [rows, V] (a fresh tensor)."""
        meta = inputs.metadata
        rows = meta.seq_lens.shape[0]
        bucket = next(b for b in self.buckets if b >= rows)
        self.embeds[:rows].copy_(inputs.embeds)
        self.positions[:rows].copy_(inputs.positions)
        self.slot_mapping[:rows].copy_(meta.slot_mapping)
        self.slot_mapping[rows:bucket].fill_(-1)
        self.block_tables[:rows, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.seq_lens[:rows].copy_(meta.seq_lens)
        self.seq_lens[rows:bucket].fill_(0)
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
        return self.logits[:rows].clone()
