"""The T3 engine: continuous batching of many requests over one model and one paged KV cache.

``add_request`` / ``step`` / ``abort`` are the synchronous core (one owner thread);
``generate`` runs a list of requests to completion (batch jobs, benchmarks);
``chorus.engine.async_engine.AsyncT3Engine`` puts the loop on its own thread and streams
tokens to asyncio consumers.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from chorus import capture_gate
from chorus.engine.config import EngineConfig
from chorus.engine.cuda_graphs import MIXED_PROMPT_ROWS, StepGraphs, mixed_token_buckets
from chorus.engine.kv_cache_manager import KVCacheManager
from chorus.engine.model_runner import (NAN_LOGITS, SHARED_PREFIX_MAX_GROUPS, SHARED_PREFIX_MIN_ROWS, LaunchedStep,
                                       ModelRunner)
from chorus.engine.paged_cache import PagedKVCache, kv_bytes_per_block, resolve_kv_cache_dtype
from chorus.engine.sampler_graphs import SamplerGraphs
from chorus.engine.request import FinishReason, Priority, Request, T3Prompt
from chorus.engine.scheduler import (AdmissionError, PrefillShape, RequestOutput, Scheduler, SchedulerOutput,
                                     SchedulerStats)
from chorus.engine.warmup import WarmupReport, step_limits, warm_up_kernels
from chorus.models.t3.alignment import alignment_heads
from chorus.models.t3.model import T3Model
from chorus.models.variants import Variant
from chorus.sampling import NO_TOKEN, SamplingParams
from chorus.t3_sequential import uses_cfg

_ids = itertools.count()
DEFAULT_CPU_KV_BYTES = 1 << 30


def _check_kv_dtype_supported(dtype: torch.dtype, device: torch.device) -> None:
    """FP8 K/V need hardware FP8 conversions on CUDA (compute capability 8.9+: Ada, Hopper)."""
    if dtype == torch.float8_e4m3fn and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise ValueError(f"kv_cache_dtype fp8_e4m3 needs a GPU of compute capability 8.9 or newer "
                             f"(Ada, Hopper); this one is {major}.{minor}: use kv_cache_dtype auto")


def _check_fp8_linears_supported(device: torch.device) -> None:
    """FP8 GEMMs need ``torch._scaled_mm`` on CUDA (compute capability 8.9+: Ada, Hopper); the
    CPU runs their emulation."""
    from chorus.models.fp8 import scaled_mm_supported

    if device.type == "cuda" and not scaled_mm_supported(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(f"fp8_linears needs a GPU of compute capability 8.9 or newer (Ada, Hopper); this one "
                         f"is {major}.{minor}: leave fp8_linears off (--fp8 without t3)")


@dataclass(frozen=True)
class Conditioning:
    """A conditioning prefix as T3 sees it: its cache identity and its embeddings.

    key: ``conditioning_key(variant, voice content hash, exaggeration)``; equal keys must mean
    equal embeddings (the prefix cache shares KV blocks by it).
    embeds: [1, C, D] from ``T3Model.encode_conditioning``, on the model's device and dtype.
    """

    key: bytes
    embeds: torch.Tensor

    def __post_init__(self):
        if self.embeds.ndim != 3 or self.embeds.shape[0] != 1:
            raise ValueError(f"conditioning embeds must be [1, C, D], got {list(self.embeds.shape)}")


@dataclass
class T3Request:
    """One generation as a caller submits it: only what T3 needs.

    text_ids: tokenizer output (unframed; the engine adds SOT/EOT where the variant needs them).
    conditioning: the voice's conditioning prefix (built above the engine, e.g. by
    ``chorus.pipeline.ConditioningCache``). params: sampling parameters
    (``SamplingParams.for_variant``); its ``max_new_tokens``, ``min_new_tokens`` and
    ``ignore_eos`` bound the output. deadline_s: seconds from now, None for the engine's default.
    want_alignment: give each sampled token's alignment row (its attention on the framed text,
    ``chorus.models.t3.alignment``) with the token; Llama variants only.
    """

    text_ids: Sequence[int]
    conditioning: Conditioning
    params: SamplingParams
    priority: int = Priority.NORMAL
    deadline_s: float | None = None
    request_id: str | None = None
    want_alignment: bool = False


@dataclass
class T3Result:
    request_id: str
    tokens: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    error: str | None = None
    # with ``want_alignment``: [tokens, framed text positions], row k for tokens[k]
    alignment: torch.Tensor | None = None


@dataclass(frozen=True)
class _FailedStep:
    """A step whose launch raised: committing it fails its requests."""

    output: SchedulerOutput
    error: Exception


class _StepTimer:
    """A step's time for the step-cost model. On CUDA, device time between two events recorded
    around its launch (a step queued behind another starts when that one ends, so the wait is
    not counted); elsewhere the launch computes the step, and the time is the host's, launch
    plus collect."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.started = time.perf_counter()
        self.launch_s = 0.0

    def launched(self) -> None:
        if self.cuda:
            self.end.record()
        else:
            self.launch_s = time.perf_counter() - self.started

    def collected(self, collect_started: float) -> float:
        """Seconds of the step; call once its tokens have been read (``collect_started``: the
        ``perf_counter`` when reading them began)."""
        if self.cuda:
            self.end.synchronize()
            return self.start.elapsed_time(self.end) / 1000
        return self.launch_s + time.perf_counter() - collect_started


class T3Engine:
    """Owns the scheduler, the KV cache and the model runner of one T3 model."""

    def __init__(self, model: T3Model, variant: Variant, config: EngineConfig | None = None,
                 *, attention_backend: str = "auto", cuda_graphs: bool = True, sampler_graphs: bool | None = None,
                 kv_scale_rule: str | None = None):
        """On CUDA, ``cuda_graphs`` captures the decode forward per batch-size bucket (and the
        steps that admit a few prompts beside them, ``EngineConfig.mixed_graph_tokens``) and
        ``sampler_graphs`` (None: as ``cuda_graphs``) each step's sampling, which then gives
        the eager sampler's tokens with a fraction of its kernel launches. ``kv_scale_rule``
        (None: ``kv_quant.DEFAULT_KV_SCALE_RULE``) sets an FP8 cache's static scales. With
        ``EngineConfig.warm_up_kernels`` (the default) the Triton kernel variants of eager steps
        are compiled last, on CUDA (``self.warmup`` reports it)."""
        self.model = model
        self.variant = variant
        self.config = config or EngineConfig(variant=variant.name)
        bb = variant.t3.backbone
        cache_cfg = self.config.cache
        if self.config.fp8_linears:
            _check_fp8_linears_supported(model.device)
        # the model's projections as this engine runs them, before the profiling pass and any capture
        model.tfmr.use_fp8(self.config.fp8_linears)
        self.kv_cache_dtype = resolve_kv_cache_dtype(cache_cfg.kv_cache_dtype, model.dtype)
        _check_kv_dtype_supported(self.kv_cache_dtype, model.device)
        num_blocks = cache_cfg.num_blocks or self._size_pool(model)
        self.kv_cache = PagedKVCache(
            bb.num_layers, num_blocks, cache_cfg.block_size, bb.num_kv_heads, bb.head_dim,
            dtype=self.kv_cache_dtype, device=model.device, backend=attention_backend,
        )
        if self.kv_cache.quantized:  # static scales, fixed before any K/V or graph exists
            from chorus.engine.kv_quant import DEFAULT_KV_SCALE_RULE, kv_scales

            self.kv_cache.set_kv_scales(kv_scales(model, kv_scale_rule or DEFAULT_KV_SCALE_RULE))
        self.kv_manager = KVCacheManager(num_blocks, cache_cfg.block_size, cache_cfg.enable_prefix_caching)
        graphed = cuda_graphs and model.device.type == "cuda"
        mixed_tokens = mixed_token_buckets(min(self.config.mixed_graph_tokens,
                                               self.config.scheduler.max_num_batched_tokens)) if graphed else []
        self.scheduler = Scheduler(
            self.config.scheduler, self.kv_manager,
            step_time_target_s=self.config.scheduler.resolved_step_time_target(model.device.type),
            prefill_shape=PrefillShape(MIXED_PROMPT_ROWS, mixed_tokens[-1])
            if mixed_tokens and self.config.admit_within_graphs else None)
        self._timers: dict[int, _StepTimer] = {}  # id(LaunchedStep) -> its timer, until committed
        shared_prefix = cache_cfg.shared_prefix_attention
        self.runner = ModelRunner(model, variant, self.kv_cache, shared_prefix=shared_prefix)
        # before capture: graphs keep the alignment heads' queries too (a padded batch of a mixed
        # graph holds up to max_rows more positions than the step)
        sched = self.config.scheduler
        if self.config.alignment:
            self.runner.keep_alignment_queries(sched.max_num_batched_tokens + min(sched.max_num_seqs, 512))
        if graphed:
            self.runner.graphs = StepGraphs(
                model, self.kv_cache, max_rows=min(sched.max_num_seqs, 512),
                max_blocks_per_row=-(-sched.max_model_len // cache_cfg.block_size), max_seq_len=sched.max_model_len,
                shared_prefix_rows=SHARED_PREFIX_MIN_ROWS if shared_prefix else None,
                shared_prefix_max_groups=SHARED_PREFIX_MAX_GROUPS,
                mixed_token_buckets=mixed_tokens)
        if (cuda_graphs if sampler_graphs is None else sampler_graphs) and model.device.type == "cuda":
            self.runner.sampler_graphs = SamplerGraphs(
                variant, model.device, max_rows=min(self.config.scheduler.max_num_seqs, 512))
            self.runner.sampler_graphs.warm_up_defaults()
        self.warmup: WarmupReport | None = None  # what the kernel warm-up did (None: it did not run)
        if self.config.warm_up_kernels and model.device.type == "cuda":
            limits = step_limits(self.config.scheduler, SHARED_PREFIX_MIN_ROWS if shared_prefix else None)
            self.warmup = warm_up_kernels(model, self.kv_cache, limits,
                                          sampler_vocab=model.config.speech_vocab_size, sampler_no_token=NO_TOKEN)
        self.num_steps = 0
        self.last_step_seconds: float | None = None  # the last timed step (see _StepTimer)
        self.num_steps_ahead = 0  # steps scheduled ahead of the previous one's commit
        # the step the last step() call committed computed prompt positions (a new request's
        # prompt chunk or a recompute); on CUDA it replays a mixed graph only when one holds it
        self.last_step_prefilled = False
        self._ahead: LaunchedStep | _FailedStep | None = None  # the step scheduled ahead and queued on the device (async scheduling)

    # -- sizing ----------------------------------------------------------------------------------
    def _size_pool(self, model: T3Model) -> int:
        bb, cache_cfg = self.variant.t3.backbone, self.config.cache
        per_block = kv_bytes_per_block(bb.num_layers, cache_cfg.block_size, bb.num_kv_heads, bb.head_dim,
                                       self.kv_cache_dtype)
        need = -(-self.config.scheduler.max_model_len // cache_cfg.block_size) * (2 if self.variant.t3.supports_cfg else 1)
        if cache_cfg.kv_cache_bytes is not None:
            budget = cache_cfg.kv_cache_bytes
        elif model.device.type == "cuda":
            budget = self._profile_free_bytes(model)
        else:  # host memory is not profiled: the default, or one longest request (the original's CFG pair in fp32)
            budget = max(DEFAULT_CPU_KV_BYTES, need * per_block)
        num_blocks = int(budget // per_block)
        if num_blocks < need:
            raise ValueError(
                f"the KV cache budget of {budget / 2**20:.0f} MiB holds {num_blocks} blocks but one "
                f"request of max_model_len={self.config.scheduler.max_model_len} needs {need}; raise "
                f"gpu_memory_utilization / kv_cache_bytes or lower max_model_len")
        return num_blocks

    def _profile_free_bytes(self, model: T3Model) -> int:
        """Bytes left for the KV pool under ``gpu_memory_utilization`` after a forward of the
        largest step (``max_num_batched_tokens`` prefill positions) on a scratch cache, less the
        memory this process holds without using it once its cache is emptied (the private pools
        of CUDA graphs captured before, e.g. the vocoder's warm-up: ``empty_cache`` cannot return
        it, and their replays need it)."""
        device = model.device
        tokens = self.config.scheduler.max_num_batched_tokens
        bb = self.variant.t3.backbone
        scratch_blocks = -(-tokens // self.config.cache.block_size)
        scratch = PagedKVCache(bb.num_layers, scratch_blocks, self.config.cache.block_size,
                               bb.num_kv_heads, bb.head_dim, dtype=self.kv_cache_dtype, device=device)
        from chorus.engine.paged_cache import AttentionMetadata

        # GPT-2 has a finite position table
        positions = torch.arange(tokens, device=device).clamp(max=bb.max_positions - 1)
        scratch.metadata = AttentionMetadata.single_row(0, tokens, scratch_blocks, device)
        capture_gate.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        with torch.inference_mode():
            embeds = torch.zeros(tokens, bb.hidden_size, dtype=model.dtype, device=device)
            hidden = model(embeds, positions, scratch)
            model.speech_logits(hidden[-256:]).float()
        capture_gate.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        del scratch, hidden, embeds
        capture_gate.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device)
        used_by_others = total - free - reserved
        held_by_graphs = reserved - torch.cuda.memory_allocated(device)
        budget = total * self.config.cache.gpu_memory_utilization - used_by_others - peak - held_by_graphs
        return max(int(budget), 0)

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, request: T3Request) -> str:
        """Admit a request; returns its id. Admission is atomic: every check (lengths against
        ``max_model_len``, the KV pool and the model's position tables; the prompt embeddings)
        runs before anything is queued, and a request that raises ``AdmissionError`` /
        ``ValueError`` leaves no trace in the scheduler or the runner."""
        return self._enter(self._admission(request))

    def add_requests(self, requests: Sequence[T3Request]) -> list[str | Exception]:
        """Admit several requests, each as :meth:`add_request` admits it (atomically: one that
        fails leaves no trace and does not keep the others out), in order; per request its id or
        the exception that refused it. Their prompt embeddings are made in one batch
        (``ModelRunner.embed_ahead``), so a burst of arrivals costs this thread a few tensor
        calls, not about ten per request (docs/engine.md, "Admission")."""
        outcomes: list[_Admission | str | Exception] = []
        for request in requests:
            try:
                outcomes.append(self._admission(request))
            except Exception as exc:  # noqa: BLE001 - handed back as this request's outcome
                outcomes.append(exc)
        admitted = [a for a in outcomes if isinstance(a, _Admission)]
        self.runner.embed_ahead({a.request_id: (a.cond_embeds, a.text_ids, a.cfg) for a in admitted})
        try:
            for i, outcome in enumerate(outcomes):
                if isinstance(outcome, _Admission):
                    try:
                        outcomes[i] = self._enter(outcome)
                    except Exception as exc:  # noqa: BLE001 - handed back as this request's outcome
                        outcomes[i] = exc
        finally:
            self.runner.forget_ahead()
        return outcomes  # type: ignore[return-value]  # every _Admission was replaced

    def _admission(self, request: T3Request) -> "_Admission":
        """Every check of a request that needs no engine state; what :meth:`_enter` queues."""
        params = request.params.fitted_to(self.variant)
        request_id = request.request_id or f"t3-{next(_ids)}"
        cfg = uses_cfg(self.variant, params)
        cond = request.conditioning
        if request.want_alignment:
            alignment_heads(self.variant.t3.backbone)  # raises where none are known
        text_ids = torch.as_tensor(list(request.text_ids), dtype=torch.long)
        if text_ids.ndim != 1 or text_ids.numel() == 0:
            raise ValueError("the request has no text tokens")
        prompt = T3Prompt.for_variant(self.variant.t3, cond_key=cond.key, cond_len=cond.embeds.shape[1],
                                      text_ids=text_ids.tolist(), cfg=cfg)
        self._check_positions(request_id, prompt, params.max_new_tokens)
        deadline_s = request.deadline_s if request.deadline_s is not None else self.config.default_deadline_s
        engine_request = Request(
            request_id, prompt, sampling=params, priority=request.priority,
            deadline=None if deadline_s is None else time.monotonic() + deadline_s,
            max_tokens=params.max_new_tokens, min_tokens=params.min_new_tokens, ignore_eos=params.ignore_eos,
        )
        return _Admission(request_id, cond.embeds, text_ids, cfg, params, engine_request, request.want_alignment)

    def _enter(self, admission: "_Admission") -> str:
        request_id = admission.request_id
        if self.scheduler.get_request(request_id) is not None:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        self.runner.add_request(request_id, admission.cond_embeds, admission.text_ids, admission.cfg,
                                admission.params)  # may raise: nothing queued yet
        try:
            if admission.want_alignment:
                self.runner.want_alignment(request_id)
            self.scheduler.add_request(admission.engine_request)
        except BaseException:
            self.runner.remove_request(request_id)
            raise
        return request_id

    def _check_positions(self, request_id: str, prompt: T3Prompt, max_new_tokens: int) -> None:
        """Reject what the model's position tables cannot hold (learned text/speech positions,
        GPT-2's ``wpe``), before anything is allocated."""
        t3 = self.variant.t3
        limits = []
        if t3.learned_positions:
            limits.append((len(prompt.text_ids), t3.text_pos_rows, "text tokens (with start/stop)"))
            limits.append((prompt.bos_copies + max_new_tokens, t3.speech_pos_rows,
                           "speech positions (BOS + max_new_tokens)"))
        limits.append((prompt.num_tokens + max_new_tokens, t3.backbone.max_positions,
                       "positions (conditioning + text + speech)"))
        for used, rows, what in limits:
            if used > rows:
                raise AdmissionError(
                    f"request {request_id!r}: {used} {what} exceed the model's {rows}; "
                    f"shorten the text (split it into chunks) or lower max_new_tokens")

    def abort(self, request_id: str) -> RequestOutput | None:
        """Finish a request now, freeing every block it holds."""
        out = self.scheduler.abort(request_id)
        self.runner.remove_request(request_id)
        return out

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    # -- the loop --------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one step and return what each request got from it.

        With ``SchedulerConfig.async_scheduling`` (see docs/engine.md, "One-step lookahead") a steady decode
        step is scheduled and queued on the device before the tokens of the one in flight are
        read, so the host's work overlaps the GPU's: each call then commits the step in flight
        and leaves the next one queued. What each request gets, and in which order, is the
        same as without it."""
        if self._ahead is None:
            out = self.scheduler.schedule()
            results = list(out.finished)
            launched = self._launch(out, None)
        else:
            launched, self._ahead = self._ahead, None
            results = []
        if self.config.scheduler.async_scheduling and isinstance(launched, LaunchedStep):
            ahead = self.scheduler.schedule_ahead()
            if ahead is not None:
                self._ahead = self._launch(ahead, launched)
                self.num_steps_ahead += 1
        self.last_step_prefilled = launched.output.num_prefill_tokens > 0
        results.extend(self._commit(launched))
        if self._ahead is not None and all(r.is_finished for r in self._ahead.output.requests.values()):
            self.finish_in_flight()  # every request of it has ended: nothing to wait for
        self.num_steps += 1
        return results

    def finish_in_flight(self) -> list[RequestOutput]:
        """Commit the step queued ahead, if any, so nothing is in flight (for callers that then
        drive the scheduler or the runner directly)."""
        if self._ahead is None:
            return []
        launched, self._ahead = self._ahead, None
        return self._commit(launched)

    def _launch(self, out: SchedulerOutput, pending: LaunchedStep | None) -> LaunchedStep | _FailedStep:
        """Queue ``out`` on the device; a failure is kept and fails the step's requests at its
        commit (one failed step must not take the engine down)."""
        # steps are timed only for a time target (math.inf: none, e.g. a GPU's default)
        timer = _StepTimer(self.model.device) if math.isfinite(self.scheduler.step_time_target_s) else None
        try:
            launched = self.runner.launch(out, pending)
        except Exception as exc:  # noqa: BLE001
            return _FailedStep(out, exc)
        if timer is not None:
            timer.launched()
            self._timers[id(launched)] = timer
        return launched

    def _commit(self, launched: LaunchedStep | _FailedStep) -> list[RequestOutput]:
        """Read a launched step's tokens and commit it: stops, outputs, freed requests."""
        out, error, sampled = launched.output, None, {}
        if isinstance(launched, _FailedStep):
            error = launched.error
        else:
            timer = self._timers.pop(id(launched), None)
            collect_started = time.perf_counter()
            try:
                sampled = self.runner.collect(launched)
            except Exception as exc:  # noqa: BLE001
                error = exc
            if error is None and timer is not None:
                self._observe_step(out, timer.collected(collect_started))
        results = []
        if error is not None:
            # fail the step's requests (their blocks are freed), keep serving the others
            message = f"{type(error).__name__}: {error}"
            if isinstance(error, torch.cuda.OutOfMemoryError) and self.model.device.type == "cuda":
                capture_gate.empty_cache()  # give the failed step's memory back before the next one
            for request_id, request in out.requests.items():
                if not request.is_finished and self.scheduler.abort(request_id, FinishReason.ERROR, message):
                    results.append(RequestOutput(request_id, None, FinishReason.ERROR, message))
            sampled = {}
        for request_id, token in list(sampled.items()):
            if token == NO_TOKEN and not out.requests[request_id].is_finished:
                # every logit was -inf: nothing can be sampled, stop here
                del sampled[request_id]
                self.scheduler.abort(request_id, FinishReason.EOS)
                results.append(RequestOutput(request_id, None, FinishReason.EOS))
            elif token == NAN_LOGITS:
                # NaN logits: this request fails (its blocks are freed); the rest of the step goes on
                del sampled[request_id]
                message = "the model produced NaN logits"
                if not out.requests[request_id].is_finished and \
                        self.scheduler.abort(request_id, FinishReason.ERROR, message):
                    results.append(RequestOutput(request_id, None, FinishReason.ERROR, message))
        results.extend(self.scheduler.update_from_output(out, sampled))
        if error is None and isinstance(launched, LaunchedStep) and launched.alignment is not None:
            rows = launched.alignment_rows()
            results = [r._replace(alignment=rows[r.request_id])
                       if r.new_token is not None and r.request_id in rows else r for r in results]
        for result in results:
            if result.finish_reason is not None:
                self.runner.remove_request(result.request_id)
        return results

    def _observe_step(self, out: SchedulerOutput, seconds: float) -> None:
        """Feed a step's measured time to the scheduler's step-cost model."""
        self.last_step_seconds = seconds
        self.scheduler.step_cost.observe(out.num_decode_rows, out.num_prefill_tokens, seconds)

    def generate(self, requests: Sequence[T3Request]) -> list[T3Result]:
        """Run ``requests`` to completion with continuous batching; results in input order."""
        ids = [self.add_request(r) for r in requests]
        results = {rid: T3Result(rid) for rid in ids}
        rows: dict[str, list[torch.Tensor]] = {rid: [] for rid, r in zip(ids, requests) if r.want_alignment}
        while self.has_unfinished_requests():
            for event in self.step():
                result = results.get(event.request_id)
                if result is None:
                    continue
                if event.new_token is not None:
                    result.tokens.append(event.new_token)
                if event.alignment is not None:
                    rows[event.request_id].append(event.alignment)
                if event.finish_reason is not None:
                    result.finish_reason, result.error = event.finish_reason, event.error
        for rid, kept in rows.items():
            results[rid].alignment = torch.stack(kept) if kept else None
        return [results[rid] for rid in ids]


@dataclass(frozen=True)
class _Admission:
    """A request that passed every check of :meth:`T3Engine._admission`, ready to be queued."""

    request_id: str
    cond_embeds: torch.Tensor
    text_ids: torch.Tensor
    cfg: bool
    params: SamplingParams
    engine_request: Request
    want_alignment: bool = False
