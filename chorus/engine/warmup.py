"""Compile every Triton kernel variant an engine step can launch, before the first request.

Triton compiles a kernel the first time it sees a new combination of constexpr values and launch
options (the arguments that vary per step are kept out of that key: ``do_not_specialize`` in the
kernel modules). Decode steps, and mixed steps that a mixed graph's bucket holds, replay CUDA
graphs whose kernels compile at capture; the other steps that mix prefill chunks with decode
rows run eagerly and would otherwise compile the attention plan of each new batch shape on
first use, seconds on the first burst a server sees.

``warm_up_kernels`` launches, once each, on scratch inputs and through the functions a step
calls:

- every attention launch ``launch_plan.reachable_launches`` finds for the engine's limits (the
  decode kernel, the query-block kernel at each ``BLOCK_Q``, each KV split count with its reduce,
  the shared-prefix suffix, prefix and merge kernels), each forced to its plan and checked to
  be the plan the step's own ``plan_attention`` gives that scratch batch;
- one eager forward of the model over a two-token row (K/V writes, the fused norm, RoPE and
  SwiGLU kernels in the step's layouts);
- the sampler kernel, with and without noise.

Nothing it does reaches the KV cache's contents: the attention kernels only read the pool (at
block 0), the forward's slots are all -1 (nothing written), and the captured graphs keep their
own static buffers. A no-op off CUDA.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from chorus import capture_gate
from chorus.engine.attention import uses_triton
from chorus.engine.attention.launch_plan import (
    PagedLaunch, SharedLaunch, StepLimits, num_sms, plan_attention, query_block_size, reachable_launches,
)
from chorus.engine.config import SchedulerConfig
from chorus.engine.paged_cache import AttentionMetadata, PagedKVCache


@dataclass(frozen=True)
class WarmupReport:
    """What a warm-up launched and how long it took (seconds, device work included)."""

    seconds: float
    attention_launches: int
    forward: bool
    sampler_launches: int


def step_limits(scheduler: SchedulerConfig, shared_prefix_min_rows: int | None) -> StepLimits:
    """The bounds of an engine's steps as the attention planner sees them: rows, tokens and
    context per step from the scheduler's config; ``shared_prefix_min_rows``: decode rows from
    which the runner may plan shared-prefix attention (None: it never does)."""
    return StepLimits(max_rows=scheduler.max_num_seqs, max_tokens=scheduler.max_num_batched_tokens,
                      max_seq_len=scheduler.max_model_len, shared_prefix_min_rows=shared_prefix_min_rows)


def warm_up_kernels(model, cache: PagedKVCache, limits: StepLimits, *, sampler_vocab: int | None,
                    sampler_no_token: int = -1) -> WarmupReport | None:
    """Compile the eager step's kernel variants (see the module docstring); None off CUDA.

    ``sampler_vocab``: the logits' width the sampler draws from (None: skip the sampler).
    """
    if model.device.type != "cuda":
        return None
    start = time.perf_counter()
    with torch.inference_mode():
        launches = _warm_attention(cache, model.dtype, limits)
        _warm_forward(model, cache)
        sampled = _warm_sampler(model.device, sampler_vocab, sampler_no_token) if sampler_vocab else 0
    capture_gate.synchronize(model.device)
    return WarmupReport(seconds=time.perf_counter() - start, attention_launches=launches, forward=True,
                        sampler_launches=sampled)


def _warm_attention(cache: PagedKVCache, dtype: torch.dtype, limits: StepLimits) -> int:
    key_cache, value_cache = cache.kv[0, 0], cache.kv[0, 1]
    if not uses_triton(cache.backend, key_cache):
        return 0
    heads = key_cache.shape[2]
    launches = reachable_launches(limits, heads, num_sms(key_cache.device))
    scales = (cache.kv_scales[0, 0:1], cache.kv_scales[0, 1:2]) if cache.quantized else (None, None)
    for launch in sorted(launches, key=repr):
        if isinstance(launch, SharedLaunch):
            _shared_launch(launch, key_cache, value_cache, dtype, cache.scale, scales)
        else:
            _paged_launch(launch, key_cache, value_cache, dtype, cache.scale, scales, limits.max_seq_len)
    return len(launches)


def _paged_launch(launch: PagedLaunch, key_cache: torch.Tensor, value_cache: torch.Tensor, dtype: torch.dtype,
                  scale: float, scales: tuple, max_seq_len: int) -> None:
    """One row over block 0: a decode token, or the fewest tokens that get ``launch.block_q``."""
    from chorus.engine.attention.triton_paged import paged_attention_triton

    assert not launch.kv_start, "kv_start launches belong to the shared path"
    heads, head_dim = key_cache.shape[2:]
    block_size = key_cache.shape[1]
    dev = key_cache.device
    if launch.block_q == 1:
        q_len = 1
    else:
        q_len = next(m for m in range(2, max_seq_len + 1) if query_block_size(m) == launch.block_q)
    blocks = -(-q_len // block_size)
    plan = plan_attention(1, q_len, q_len, 1 if q_len == 1 else 0, q_len, heads, num_sms(dev),
                          num_splits=launch.num_splits)
    assert plan.launches() == [launch], (plan, launch)
    q = torch.zeros(q_len, heads, head_dim, dtype=dtype, device=dev)
    paged_attention_triton(
        q, key_cache, value_cache, torch.zeros(1, blocks, dtype=torch.int32, device=dev),
        torch.tensor([q_len], dtype=torch.int32, device=dev), torch.tensor([0, q_len], dtype=torch.int32, device=dev),
        scale, max_query_len=q_len, num_decodes=1 if q_len == 1 else 0, max_seq_len=q_len,
        num_splits=launch.num_splits, k_scale=scales[0], v_scale=scales[1])


def _shared_launch(launch: SharedLaunch, key_cache: torch.Tensor, value_cache: torch.Tensor, dtype: torch.dtype,
                   scale: float, scales: tuple) -> None:
    """Two decode rows sharing block 0 as a one-group prefix, with ``launch``'s choices (and, for
    an FP8 pool, the layer-0 scales: the steps' ``HAS_SCALE`` variants)."""
    from chorus.engine.attention.shared_prefix import SharedPrefixTensors
    from chorus.engine.attention.triton_shared_prefix import shared_prefix_decode_triton

    heads, head_dim = key_cache.shape[2:]
    block_size = key_cache.shape[1]
    dev = key_cache.device
    i32 = dict(dtype=torch.int32, device=dev)
    seq_len = block_size + 1  # the prefix (block 0) ends before each row's last position
    shared = SharedPrefixTensors(prefix_len=torch.full((2,), block_size, **i32), group_rows=torch.arange(2, **i32),
                                 group_start=torch.tensor([0, 2, 2], **i32), max_groups=1)
    q = torch.zeros(2, heads, head_dim, dtype=dtype, device=dev)
    shared_prefix_decode_triton(
        q, key_cache, value_cache, torch.zeros(2, 2, **i32), torch.full((2,), seq_len, **i32),
        torch.arange(3, **i32), scale, shared, num_decodes=2, max_seq_len=seq_len, out=torch.empty_like(q),
        launch=launch, k_scale=scales[0], v_scale=scales[1])


def _warm_forward(model, cache: PagedKVCache) -> None:
    """One eager forward of a two-token row that writes nothing (slots -1)."""
    dev = model.device
    tokens = 2
    metadata = AttentionMetadata.single_row(0, tokens, 1, dev)
    metadata.slot_mapping = torch.full((tokens,), -1, dtype=torch.long, device=dev)
    embeds = torch.zeros(tokens, model.config.hidden_size, dtype=model.dtype, device=dev)
    cache.metadata = metadata
    try:
        model(embeds, torch.arange(tokens, device=dev), cache)
    finally:
        cache.metadata = None


def _warm_sampler(device: torch.device, vocab: int, no_token: int) -> int:
    from chorus.sampling.sampler import _KERNELS
    from chorus.triton_backend import use_triton

    processed = torch.zeros(1, vocab, dtype=torch.float32, device=device)
    if not use_triton("auto", processed, _KERNELS, "sampler"):
        return 0
    from chorus.sampling.triton_sampler import sample_triton

    lanes = torch.zeros(1, 2, dtype=torch.int64, device=device)
    steps = torch.zeros(1, dtype=torch.int64, device=device)
    for all_greedy in (False, True):
        sample_triton(processed, lanes, steps, torch.full((1,), all_greedy, device=device), all_greedy, no_token)
    return 2
