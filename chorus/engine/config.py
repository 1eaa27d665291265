"""Typed, validated configuration of the T3 engine: KV cache, scheduler, and the two together.

Every field is checked in ``__post_init__`` and a bad value raises ``ValueError`` naming the
field, the value and the rule, so a wrong CLI flag or env var fails at start-up, not mid-run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from chorus.engine.intmath import cdiv


KV_CACHE_DTYPES = ("auto", "fp8_e4m3")

# The smallest prompt-position bucket of the mixed-step CUDA graphs (EngineConfig.mixed_graph_tokens;
# chorus.engine.cuda_graphs): an admitting step carries a whole prompt, tens of positions at least, so
# a smaller bucket would hold no step and its graphs would be captured for nothing.
MIN_MIXED_GRAPH_TOKENS = 64


def valid_mixed_graph_tokens(value) -> bool:
    """Whether ``value`` is a setting of ``EngineConfig.mixed_graph_tokens``: 0 (off) or an int of
    at least ``MIN_MIXED_GRAPH_TOKENS``."""
    return isinstance(value, int) and not isinstance(value, bool) and (value == 0 or value >= MIN_MIXED_GRAPH_TOKENS)


# Seconds one T3 step should take at most, by device type (SchedulerConfig.step_time_target_s).
# On a CPU a decode step of the full-size models is a good part of a second and a 4096-position
# chunk minutes (docs/engine.md, "Step time"). On a GPU the token budget already bounds a step
# (a 4096-position chunk of the full-size models is ~3 TFLOP, tens of ms on an H200), and timing
# every step there was measured to cost T3 steps host time (turbo's one-request stream: T3 busy
# 0.27 -> 0.40 s, first token 4.8 -> 9.9 ms), so a GPU has no time target unless one is set.
DEFAULT_STEP_TIME_TARGET_S = {"cpu": 1.0, "cuda": math.inf}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache.

    block_size: positions per block (a power of two: attention kernels tile by it).
    num_blocks: pool size; None means "from ``gpu_memory_utilization`` after profiling".
    gpu_memory_utilization: fraction of GPU memory the process may use, KV pool included.
    enable_prefix_caching: reuse blocks across requests with the same prefix.
    shared_prefix_attention: decode rows that share prefix blocks (a voice prompt) read them
        once per group and step, when that pays (many rows, most of their KV shared).
    kv_cache_bytes: explicit byte budget of the pool (used when num_blocks is None; the
        default on CPU is 1 GiB, on GPU the budget comes from profiling).
    kv_cache_dtype: "auto" stores K/V in the model's dtype; "fp8_e4m3" stores them as FP8 e4m3
        with a static scale per layer (half the bytes of bf16, so twice the blocks per byte
        budget, at a measured accuracy cost: docs/engine.md, "FP8 KV cache").
    """

    block_size: int = 16
    num_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    shared_prefix_attention: bool = True
    kv_cache_bytes: int | None = None
    kv_cache_dtype: str = "auto"

    def __post_init__(self):
        b = self.block_size
        _require(isinstance(b, int) and b > 0 and b & (b - 1) == 0 and b <= 256,
                 f"block_size must be a power of two in [1, 256], got {b!r}")
        _require(self.num_blocks is None or (isinstance(self.num_blocks, int) and self.num_blocks > 0),
                 f"num_blocks must be a positive int or None, got {self.num_blocks!r}")
        _require(self.kv_cache_bytes is None or (isinstance(self.kv_cache_bytes, int) and self.kv_cache_bytes > 0),
                 f"kv_cache_bytes must be a positive int or None, got {self.kv_cache_bytes!r}")
        _require(0.0 < self.gpu_memory_utilization <= 1.0,
                 f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        _require(self.kv_cache_dtype in KV_CACHE_DTYPES,
                 f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)} (auto: the model's dtype), "
                 f"got {self.kv_cache_dtype!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching.

    max_num_seqs: rows per step (a CFG request takes two).
    max_num_batched_tokens: positions computed per step over all rows (prefill chunks + decode).
    max_model_len: positions per row at the longest (prompt + max_tokens); longer requests
        are rejected at admission.
    enable_chunked_prefill: split prompts across steps to fit the token budget; when off a
        prompt is prefilled in one step, so the budget must cover ``max_model_len``.
    async_scheduling: in steady decoding, schedule and queue the next step on the device
        before reading the tokens of the one in flight (``Scheduler.schedule_ahead``), so host
        work overlaps the forward. Tokens are unchanged; a request that stops on EOS costs one
        wasted row in the step after.
    admit_ahead: with ``async_scheduling``, a step scheduled ahead also admits new requests
        (their first prompt chunk beside the decode rows), where the pool has the blocks without
        preempting anyone. Without it an arrival ends the lookahead: the engine waits for the
        step in flight, then schedules and launches the admitting step while the device idles,
        once per arrival. Tokens are unchanged either way; a preempted request's recompute, and
        an arrival that would need a preemption, still take the regular schedule
        (docs/engine.md, "One-step lookahead").
    step_time_target_s: the time one step should take at most. The token budget bounds
        positions, not seconds, and a position costs very different time on different devices,
        so a step's prefill positions (beside its decode rows, which always run) are also bounded
        by what fits this many seconds, predicted from the steps timed so far
        (``chorus.engine.step_cost``). None: the device's default
        (``DEFAULT_STEP_TIME_TARGET_S``: 1 s on a CPU; none on a GPU, where the token budget
        already bounds a step to tens of milliseconds and timing every step cost the one-request
        step measurable host time); ``math.inf``: no time bound (the token budget only; steps are
        then not timed).
    initial_prefill_tokens: prefill positions a step may take while no step with prefill has
        been timed yet (the first steps after start-up): small, so the first step is short on
        any device.
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    async_scheduling: bool = True
    admit_ahead: bool = False
    step_time_target_s: float | None = None
    initial_prefill_tokens: int = 128

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "initial_prefill_tokens"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value > 0, f"{name} must be a positive int, got {value!r}")
        _require(self.max_num_batched_tokens >= self.max_num_seqs,
                 f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                 f"({self.max_num_seqs}): every running row decodes one token per step")
        _require(self.enable_chunked_prefill or self.max_num_batched_tokens >= self.max_model_len,
                 f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) "
                 f"must cover a whole prompt: >= max_model_len ({self.max_model_len})")
        _require(self.async_scheduling or not self.admit_ahead,
                 "admit_ahead needs async_scheduling (it admits in the steps scheduled ahead)")
        target = self.step_time_target_s
        _require(target is None or (isinstance(target, (int, float)) and not isinstance(target, bool) and target > 0),
                 f"step_time_target_s must be a positive number of seconds (math.inf: no time bound) or None "
                 f"(the device's default), got {target!r}")
        _require(target is None or self.enable_chunked_prefill or math.isinf(target),
                 f"step_time_target_s={target!r} needs enable_chunked_prefill (a step's prompt positions are "
                 f"cut to fit the time); without it set step_time_target_s=math.inf")

    def resolved_step_time_target(self, device_type: str) -> float:
        """``step_time_target_s``, or the default of a device of ``device_type`` ("cpu",
        "cuda", ...) when it is None."""
        if self.step_time_target_s is not None:
            return float(self.step_time_target_s)
        if not self.enable_chunked_prefill:
            return math.inf
        return DEFAULT_STEP_TIME_TARGET_S.get(device_type, DEFAULT_STEP_TIME_TARGET_S["cuda"])


@dataclass(frozen=True)
class EngineConfig:
    """The T3 engine: which variant it serves plus its cache and scheduler settings.

    default_deadline_s: deadline given to requests that bring none (None: no deadline).
    warm_up_kernels: on CUDA, compile every Triton kernel variant a step can launch when the
        engine is built (after graph capture), so that the first mixed prefill/decode steps do
        not compile them while serving (``chorus.engine.warmup``; docs/engine.md, "Kernel
        variants and warm-up"). A no-op on the CPU.
    mixed_graph_tokens: on CUDA with CUDA graphs, a step that admits (up to 8 rows of prompt
        positions beside its decode rows) with at most this many prompt positions replays a
        graph captured per (decode rows, prompt positions) bucket, 64, 128, ... up to this
        or ``max_num_batched_tokens``, the smaller (``chorus.engine.cuda_graphs``); larger ones
        run eagerly. 0: every such step runs eagerly (docs/engine.md, "CUDA graphs"); otherwise
        at least ``MIN_MIXED_GRAPH_TOKENS`` (64), the smallest bucket.
    admit_within_graphs: with mixed graphs, a step that decodes admits (and prefills) only what
        the largest of them holds, 8 prompt rows and ``mixed_graph_tokens`` positions (or the
        token budget, the smaller); the rest waits for the next steps (``Scheduler``'s
        ``PrefillShape``). A burst of arrivals is then admitted over a few graph replays instead
        of one eager step that every running row waits for (docs/engine.md, "CUDA graphs").
    alignment: let requests ask for alignment rows (``T3Request.want_alignment``; Llama variants):
        the attention cache then keeps the aligned heads' queries of every step (one small copy
        per such layer, inside the CUDA graphs too; docs/timestamps.md). Off: no step pays it,
        and a request that asks is refused at admission.
    fp8_linears: run T3's layer projections (attention in and out, MLP in and out) as FP8 E4M3
        GEMMs with per-row scales (``Backbone.use_fp8``, ``chorus.models.fp8``), set on the model
        when the engine is built, before its CUDA graphs are captured. On CUDA it needs compute
        capability 8.9 or newer; on the CPU it runs an exact emulation (for measurements, not
        speed). Off by default: its error is measured (docs/engine.md, "FP8 linears"), its speed
        not yet.
    """

    variant: str = "original"
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    default_deadline_s: float | None = 30.0
    warm_up_kernels: bool = True
    mixed_graph_tokens: int = 256
    admit_within_graphs: bool = True
    alignment: bool = False
    fp8_linears: bool = False

    def __post_init__(self):
        from chorus.models.variants import get_variant  # raises a readable error for unknown names

        object.__setattr__(self, "variant", get_variant(self.variant).name)
        _require(self.default_deadline_s is None or self.default_deadline_s > 0,
                 f"default_deadline_s must be positive or None, got {self.default_deadline_s!r}")
        tokens = self.mixed_graph_tokens
        _require(valid_mixed_graph_tokens(tokens),
                 f"mixed_graph_tokens must be 0 (off) or an int >= {MIN_MIXED_GRAPH_TOKENS} (the smallest "
                 f"bucket; a step that admits carries a whole prompt), got {tokens!r}")
        n = self.cache.num_blocks
        if n is not None:
            need = cdiv(self.scheduler.max_model_len, self.cache.block_size)
            _require(n >= need,
                     f"num_blocks ({n}) cannot hold one request of max_model_len "
                     f"({self.scheduler.max_model_len}): need at least {need} blocks")

    @classmethod
    def from_flat(cls, **kwargs) -> EngineConfig:
        """Build from flat keyword arguments (CLI flags, env vars): each name goes to the
        config that has a field of that name; unknown names are an error."""
        parts: dict[type, dict] = {cls: {}, CacheConfig: {}, SchedulerConfig: {}}
        for key, value in kwargs.items():
            owner = next((c for c in parts if key in {f.name for f in fields(c)} - {"cache", "scheduler"}), None)
            if owner is None:
                known = sorted(f.name for c in parts for f in fields(c) if f.name not in ("cache", "scheduler"))
                raise ValueError(f"unknown engine option {key!r}; known options: {', '.join(known)}")
            parts[owner][key] = value
        return cls(cache=CacheConfig(**parts[CacheConfig]),
                   scheduler=SchedulerConfig(**parts[SchedulerConfig]), **parts[cls])

