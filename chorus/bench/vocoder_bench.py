"""``chorus bench vocoder``: the vocoder stage's pass against a yardstick of the same modules.

For each pass shape (B non-streaming jobs of N new tokens each, one voice: the variant's built-in
prompt, different seeds; the variant's flow steps and CFG unless overridden):

- **stage pass**: wall time of one ``VocoderStage.step()`` over the B jobs (the device
  synchronised before and after), the median of ``repeats`` passes after ``warmup_passes``
  untimed ones (so the stage's pass graphs are captured and kernels chosen), with the audio
  seconds it returned and the real-time factor;
- **split**: the S3Gen modules called directly at the pass's shapes, eagerly, timed with CUDA
  events on the stream (one synchronisation at the end; host timers on the CPU): flow encoder
  (token embedding, conformer, ``encoder_proj``) over prompt + N tokens, the flow-matching solve
  (``decoder.solve``: every estimator call), HiFT (``predict_f0``, ``harmonic_source``,
  ``decode``) over the new frames;
- **FLOPs** of each module counted from the shapes (:func:`vocoder_flops`) and the achieved
  TFLOP/s of the split, the stage pass and the yardstick;
- **yardstick**: the same modules at the same shapes in plain PyTorch in the model's dtype
  (unpadded, no masks beyond what the modules need, HiFT's STFT and inverse STFT without the
  per-item envelopes, its Snake activations, the estimator's norms and the encoder's attention as
  plain tensor ops whatever ``hift_ops``, ``flow_ops`` and ``encoder_attention_ops`` the stage
  runs), encoder + solver + HiFT captured as ONE CUDA graph and timed over replays;
  ``yardstick_fraction = yardstick_seconds / stage_pass_seconds`` (1.0: the stage adds nothing on
  top of its modules). A yardstick, not a bound: a faster engine (fused kernels, other
  algorithms) can beat it. On the CPU it runs eagerly;
- **roofline** (``roofline``): the split's modules profiled once, per kernel class against the
  card's peak and bandwidth (:mod:`chorus.bench.roofline`).

Weights are random (a random-weight checkpoint written for the run unless ``checkpoint`` is
given): the time of a pass does not depend on them.
"""
from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from chorus.bench.kernel_work import Classes, encoder_work, hift_work, solver_work
from chorus.bench.report import write_report
from chorus.bench.vocoder_pass import PassInputs, pass_inputs, run_encoder, run_hift, run_solver
from chorus.models.loading import Checkpoint, dtype_name, parse_device, resolve_dtype
from chorus.models.s3gen.flow import FlowConfig
from chorus.models.s3gen.fused_ops import rel_position_attention_fused
from chorus.models.s3gen.hift import HiFTConfig
from chorus.models.s3gen.s3gen import SAMPLE_RATE, S3Gen
from chorus.models.variants import Variant, get_variant
from chorus.vocoder import VocoderConfig, VocoderStage
from chorus.vocoder.pass_graphs import vocode
from chorus.voices import Voice


@dataclass
class VocoderBenchConfig:
    variant: str | Variant = "original"  # a name, or a Variant
    checkpoint: str | None = None  # None: a random-weight checkpoint in a temporary directory
    dtype: str = "auto"  # bf16 on CUDA, fp32 on the CPU
    device: str = "auto"
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    new_tokens: tuple[int, ...] = (20, 100, 250)
    repeats: int = 3  # timed stage passes per shape (median), split repeats and yardstick replays
    warmup_passes: int = 3  # untimed stage passes per shape first (pass graphs are captured on a
    # shape's VocoderConfig.capture_after-th (3rd) use)
    flow_steps: int | None = None  # None: the variant's (10, meanflow 2)
    yardstick: bool = True
    # the stage's VocoderConfig settings, its defaults unless set (the yardstick always runs the plain ops)
    cuda_graphs: bool = VocoderConfig.cuda_graphs
    compile_hift: bool = VocoderConfig.compile_hift
    hift_ops: str = VocoderConfig.hift_ops
    flow_ops: str = VocoderConfig.flow_ops
    encoder_attention_ops: str = VocoderConfig.encoder_attention_ops
    seed: int = 0
    # the roofline report (chorus.bench.roofline): each pass's kernel classes profiled against the card
    roofline: bool = False
    peak_tflops: float | None = None  # override the card table's peak (every precision)
    peak_gbps: float | None = None  # override its HBM bandwidth


# ------------------------------------------------------------------------------------- FLOPs
def pass_work(flow_config: FlowConfig, hift_config: HiFTConfig, batch: int, prompt_tokens: int, new_tokens: int,
              n_steps: int, guided: bool, prompt_mel_frames: int | None = None, elem: int = 2,
              fused_encoder_attention: bool = False) -> dict[str, Classes]:
    """The kernel classes (:mod:`chorus.bench.kernel_work`) of one vocoder pass over ``batch``
    items of ``prompt_tokens + new_tokens`` tokens, per module: ``flow_encoder``, ``solver`` and
    ``hift``; ``elem``: the model dtype's bytes per element.

    The solver runs ``n_steps`` estimator calls over ``batch`` rows (``2 batch`` when ``guided``:
    CFG's unconditional rows) of ``2 (prompt + new)`` frames; HiFT runs over the new frames
    (``2 (prompt + new) - prompt_mel_frames``, the prompt mel being ``2 prompt`` frames by default).
    ``fused_encoder_attention``: the encoder's attention runs as its fused kernel (``encoder_work``).
    """
    ratio = flow_config.token_mel_ratio
    frames = ratio * (prompt_tokens + new_tokens)
    mel_frames = ratio * prompt_tokens if prompt_mel_frames is None else prompt_mel_frames
    return {
        "flow_encoder": encoder_work(flow_config, batch, prompt_tokens + new_tokens, elem, fused_encoder_attention),
        "solver": solver_work(flow_config, (2 if guided else 1) * batch, frames, n_steps, elem),
        "hift": hift_work(hift_config, batch, frames - mel_frames, elem),
    }


def vocoder_flops(flow_config: FlowConfig, hift_config: HiFTConfig, batch: int, prompt_tokens: int,
                  new_tokens: int, n_steps: int, guided: bool, prompt_mel_frames: int | None = None,
                  fused_encoder_attention: bool = False) -> dict:
    """FLOPs (2 per multiply-accumulate) of one vocoder pass (:func:`pass_work`), per module and
    in total: matmuls and linears, attention products, convolutions. Elementwise work (norms,
    activations, masks, the Euler update, the CFG combine, Snake, the harmonic sines) and the
    FFTs are not counted here (the roofline's classes count them apart)."""
    work = pass_work(flow_config, hift_config, batch, prompt_tokens, new_tokens, n_steps, guided, prompt_mel_frames,
                     fused_encoder_attention=fused_encoder_attention)
    flops = {module: sum(w.flops for w in classes.values()) for module, classes in work.items()}
    flops["total"] = sum(flops.values())
    return flops


# ------------------------------------------------------------------------------------- timing
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class YardstickPass:
    """Encoder + solver + HiFT of one pass shape in plain PyTorch on static inputs; on CUDA the
    whole pass is one captured CUDA graph (after warm-up passes on the capture stream)."""

    def __init__(self, s3gen: S3Gen, inp: PassInputs, *, cuda_graph: bool = True):
        self.s3gen, self.inp = s3gen, inp
        device = s3gen.device
        self.mask = torch.ones(inp.tokens.shape[0], inp.frames, dtype=torch.bool, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.wav: torch.Tensor | None = None
        self.capture_error: str | None = None
        if cuda_graph and device.type == "cuda":
            try:
                self._capture()
            except Exception as exc:  # noqa: BLE001 - reported; the yardstick then runs eagerly
                self.graph = None
                self.capture_error = f"{type(exc).__name__}: {exc}"
                torch.cuda.synchronize(device)

    @property
    def mode(self) -> str:
        return "cuda_graph" if self.graph is not None else "eager"

    @torch.inference_mode()
    def _pass(self) -> None:
        s3gen, inp = self.s3gen, self.inp
        mel = run_solver(s3gen, inp, run_encoder(s3gen, inp), self.mask)
        new = mel[:, :, inp.prompt_mel_frames:]
        self.wav = vocode(s3gen.mel2wav, new, None, inp.source_noise)[0]  # no frame counts: nothing masked

    def _capture(self) -> None:
        device = self.s3gen.device
        stream = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # library workspaces, FFT plans and lazy initialisation outside the capture
                self._pass()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                self._pass()
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        self.graph = graph

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._pass()


def time_yardstick(s3gen: S3Gen, inp: PassInputs, *, replays: int, warmup: int = 2,
                   cuda_graph: bool = True) -> tuple[float, str, str | None]:
    """Seconds per yardstick pass (mean over ``replays`` after ``warmup``), its mode and, if the
    capture failed, why."""
    device = s3gen.device
    estimator = s3gen.flow.decoder.estimator
    stage_ops, s3gen.mel2wav.ops_backend = s3gen.mel2wav.ops_backend, "torch"  # plain PyTorch
    stage_flow_ops, estimator.ops_backend = estimator.ops_backend, "torch"
    stage_attention_ops, s3gen.flow.encoder.ops_backend = s3gen.flow.encoder.ops_backend, "torch"
    yardstick = YardstickPass(s3gen, inp, cuda_graph=cuda_graph)
    try:
        for _ in range(warmup):
            yardstick()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                yardstick()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000 / replays
        else:
            began = time.perf_counter()
            for _ in range(replays):
                yardstick()
            seconds = (time.perf_counter() - began) / replays
        return seconds, yardstick.mode, yardstick.capture_error
    finally:
        s3gen.mel2wav.ops_backend = stage_ops
        estimator.ops_backend = stage_flow_ops
        s3gen.flow.encoder.ops_backend = stage_attention_ops
        del yardstick
        if device.type == "cuda":
            torch.cuda.empty_cache()


@torch.inference_mode()
def time_split(s3gen: S3Gen, inp: PassInputs, *, repeats: int) -> dict[str, float]:
    """Median seconds of the flow encoder, the solver and HiFT called eagerly at the pass's
    shapes. On CUDA: events recorded on the current stream around each part, one
    synchronisation after all repeats; on the CPU: host timers."""
    device = s3gen.device
    mask = torch.ones(inp.tokens.shape[0], inp.frames, dtype=torch.bool, device=device)
    parts = ("flow_encoder", "solver", "hift")
    run_hift(s3gen, inp, run_solver(s3gen, inp, run_encoder(s3gen, inp), mask))  # first calls untimed
    cuda = device.type == "cuda"
    marks: list[list] = []
    for _ in range(repeats):
        stamps = []

        def mark():
            if cuda:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                stamps.append(event)
            else:
                stamps.append(time.perf_counter())

        mark()
        mu = run_encoder(s3gen, inp)
        mark()
        mel = run_solver(s3gen, inp, mu, mask)
        mark()
        run_hift(s3gen, inp, mel)
        mark()
        marks.append(stamps)
    if cuda:
        marks[-1][-1].synchronize()
        seconds = [[a.elapsed_time(b) / 1000 for a, b in zip(s, s[1:])] for s in marks]
    else:
        seconds = [[b - a for a, b in zip(s, s[1:])] for s in marks]
    return {part: statistics.median(row[i] for row in seconds) for i, part in enumerate(parts)}


# --------------------------------------------------------------------------------- the stage
def _stats_numbers(stats) -> dict[str, float]:
    values = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else vars(stats)
    return {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _random_tokens(count: int, seed: int, num_codes: int) -> list[int]:
    return torch.randint(0, num_codes, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def time_stage(stage: VocoderStage, voice: Voice, batch: int, new_tokens: int, cfg: VocoderBenchConfig,
               job_counter: list[int]) -> dict:
    """Warm-up then timed passes of ``batch`` non-streaming jobs of ``new_tokens`` raw tokens."""
    device, num_codes = stage.s3gen.device, stage.s3gen.rules.num_codes
    seconds, audio = [], []
    before = _stats_numbers(stage.stats)
    for i in range(cfg.warmup_passes + cfg.repeats):
        ids = []
        for b in range(batch):
            job = job_counter[0]
            job_counter[0] += 1
            job_id = f"bench-{job}"
            stage.add(job_id, voice, seed=cfg.seed + job, streaming=False, n_steps=cfg.flow_steps)
            stage.push(job_id, _random_tokens(new_tokens, cfg.seed + b, num_codes), final=True)
            ids.append(job_id)
        _sync(device)
        began = time.perf_counter()
        out = stage.step()
        _sync(device)
        elapsed = time.perf_counter() - began
        if sorted(o.job_id for o in out) != sorted(ids) or not all(o.final and o.error is None for o in out):
            errors = [o.error for o in out if o.error]
            raise RuntimeError(f"a bench pass did not vocode its {batch} jobs in one step"
                               + (f": {errors[0]}" if errors else ""))
        if i >= cfg.warmup_passes:
            seconds.append(elapsed)
            audio.append(sum(o.samples.shape[0] for o in out) / SAMPLE_RATE)
    after = _stats_numbers(stage.stats)
    return {"seconds": statistics.median(seconds), "audio_seconds": audio[0], "all_seconds": seconds,
            "stats": {k: round(after[k] - before.get(k, 0), 6) for k in after}}


# ------------------------------------------------------------------------------------ report
def load_bench_s3gen(cfg, voice_models: bool = False) -> tuple[S3Gen, Voice, bool]:
    """The variant's S3Gen (with its voice models if asked) and its built-in voice, from
    ``cfg.checkpoint`` or a random-weight checkpoint written for the run (``cfg``: a bench
    config with ``variant``, ``checkpoint``, ``dtype`` and ``device``)."""
    from chorus.models.random_checkpoint import write_random_checkpoint

    variant = cfg.variant if isinstance(cfg.variant, Variant) else get_variant(cfg.variant)
    device = parse_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    with tempfile.TemporaryDirectory() as tmp:
        location = cfg.checkpoint or write_random_checkpoint(variant, tmp, components=("s3gen", "conds"))
        ckpt = Checkpoint.open(variant, location) if cfg.checkpoint else Checkpoint(variant, Path(location))
        s3gen = S3Gen.from_checkpoint(ckpt, dtype=dtype, device=device, voice_models=voice_models)
        voice = Voice.from_conditionals(ckpt.builtin_voice_state())
        return s3gen, voice, ckpt.has_random_weights


def _tflops(flops: int, seconds: float) -> float:
    return round(flops / seconds / 1e12, 4) if seconds > 0 else 0.0


def bench_shape(s3gen: S3Gen, voice: Voice, stage: VocoderStage, cfg: VocoderBenchConfig, batch: int,
                new_tokens: int, job_counter: list[int], roof=None) -> dict:
    settings = s3gen.variant.s3gen
    n_steps = settings.flow_steps if cfg.flow_steps is None else cfg.flow_steps
    cfg_rate = settings.cfg_rate
    guided = not s3gen.flow.config.meanflow and cfg_rate != 0.0
    items = [s3gen.postprocess_tokens(_random_tokens(new_tokens, cfg.seed + b, s3gen.rules.num_codes))
             for b in range(batch)]
    pass_tokens = len(items[0])
    prompt_tokens, prompt_mel_frames = voice.s3gen_prompt_tokens.shape[1], voice.s3gen_prompt_mel.shape[1]
    fused_attention = rel_position_attention_fused(s3gen.flow.encoder.ops_backend, s3gen.device)
    flops = vocoder_flops(s3gen.flow.config, s3gen.mel2wav.config, batch, prompt_tokens, pass_tokens, n_steps,
                          guided, prompt_mel_frames, fused_attention)
    stage_run = time_stage(stage, voice, batch, new_tokens, cfg, job_counter)
    inp = pass_inputs(s3gen, voice, items, n_steps, cfg_rate, cfg.seed)
    split = time_split(s3gen, inp, repeats=cfg.repeats)
    pass_s = stage_run["seconds"]
    entry = {
        "batch": batch, "new_tokens": new_tokens, "pass_tokens": pass_tokens, "prompt_tokens": prompt_tokens,
        "frames": inp.frames, "new_frames": inp.new_frames, "n_steps": n_steps, "guided": guided,
        "stage_pass_seconds": round(pass_s, 6),
        "stage_pass_seconds_all": [round(s, 6) for s in stage_run["all_seconds"]],
        "audio_seconds": round(stage_run["audio_seconds"], 4),
        "realtime_factor": round(stage_run["audio_seconds"] / pass_s, 2),
        "stage_stats": stage_run["stats"],
        "split_seconds": {k: round(v, 6) for k, v in split.items()},
        "split_total_seconds": round(sum(split.values()), 6),
        "flops": flops,
        "split_tflops": {k: _tflops(flops[k], split[k]) for k in split},
        "stage_tflops": _tflops(flops["total"], pass_s),
    }
    if cfg.roofline:
        from chorus.bench.roofline_passes import profile_vocoder_pass

        work = pass_work(s3gen.flow.config, s3gen.mel2wav.config, batch, prompt_tokens, pass_tokens, n_steps,
                         guided, prompt_mel_frames, elem=s3gen.dtype.itemsize, fused_encoder_attention=fused_attention)
        classes = {name: w for module in work.values() for name, w in module.items()}
        entry["roofline"] = profile_vocoder_pass(s3gen, inp, classes, roof, pass_s)
    if cfg.yardstick:
        seconds, mode, error = time_yardstick(s3gen, inp, replays=cfg.repeats)
        entry.update({"yardstick_seconds": round(seconds, 6), "yardstick_mode": mode,
                      "yardstick_tflops": _tflops(flops["total"], seconds),
                      "yardstick_fraction": round(seconds / pass_s, 4)})
        if error:
            entry["yardstick_capture_error"] = error
    del inp
    return entry


def run(cfg: VocoderBenchConfig, s3gen: S3Gen | None = None, voice: Voice | None = None) -> dict:
    """The report; ``s3gen``/``voice`` replace the loaded model and built-in voice (tests pass tiny ones)."""
    if cfg.repeats < 1 or cfg.warmup_passes < 0:
        raise ValueError("repeats must be >= 1 and warmup_passes >= 0")
    random_weights = None
    if s3gen is None or voice is None:
        s3gen, voice, random_weights = load_bench_s3gen(cfg)
    device, dtype = s3gen.device, s3gen.dtype
    stage = VocoderStage(s3gen, VocoderConfig(
        max_batch_items=max(cfg.batch_sizes), cuda_graphs=cfg.cuda_graphs, compile_hift=cfg.compile_hift,
        hift_ops=cfg.hift_ops, flow_ops=cfg.flow_ops, encoder_attention_ops=cfg.encoder_attention_ops,
        max_batch_tokens=max(VocoderConfig().max_batch_tokens,
                             max(cfg.batch_sizes) * (voice.s3gen_prompt_tokens.shape[1] + max(cfg.new_tokens) + 16))))
    settings = s3gen.variant.s3gen
    report: dict = {
        "variant": s3gen.variant.name, "dtype": dtype_name(dtype), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "random_weights": random_weights, "torch": torch.__version__,
        "n_steps": settings.flow_steps if cfg.flow_steps is None else cfg.flow_steps,
        "cfg_rate": settings.cfg_rate, "meanflow": s3gen.flow.config.meanflow,
        "prompt_tokens": voice.s3gen_prompt_tokens.shape[1], "prompt_mel_frames": voice.s3gen_prompt_mel.shape[1],
        "repeats": cfg.repeats, "warmup_passes": cfg.warmup_passes, "stage_cuda_graphs": cfg.cuda_graphs,
        "stage_compile_hift": stage.graphs.hift_runner.compiled,
        "stage_hift_ops": cfg.hift_ops,
        "stage_flow_ops": cfg.flow_ops,
        "stage_encoder_attention_ops": cfg.encoder_attention_ops,
        "hift_compile_seconds": round(stage.graphs.hift_runner.compile(), 1),  # as VocoderStage.warmup
    }
    roof = None
    if cfg.roofline:
        from chorus.bench.roofline import device_roof, roof_section

        roof = device_roof(device, cfg.peak_tflops, cfg.peak_gbps)
        report["roof"] = roof_section(roof, report["device_name"])
    job_counter = [0]
    report["passes"] = [bench_shape(s3gen, voice, stage, cfg, b, n, job_counter, roof)
                        for b in cfg.batch_sizes for n in cfg.new_tokens]
    if cfg.yardstick:
        report["yardstick"] = {
            "what": "the pass's modules at its shapes in plain PyTorch (model dtype; HiFT's pitch path float32 "
                    "as the model keeps it): token embedding, conformer and encoder_proj; the flow-matching "
                    "solve (every estimator call, CFG rows batched); HiFT predict_f0, harmonic source and "
                    "decode with an unmasked STFT / inverse STFT; no padding, no per-item lengths",
            "mode": "/".join(sorted({p["yardstick_mode"] for p in report["passes"]})),
            "fraction": "yardstick_seconds / stage_pass_seconds; a yardstick, not a bound (the engine can beat it)",
        }
    report["flops_counted"] = ("matmuls and linears, attention (Q K^T, P V, the encoder's relative-position "
                               "term), convolutions (transposed: over their input); elementwise ops and FFTs "
                               "not counted; 2 FLOPs per multiply-accumulate; real (unpadded) shapes")
    return report


def format_table(report: dict) -> str:
    lines = [f"{report['variant']} {report['dtype']} on {report['device_name']}: {report['n_steps']} flow steps"
             f"{' + CFG' if report['passes'] and report['passes'][0]['guided'] else ''}, prompt "
             f"{report['prompt_tokens']} tokens",
             f"{'B':>4} {'N':>5} {'pass ms':>9} {'xRT':>7} {'enc ms':>8} {'solve ms':>9} {'hift ms':>8} "
             f"{'GFLOP':>9} {'TFLOP/s':>8} {'yard ms':>8} {'yard/pass':>9}"]
    for p in report["passes"]:
        s = p["split_seconds"]
        yard = (f"{1000 * p['yardstick_seconds']:>8.2f} {p['yardstick_fraction']:>9.3f}"
                if "yardstick_seconds" in p else f"{'-':>8} {'-':>9}")
        lines.append(f"{p['batch']:>4} {p['new_tokens']:>5} {1000 * p['stage_pass_seconds']:>9.2f} "
                     f"{p['realtime_factor']:>7.1f} {1000 * s['flow_encoder']:>8.2f} {1000 * s['solver']:>9.2f} "
                     f"{1000 * s['hift']:>8.2f} {p['flops']['total'] / 1e9:>9.1f} {p['stage_tflops']:>8.3f} {yard}")
    for p in report["passes"]:
        if "roofline" in p:
            from chorus.bench.roofline import format_classes

            lines.append(f"roofline, B={p['batch']} N={p['new_tokens']}:")
            lines += format_classes(p["roofline"])
    return "\n".join(lines)


def main_json(cfg: VocoderBenchConfig, out: str | None) -> dict:
    """Run, print the table to stderr and the JSON report to stdout (and to ``out``, atomically)."""
    report = run(cfg)
    if cfg.roofline and out:
        from chorus.bench.roofline import write_plots

        write_plots(out, report)
    write_report(report, out, format_table(report))
    return report
