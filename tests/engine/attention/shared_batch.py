"""Paged batches whose decode rows share leading physical blocks (prefix caching), for the
shared-prefix tests."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from chorus.engine.attention import SharedPrefixTensors, plan_shared_prefixes, quantize_kv


@dataclass
class SharedBatch:
    q: torch.Tensor                 # [N, H, D]
    key_cache: torch.Tensor         # [num_blocks, block_size, H, D], random everywhere
    value_cache: torch.Tensor
    block_tables: torch.Tensor      # [S, max_blocks] int32; padding entries out of range
    seq_lens: torch.Tensor          # [S] int32
    query_start_loc: torch.Tensor   # [S + 1] int32
    num_decodes: int
    max_seq_len: int
    scale: float

    def args(self) -> tuple:
        """Positional arguments of ``paged_attention``."""
        return (self.q, self.key_cache, self.value_cache, self.block_tables, self.seq_lens,
                self.query_start_loc, self.scale)

    def shared(self, *, min_rows: int = 2, max_groups: int | None = None,
               launch_groups: int | None = None) -> SharedPrefixTensors:
        """The planner's plan for this batch, on the batch's device."""
        plan = plan_shared_prefixes(self.block_tables.cpu().numpy(), self.seq_lens.cpu().numpy(),
                                    self.num_decodes, self.key_cache.shape[1], min_rows=min_rows,
                                    max_groups=max_groups)
        return SharedPrefixTensors.from_plan(plan, self.q.device, launch_groups)

    def to_fp8(self, k_scale: float, v_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Re-store the pool as FP8 under the scales (quantised by the PyTorch reference, so the
        bytes are right on any backend) and return the scales as one-element device tensors."""
        scales = tuple(torch.tensor([s], dtype=torch.float32, device=self.q.device) for s in (k_scale, v_scale))
        self.key_cache = quantize_kv(self.key_cache, scales[0], torch.float8_e4m3fn)
        self.value_cache = quantize_kv(self.value_cache, scales[1], torch.float8_e4m3fn)
        return scales


def make_shared_batch(
    group_blocks: list[int], decodes: list[tuple[int, int]], prefills: list[tuple[int, int]] = (),
    *, heads: int = 2, head_dim: int = 16, block_size: int = 8, dtype: torch.dtype = torch.float32,
    device: str = "cpu", seed: int = 0,
) -> SharedBatch:
    """Decode rows ``(group, seq_len)`` (group -1: own blocks only; seq_len 0: a padding row),
    then prefill rows ``(seq_len, q_len)``; group ``g``'s rows begin their tables with the same
    ``group_blocks[g]`` physical blocks (as far as their context reaches). Decode rows come
    first in the order given, so groups interleave in the batch as in a real step.
    """
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    specs = [(n, 1) for _, n in decodes] + list(prefills)
    groups = [g for g, _ in decodes] + [-1] * len(prefills)
    need = [-(-n // block_size) for n, _ in specs]
    own = [need[i] - (min(need[i], group_blocks[g]) if g >= 0 else 0) for i, g in enumerate(groups)]
    num_blocks = sum(group_blocks) + sum(own) + 3
    ids = iter(rng.permutation(num_blocks).tolist())
    shared = [[next(ids) for _ in range(b)] for b in group_blocks]
    width = max(need + [1]) + 2
    table = rng.integers(num_blocks, 10 * num_blocks, (len(specs), width))
    for i, g in enumerate(groups):
        lead = shared[g][:need[i]] if g >= 0 else []
        table[i, :need[i]] = lead + [next(ids) for _ in range(need[i] - len(lead))]
    q_lens = [q for _, q in specs]
    starts = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(dtype).to(device)  # noqa: E731
    return SharedBatch(
        q=randn(sum(q_lens), heads, head_dim),
        key_cache=randn(num_blocks, block_size, heads, head_dim),
        value_cache=randn(num_blocks, block_size, heads, head_dim),
        block_tables=torch.from_numpy(table).to(torch.int32).to(device),
        seq_lens=torch.tensor([n for n, _ in specs], dtype=torch.int32).to(device),
        query_start_loc=starts.to(device), num_decodes=len(decodes),
        max_seq_len=max([n for n, _ in specs] + [1]), scale=head_dim ** -0.5,
    )
