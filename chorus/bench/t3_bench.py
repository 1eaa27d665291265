"""``chorus bench t3``: speed of the T3 engine, with the reference T3 loop for the ratio.

Output lengths are fixed (``tokens_per_char`` speech tokens per input character, 1.6 being the
ratio of the public 40-minute benchmark run) so random weights give the same work as a trained
model: EOS is banned until the length is reached, then generation stops. Measures:

- decode: per-step latency and speech tokens/s with B concurrent requests all decoding;
- workload: the benchmark text chunked at sentences, all chunks submitted at once, one voice;
  twice, each on a new engine: ``cold_t3_seconds`` is the first pass (what a freshly started
  server's first burst costs), ``t3_seconds`` the second; ``engine_warmup_seconds`` is the
  first pass's engine compiling its kernel variants when it was built (``EngineConfig.
  warm_up_kernels``, not counted in the pass; each decode entry reports its engine's too, and
  the first one built in a process pays for the compiles);
- yardstick: per batch size, the same model shape stepped in plain PyTorch at the same
  context (:mod:`chorus.bench.speed_of_light`), and its ratio to the engine step
  (``yardstick_step_ms``, ``yardstick_ratio``). A yardstick, not a bound: the engine can beat
  it (shared-prefix attention reads a voice prompt once per group, the plain step per row);
- chunk sweep (optional): the workload again for each chunk length bound, with the chunk count
  and the longest chunk, since the longest chunk's steps set an all-at-once workload's time;
- KV cache: the pool's dtype; with ``kv_cache_dtype="fp8_e4m3"`` every figure above runs on
  the FP8 cache and the report's ``kv_cache`` section adds the accuracy cost, the cosine of the
  logits (prefill and ``kv_accuracy_steps`` greedy decode steps of the first workload chunk)
  against a cache in the model's dtype (:mod:`chorus.engine.kv_accuracy`);
- FP8 linears (optional, ``fp8_linears``): every engine above runs T3's layer projections as
  FP8 GEMMs (``EngineConfig.fp8_linears``) and the report's ``fp8_error`` section adds their
  accuracy cost beside bf16's: the bench's request (first workload chunk, built-in voice)
  teacher-forced for ``fp8_error_steps`` steps through fp32, bf16 and bf16 with FP8 linears of the
  same weights, logits cosines and top-1 agreement (:mod:`chorus.bench.fp8_error`);
- roofline (optional): per batch size, one engine forward profiled eagerly, its GEMMs and
  attention against the card's peak and bandwidth (:mod:`chorus.bench.roofline`);
- timestamps cost (optional, Llama variants): per batch size, the decode test again on an
  engine that keeps alignment rows (``EngineConfig.alignment``, what ``chorus serve
  --timestamp-alignment`` builds), once with no row asking and once with every row asking
  (``T3Request.want_alignment``), each against the plain decode entry of the same batch size
  (``timestamps_cost``: step time ratios; same process, same card, each engine warmed alike);
- reference (optional): the reference package's own T3 loop (one chunk at a time, as it runs)
  on the same device, warm (one untimed call first), on chunks evenly spaced over the workload
  (at least ``reference_chunks``, more until a minute of audio), each checked to have generated
  its forced length, extrapolated to the whole workload; ``reference.method`` and
  ``speedup_method`` say so in the report.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch

from chorus.bench.reference_timing import DEFAULT_REFERENCE_CHUNKS, MIN_TIMED_AUDIO_S
from chorus.bench.speed_of_light import DecodeShape, PlainDecodeModel, describe, time_decode_step
from chorus.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from chorus.engine.engine import T3Engine, T3Request
from chorus.bench.report import write_report
from chorus.models.loading import Checkpoint, dtype_name, load_t3, parse_device, resolve_dtype
from chorus.models.random_checkpoint import write_random_checkpoint
from chorus.models.t3.model import T3Model
from chorus.models.variants import Variant, get_variant
from chorus.sampling import SamplingParams
from chorus.text import DEFAULT_MAX_CHARS, load_text_encoder, split_into_chunks
from chorus.text.encoder import TextEncoder
from chorus.pipeline.conditioning import ConditioningCache
from chorus.voices import Voice


@dataclass
class T3BenchConfig:
    variant: str | Variant = "original"  # a name, or a Variant (tests pass tiny ones)
    checkpoint: str | None = None  # None: a random-weight checkpoint in a temporary directory
    dtype: str = "auto"  # bf16 on CUDA, fp32 on the CPU (chorus.models.loading.resolve_dtype)
    device: str = "auto"
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256)
    decode_steps: int = 50
    warmup_steps: int = 5
    workload: bool = True
    text_file: str | None = None  # default: the shipped benchmark-text-1.txt
    max_chars: int = DEFAULT_MAX_CHARS
    chunk_chars: tuple[int, ...] = ()  # chunk length bounds to sweep the workload over; () skips it
    yardstick: bool = True  # the plain-PyTorch step per batch size (chorus.bench.speed_of_light)
    tokens_per_char: float = 1.6
    cfg_weight: float = 0.5
    reference: bool = False
    reference_chunks: int = DEFAULT_REFERENCE_CHUNKS  # the least timed; more until reference_min_audio_s
    reference_min_audio_s: float = MIN_TIMED_AUDIO_S
    cuda_graphs: bool = True
    async_scheduling: bool = True  # SchedulerConfig.async_scheduling: the one-step lookahead
    max_num_seqs: int = 512
    max_num_batched_tokens: int = 16384
    max_model_len: int = 2048
    kv_cache_gib: float = 64.0  # on CUDA; the CPU runs with 1 GiB
    kv_cache_dtype: str = "auto"  # or "fp8_e4m3" (CacheConfig.kv_cache_dtype)
    shared_prefix_attention: bool = True  # CacheConfig.shared_prefix_attention
    warm_up_kernels: bool = True  # EngineConfig.warm_up_kernels
    kv_accuracy_steps: int = 16  # decode steps of the FP8 accuracy check
    fp8_linears: bool = False  # EngineConfig.fp8_linears for every engine, and the fp8_error section
    fp8_error_steps: int = 64  # teacher-forced decode steps of the fp8_error section
    # the roofline report (chorus.bench.roofline): one decode step per batch size profiled against the card
    roofline: bool = False
    # the timestamps cost: the decode test again with alignment rows kept, idle and asked for by every row
    timestamps: bool = False
    peak_tflops: float | None = None  # override the card table's peak (every precision)
    peak_gbps: float | None = None  # override its HBM bandwidth
    extra: dict = field(default_factory=dict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_engine(model, variant, cfg: T3BenchConfig, rows: int, alignment: bool = False) -> T3Engine:
    """An engine for ``rows`` rows with the bench's cache and scheduler settings (no deadline);
    ``alignment``: one that keeps alignment rows for the requests that ask."""
    config = EngineConfig(
        variant=variant.name, default_deadline_s=None, warm_up_kernels=cfg.warm_up_kernels, alignment=alignment,
        fp8_linears=cfg.fp8_linears,
        cache=CacheConfig(kv_cache_bytes=int((cfg.kv_cache_gib if model.device.type == "cuda" else 1.0) * 2**30),
                          kv_cache_dtype=cfg.kv_cache_dtype, shared_prefix_attention=cfg.shared_prefix_attention),
        scheduler=SchedulerConfig(max_num_seqs=rows, max_num_batched_tokens=max(cfg.max_num_batched_tokens, rows),
                                  max_model_len=cfg.max_model_len, async_scheduling=cfg.async_scheduling),
    )
    return T3Engine(model, variant, config, cuda_graphs=cfg.cuda_graphs)


def _warmup_seconds(engine: T3Engine) -> float | None:
    """How long the engine's kernel warm-up took when it was built (None: it did not run)."""
    return None if engine.warmup is None else round(engine.warmup.seconds, 3)


def _release(engine: T3Engine) -> None:
    """Free an engine's KV pool and graphs before the next one is built."""
    engine.runner.graphs = engine.runner.sampler_graphs = None
    del engine
    _free_device_memory()


def _free_device_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def fixed_length_params(variant, cfg: T3BenchConfig, n_tokens: int, seed: int) -> SamplingParams:
    """The variant's sampling with exactly ``n_tokens`` speech tokens (EOS banned until then)."""
    return SamplingParams.for_variant(
        variant, seed=seed, max_new_tokens=n_tokens, min_new_tokens=n_tokens,
        cfg_weight=cfg.cfg_weight if variant.t3.supports_cfg else None)


def bench_decode(model, variant, conditioning, text_ids, cfg: T3BenchConfig, batch: int, roof=None,
                 alignment: tuple[bool, bool] = (False, False)) -> dict:
    """``alignment``: (the engine keeps alignment rows, every request asks for them)."""
    keeps, asks = alignment
    rows_per_request = 2 if variant.t3.supports_cfg and cfg.cfg_weight > 0 else 1
    engine = bench_engine(model, variant, cfg, batch * rows_per_request, alignment=keeps)
    warmup_s = _warmup_seconds(engine)
    device = model.device
    # every request must still be decoding at the roofline's profiled step: the ones admitted first
    # decode while the rest prefill, up to one token per prefill step, so the margin covers those
    prefill_steps_max = 64
    total = cfg.warmup_steps + cfg.decode_steps + min(10, cfg.decode_steps) + 4 + prefill_steps_max
    ids = [engine.add_request(T3Request(text_ids, conditioning, fixed_length_params(variant, cfg, total, i),
                                        want_alignment=asks)) for i in range(batch)]
    produced = {rid: 0 for rid in ids}
    prefill_steps = 0
    while min(produced.values()) < 1:  # prefill everything first
        prefill_steps += 1
        assert prefill_steps <= prefill_steps_max, f"prefilling {batch} requests took over {prefill_steps_max} steps"
        for e in engine.step():
            if e.new_token is not None:
                produced[e.request_id] += 1
    for _ in range(cfg.warmup_steps):
        engine.step()
    requests = [engine.scheduler.get_request(rid) for rid in ids]
    prompt_tokens = requests[0].prompt.num_tokens
    # a decode step of a row with n positions attends over all n of them, its new one included
    first_context = sum(r.num_tokens for r in requests) / len(requests)
    _sync(device)
    start = time.perf_counter()
    for _ in range(cfg.decode_steps):
        engine.step()
    _sync(device)
    elapsed = time.perf_counter() - start
    engine.finish_in_flight()  # the breakdown drives the scheduler and the runner itself
    breakdown = _step_breakdown(engine, device, steps=min(10, cfg.decode_steps))
    roofline = None
    if cfg.roofline:
        from chorus.bench.roofline_passes import profile_t3_step

        roofline = profile_t3_step(engine, ids, batch * rows_per_request, roof, elapsed / cfg.decode_steps)
    for rid in ids:
        engine.abort(rid)
    graphs = engine.runner.graphs is not None
    _release(engine)
    step_ms = 1000 * elapsed / cfg.decode_steps
    return {"batch": batch, "rows": batch * rows_per_request, "step_ms": round(step_ms, 3),
            "speech_tokens_per_s": round(batch / (step_ms / 1000), 1),
            "cuda_graphs": graphs, "engine_warmup_seconds": warmup_s, "breakdown_ms": breakdown,
            "prompt_tokens": prompt_tokens,
            "context_tokens": int(first_context + (cfg.decode_steps - 1) / 2 + 0.5)} | (
                {"roofline": roofline} if roofline is not None else {})


def bench_timestamps_cost(model, variant, conditioning, text_ids, cfg: T3BenchConfig, decode: list[dict]) -> dict:
    """Per decode entry, the step on an engine keeping alignment rows with no row asking
    (``idle``) and with every row asking (``all_rows``), and their cost against the entry."""
    entries = []
    for plain in decode:
        idle, asked = (bench_decode(model, variant, conditioning, text_ids, cfg, plain["batch"], alignment=(True, asks))
                       for asks in (False, True))
        entries.append({"batch": plain["batch"], "rows": plain["rows"], "step_ms_off": plain["step_ms"],
                        "step_ms_idle": idle["step_ms"], "step_ms_all_rows": asked["step_ms"],
                        "cost_idle": round(idle["step_ms"] / plain["step_ms"] - 1, 4),
                        "cost_all_rows": round(asked["step_ms"] / plain["step_ms"] - 1, 4)})
    return {"method": "decode test per batch size (cfg.decode_steps steps after warm-up, fixed lengths) on a "
                      "new engine each: off = EngineConfig.alignment False (the decode entry), idle = alignment "
                      "kept but no row asks, all_rows = every request asks (want_alignment); cost = step / off - 1",
            "entries": entries}


def bench_yardstick(plain: PlainDecodeModel, decode: dict, cfg: T3BenchConfig) -> tuple[dict, str]:
    """The plain step at the decode entry's rows and context: ``{"yardstick_step_ms", "yardstick_ratio"}``
    to merge into the entry, and the mode it ran in."""
    shape = DecodeShape(rows=decode["rows"], context_tokens=decode["context_tokens"],
                        speech_position=decode["context_tokens"] - decode["prompt_tokens"])
    plain_ms, mode = time_decode_step(plain, shape, steps=cfg.decode_steps, warmup_steps=cfg.warmup_steps)
    return {"yardstick_step_ms": round(plain_ms, 3), "yardstick_ratio": round(plain_ms / decode["step_ms"], 3)}, mode


def _step_breakdown(engine: T3Engine, device: torch.device, steps: int) -> dict:
    """Where a decode step's time goes, phase by phase with a device sync after each (so the
    phases add up to more than a normal, partly overlapped step). The forward is run once alone
    and once inside ``execute``; rewriting the same K/V twice is harmless. ``sample`` is not
    timed alone: it is ``execute`` less the prepare and forward timed beside it, over all the
    steps, so on a noisy machine it can come out as 0 (never below)."""
    totals = dict(schedule=0.0, prepare=0.0, forward=0.0, execute=0.0, update=0.0)
    runner, scheduler = engine.runner, engine.scheduler
    for _ in range(steps):
        t0 = time.perf_counter()
        out = scheduler.schedule()
        t1 = time.perf_counter()
        if out.is_empty:
            scheduler.update_from_output(out, {})
            break
        inputs = runner.prepare(out)
        _sync(device)
        t2 = time.perf_counter()
        runner.forward_logits(inputs)
        _sync(device)
        t3 = time.perf_counter()
        sampled = runner.execute(out)
        _sync(device)
        t4 = time.perf_counter()
        scheduler.update_from_output(out, sampled)
        t5 = time.perf_counter()
        totals["schedule"] += t1 - t0
        totals["prepare"] += t2 - t1
        totals["forward"] += t3 - t2
        totals["execute"] += t4 - t3  # prepare + forward + sampling
        totals["update"] += t5 - t4
    execute = totals.pop("execute")
    totals["sample"] = max(0.0, execute - totals["prepare"] - totals["forward"])
    return {k: round(1000 * totals[k] / steps, 3) for k in ("schedule", "prepare", "forward", "sample", "update")}


def bench_kv_cache(model, variant, conditioning, text_ids, cfg: T3BenchConfig) -> dict:
    """The pool's dtype and bytes per block; for an FP8 pool also its logits against the
    model-dtype cache on the bench's own prompt (conditional row)."""
    from chorus.engine.kv_accuracy import measure_kv_accuracy
    from chorus.engine.paged_cache import kv_bytes_per_block, resolve_kv_cache_dtype

    bb = variant.t3.backbone
    dtype = resolve_kv_cache_dtype(cfg.kv_cache_dtype, model.dtype)
    section = {"dtype": cfg.kv_cache_dtype if cfg.kv_cache_dtype != "auto" else dtype_name(dtype),
               "bytes_per_block": kv_bytes_per_block(bb.num_layers, CacheConfig().block_size, bb.num_kv_heads,
                                                     bb.head_dim, dtype),
               "block_size": CacheConfig().block_size}
    if dtype != model.dtype:
        prompt = model.prefill_embeds(conditioning.embeds, torch.as_tensor(list(text_ids)), cfg=False)[0]
        accuracy = measure_kv_accuracy(model, prompt, kv_cache_dtype=cfg.kv_cache_dtype,
                                       decode_steps=cfg.kv_accuracy_steps)
        section.update({k: v for k, v in accuracy.as_dict().items() if k != "kv_cache_dtype"})
        section["versus"] = dtype_name(model.dtype)
    return section


def workload_text(cfg: T3BenchConfig) -> str:
    if cfg.text_file:
        return Path(cfg.text_file).read_text(encoding="utf-8")
    return resources.files("chorus.assets").joinpath("benchmark-text-1.txt").read_text(encoding="utf-8")


def workload_chunks(cfg: T3BenchConfig, max_chars: int | None = None) -> list[str]:
    """The workload text split at ``max_chars`` (default: ``cfg.max_chars``)."""
    return split_into_chunks(workload_text(cfg), max_chars=cfg.max_chars if max_chars is None else max_chars)


def _fixed_lengths(chunks: list[str], cfg: T3BenchConfig) -> list[int]:
    return [max(1, round(cfg.tokens_per_char * len(c))) for c in chunks]


def bench_workload(model, variant, conditioning, encoder, chunks: list[str], cfg: T3BenchConfig) -> dict:
    lengths = _fixed_lengths(chunks, cfg)
    requests = [T3Request(encoder.encode(c), conditioning, fixed_length_params(variant, cfg, n, i))
                for i, (c, n) in enumerate(zip(chunks, lengths))]
    # a first pass on an engine of its own, reported as the cold one: what is left to do once
    # per process after the engine's warm-up (which compiles the Triton kernel variants of the
    # mixed prefill/decode steps when the engine is built): the sampler graphs' captures, first
    # uses of library kernels; the second pass is the warm figure
    cold = cold_warmup = None
    for timed in (False, True):
        engine = bench_engine(model, variant, cfg, cfg.max_num_seqs)
        cold_warmup = cold_warmup if timed else _warmup_seconds(engine)
        _sync(model.device)
        start = time.perf_counter()
        tokens, timeline = _run_with_timeline(engine, requests)
        _sync(model.device)
        elapsed = time.perf_counter() - start
        steps, preemptions = engine.num_steps, engine.scheduler.num_preemptions
        _release(engine)
        cold = elapsed if cold is None else cold
    assert tokens == sum(lengths), "fixed lengths were not honoured"
    audio_s = tokens / 25.0
    return {"chunks": len(chunks), "speech_tokens": tokens, "audio_seconds": round(audio_s, 1),
            "t3_seconds": round(elapsed, 3), "speech_tokens_per_s": round(tokens / elapsed, 1),
            "realtime_factor": round(audio_s / elapsed, 1), "engine_steps": steps,
            "preemptions": preemptions, "cold_t3_seconds": round(cold, 3),
            "engine_warmup_seconds": cold_warmup, "timeline": timeline}


def _run_with_timeline(engine: T3Engine, requests: list[T3Request]) -> tuple[int, dict]:
    """``engine.generate`` with each step's wall time noted (the timed pass of the workload).

    Returns the speech tokens produced and where the time went, by kind of step (in this
    order): ``admission`` (requests were waiting or still prefilling before the step),
    ``changed`` (the running rows differ from the step before's: chunks ended), ``steady``.
    ``sync_steps``: steps after which no step was queued ahead. ``steps_ms``/``steps_rows``:
    per step, its wall time and the rows running before it."""
    scheduler = engine.scheduler
    for request in requests:
        engine.add_request(request)
    tokens, times, rows, kinds, sync_steps, previous_rows = 0, [], [], [], 0, -1
    while engine.has_unfinished_requests():
        running, ahead = scheduler.num_running_rows, engine.num_steps_ahead
        admitting = bool(scheduler.waiting) or scheduler.num_prefilling > 0
        start = time.perf_counter()
        events = engine.step()
        times.append(time.perf_counter() - start)
        tokens += sum(e.new_token is not None for e in events)
        rows.append(running)
        kinds.append("admission" if admitting else "changed" if running != previous_rows else "steady")
        sync_steps += engine.num_steps_ahead == ahead
        previous_rows = running
    summary = {}
    for kind in ("admission", "changed", "steady"):
        ms = [1000 * t for t, k in zip(times, kinds) if k == kind]
        summary[kind] = {"steps": len(ms), "ms": round(sum(ms), 1), "mean_ms": round(sum(ms) / max(1, len(ms)), 3)}
    summary["sync_steps"] = sync_steps
    summary["steps_ms"] = [round(1000 * t, 2) for t in times]
    summary["steps_rows"] = rows
    return tokens, summary


def bench_chunk_sweep(model, variant, conditioning, encoder, cfg: T3BenchConfig) -> list[dict]:
    """The workload once per bound in ``cfg.chunk_chars``. When all chunks run at once the time
    is about the longest chunk's steps times the step time at that batch: per bound, the chunk
    count, the longest chunk in characters and in steps (its fixed output length) and T3's time.
    ``rows`` above ``max_num_seqs`` means the chunks ran in more than one wave."""
    rows_per_request = 2 if variant.t3.supports_cfg and cfg.cfg_weight > 0 else 1
    sweep = []
    for bound in cfg.chunk_chars:
        chunks = workload_chunks(cfg, bound)
        lengths = _fixed_lengths(chunks, cfg)
        result = bench_workload(model, variant, conditioning, encoder, chunks, cfg)
        sweep.append({
            "max_chars": bound, "chunks": len(chunks), "longest_chunk_chars": max(len(c) for c in chunks),
            "longest_chunk_steps": max(lengths), "mean_chunk_chars": round(sum(map(len, chunks)) / len(chunks), 1),
            "rows": len(chunks) * rows_per_request, "max_num_seqs": cfg.max_num_seqs,
            "t3_seconds": result["t3_seconds"], "engine_steps": result["engine_steps"],
            "step_ms": round(1000 * result["t3_seconds"] / result["engine_steps"], 3),
            "speech_tokens": result["speech_tokens"], "realtime_factor": result["realtime_factor"],
            "preemptions": result["preemptions"],
        })
    return sweep


def load_bench_model(cfg: T3BenchConfig) -> tuple[Variant, T3Model, TextEncoder, Voice, bool]:
    """The variant, its T3 model, text encoder and built-in voice, from ``cfg.checkpoint`` or a
    random-weight checkpoint written for the run; and whether the weights are random."""
    variant, models, encoder, voice, random_weights = load_bench_models(cfg)
    return variant, next(iter(models.values())), encoder, voice, random_weights


def load_bench_models(cfg: T3BenchConfig, fp8_references: bool = False
                      ) -> tuple[Variant, dict[torch.dtype, T3Model], TextEncoder, Voice, bool]:
    """As :func:`load_bench_model`, with the T3 models by dtype: the bench's first; with
    ``fp8_references`` also the same weights in fp32 and in FP8's low dtype (``fp8_low_dtype``)."""
    variant = cfg.variant if isinstance(cfg.variant, Variant) else get_variant(cfg.variant)
    device = parse_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    dtypes = dict.fromkeys((dtype, torch.float32, fp8_low_dtype(dtype)) if fp8_references else (dtype,))
    with tempfile.TemporaryDirectory() as tmp:
        location = cfg.checkpoint or write_random_checkpoint(variant, tmp, components=("t3", "tokenizer", "conds"))
        ckpt = Checkpoint.open(variant, location) if cfg.checkpoint else Checkpoint(variant, Path(location))
        models = {dtype: load_t3(ckpt, dtype=dtype, device=device) for dtype in dtypes}
        encoder = load_text_encoder(variant, ckpt.directory)
        voice = Voice.from_conditionals(ckpt.builtin_voice_state())
        return variant, models, encoder, voice, ckpt.has_random_weights


def fp8_low_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype FP8 linears are measured against: the model's, or bf16 where the model runs fp32."""
    return torch.bfloat16 if dtype == torch.float32 else dtype


def bench_fp8_error(models: dict[torch.dtype, T3Model], variant, voice: Voice, text_ids, cfg: T3BenchConfig) -> dict:
    """The ``fp8_error`` section: fp32, bf16 and bf16 with FP8 linears on the bench's request."""
    from chorus.bench.fp8_error import measure_fp8_error

    text = torch.as_tensor(list(text_ids))

    def prompt_of(model: T3Model) -> torch.Tensor:
        cond = ConditioningCache(model, variant).get(voice, variant.sampling.exaggeration)
        return model.prefill_embeds(cond.embeds, text, cfg=False)[0]

    low = fp8_low_dtype(next(iter(models)))  # the bench's dtype comes first
    error = measure_fp8_error(models[torch.float32], models[low], prompt_of, decode_steps=cfg.fp8_error_steps)
    return error.as_dict() | {"method": "one request's conditional row (the first workload chunk, the built-in "
                                        "voice) teacher-forced on fp32's greedy tokens; logits of the prompt's "
                                        "last position and of each decode step (chorus.bench.fp8_error)"}


def run(cfg: T3BenchConfig) -> dict:
    variant, models, encoder, voice, random_weights = load_bench_models(cfg, fp8_references=cfg.fp8_linears)
    model = next(iter(models.values()))
    if cfg.timestamps:
        from chorus.models.t3.alignment import alignment_heads

        alignment_heads(variant.t3.backbone)  # before any run: raises where no alignment heads are known
    device, dtype = model.device, model.dtype
    chunks = workload_chunks(cfg)
    report: dict = {
        "variant": variant.name, "dtype": dtype_name(dtype), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "random_weights": random_weights, "cfg_weight": cfg.cfg_weight if variant.t3.supports_cfg else 0.0,
        "tokens_per_char": cfg.tokens_per_char, "torch": torch.__version__,
        "async_scheduling": cfg.async_scheduling, "shared_prefix_attention": cfg.shared_prefix_attention,
        "fp8_linears": cfg.fp8_linears,
    }
    text_ids = encoder.encode(chunks[0])
    if cfg.fp8_linears:
        report["fp8_error"] = bench_fp8_error(models, variant, voice, text_ids, cfg)
    del models  # the other dtypes' copies, before the engines take the memory
    _free_device_memory()
    conditioning = ConditioningCache(model, variant).get(voice, variant.sampling.exaggeration)
    report["kv_cache"] = bench_kv_cache(model, variant, conditioning, text_ids, cfg)
    roof = None
    if cfg.roofline:
        from chorus.bench.roofline import device_roof, roof_section

        roof = device_roof(device, cfg.peak_tflops, cfg.peak_gbps)
        report["roof"] = roof_section(roof, report["device_name"])
    report["decode"] = [bench_decode(model, variant, conditioning, text_ids, cfg, b, roof) for b in cfg.batch_sizes]
    if cfg.yardstick:
        plain = PlainDecodeModel.build(variant.t3, dtype=dtype, device=device)
        modes = set()
        for decode in report["decode"]:
            figures, mode = bench_yardstick(plain, decode, cfg)
            decode.update(figures)
            modes.add(mode)
        report["yardstick"] = describe(plain, "/".join(sorted(modes)))
        del plain
        _free_device_memory()
    if cfg.timestamps:
        report["timestamps_cost"] = bench_timestamps_cost(model, variant, conditioning, text_ids, cfg, report["decode"])
    if cfg.workload:
        report["workload"] = bench_workload(model, variant, conditioning, encoder, chunks, cfg)
    if cfg.chunk_chars:
        report["chunk_sweep"] = bench_chunk_sweep(model, variant, conditioning, encoder, cfg)
    if cfg.reference:
        report.update(bench_reference(variant, voice, encoder, chunks, cfg, report.get("workload"), device))
    return report


def bench_reference(variant, voice, encoder, chunks: list[str], cfg: T3BenchConfig, workload: dict | None,
                    device: torch.device, build=None) -> dict:
    """``reference`` (and, with the workload, ``speedup_vs_reference`` and ``speedup_method``):
    the reference T3 loop timed warm on evenly spaced chunks (chorus.bench.reference_timing)."""
    from chorus.bench.reference_t3 import run_reference_t3

    try:
        ref = run_reference_t3(variant, voice, chunks, [encoder.encode(c) for c in chunks], _fixed_lengths(chunks, cfg),
                               cfg_weight=cfg.cfg_weight, device=device,
                               min_chunks=cfg.reference_chunks, min_audio_s=cfg.reference_min_audio_s, build=build)
    except Exception as exc:  # noqa: BLE001 - the engine figures stay valid without the ratio
        return {"reference": {"error": f"{type(exc).__name__}: {exc}"}}
    out: dict = {"reference": ref}
    if workload is not None:
        out["speedup_vs_reference"] = round(ref["extrapolated_workload_t3_seconds"] / workload["t3_seconds"], 1)
        out["speedup_method"] = ("reference extrapolated_workload_t3_seconds (warm, timed on "
                                 f"{ref['method']['chunks_timed']} evenly spaced chunks, see reference.method) / "
                                 "workload.t3_seconds (the whole workload at once on a warm engine, second pass)")
    return out


def format_tables(report: dict) -> str:
    """The report's decode figures next to the yardstick, and the chunk sweep, as text."""
    kv = report.get("kv_cache", {})
    lines = [f"KV cache {kv['dtype']}" + (f": logits cosine vs {kv['versus']} min {kv['logits_cosine_min']:.5f}, "
                                           f"top-1 agreement {kv['top1_agreement']:.2f}" if "versus" in kv else "")]
    if "fp8_error" in report:
        e = report["fp8_error"]
        low = e["low_dtype"]
        lines.append(f"FP8 linears over {e['steps']} steps: logits cosine mean/min fp8 vs {low} "
                     f"{e[f'cosine_fp8_vs_{low}']['mean']:.5f}/{e[f'cosine_fp8_vs_{low}']['min']:.5f}, {low} vs fp32 "
                     f"{e[f'cosine_{low}_vs_fp32']['mean']:.5f}/{e[f'cosine_{low}_vs_fp32']['min']:.5f}; top-1 "
                     f"agreement fp8 vs {low} {e[f'top1_agreement_fp8_vs_{low}']:.3f}, {low} vs fp32 "
                     f"{e[f'top1_agreement_{low}_vs_fp32']:.3f}; within {low}'s error: {e[f'within_{low}_error']}")
    lines += [f"{'batch':>6} {'rows':>5} {'context':>7} {'step ms':>8} {'yard ms':>8} {'yard/step':>9} {'tokens/s':>9}"]
    for d in report["decode"]:
        yard = (f"{d['yardstick_step_ms']:>8.3f} {d['yardstick_ratio']:>9.3f}" if "yardstick_step_ms" in d
                else f"{'-':>8} {'-':>9}")
        lines.append(f"{d['batch']:>6} {d['rows']:>5} {d['context_tokens']:>7} {d['step_ms']:>8.3f} {yard} "
                     f"{d['speech_tokens_per_s']:>9.1f}")
    for d in report["decode"]:
        if "roofline" in d:
            from chorus.bench.roofline import format_classes

            lines.append(f"roofline, batch {d['batch']} ({d['roofline']['rows']} rows, context "
                         f"{d['roofline']['context_tokens']}):")
            lines += format_classes(d["roofline"])
    if report.get("timestamps_cost"):
        lines.append(f"{'batch':>6} {'rows':>5} {'off ms':>8} {'idle ms':>8} {'all ms':>8} {'cost idle':>9} {'cost all':>9}")
        for t in report["timestamps_cost"]["entries"]:
            lines.append(f"{t['batch']:>6} {t['rows']:>5} {t['step_ms_off']:>8.3f} {t['step_ms_idle']:>8.3f} "
                         f"{t['step_ms_all_rows']:>8.3f} {t['cost_idle']:>9.3f} {t['cost_all_rows']:>9.3f}")
    if report.get("chunk_sweep"):
        lines.append("")
        lines.append(f"{'max_chars':>9} {'chunks':>6} {'rows':>5} {'longest':>7} {'steps':>6} {'T3 s':>8} "
                     f"{'step ms':>8}")
        for c in report["chunk_sweep"]:
            lines.append(f"{c['max_chars']:>9} {c['chunks']:>6} {c['rows']:>5} {c['longest_chunk_chars']:>7} "
                         f"{c['longest_chunk_steps']:>6} {c['t3_seconds']:>8.3f} {c['step_ms']:>8.3f}")
    return "\n".join(lines)


def main_json(cfg: T3BenchConfig, out: str | None) -> dict:
    """Run, print the tables to stderr and the JSON report to stdout (and to ``out``)."""
    report = run(cfg)
    if cfg.roofline and out:
        from chorus.bench.roofline import write_plots

        write_plots(out, report)
    write_report(report, out, format_tables(report))
    return report
