"""Which modules form each kernel class, and the profiled passes of ``chorus bench vocoder`` and
``chorus bench t3 --roofline`` (:mod:`chorus.bench.roofline` for the method).

- **Vocoder pass** (stages ``encoder``, ``estimator``: the whole solve, ``hift``): the encoder's
  linears and feed-forwards (``encoder.linear``), its relative-position attention
  (``encoder.attention``, less its linears), pre-lookahead and upsampling blocks
  (``encoder.conv``), LayerNorms (``encoder.norm``); the estimator's linears, feed-forwards and
  time embedding (``estimator.linear``), attention (``estimator.attention``), convs
  (``estimator.conv``), causal blocks' norms and the transformer blocks' residual add + norm
  (``estimator.norm``, less their convs, attention and feed-forwards); HiFT's pitch path and
  source STFT (``hift.source``: ``predict_f0``, ``harmonic_source``, ``_source_spectrum``), its
  ``conv_pre``/``source_downs``/``conv_post`` (``hift.conv``), transposed convs
  (``hift.upsample``), every ResBlock and conv inside one (``hift.resblock_conv``), Snake
  (``hift.snake``) and ``_inverse_stft`` (``hift.istft``). Where a ResBlock runs its Snakes fused
  with the convs (one kernel each), their time is ``hift.resblock_conv``'s; ``hift.snake`` keeps
  its roof seconds and gets no time.
- **T3 step**: one engine forward (``forward_logits``, eager: the step's CUDA graph set aside)
  of the rows the decode entry runs; the KV cache's ``attend``/``attend_rotary``
  (``t3.attention``), every GEMM op outside it (``t3.linear``: the layers' projections and MLPs,
  the speech head).
"""
from __future__ import annotations

import torch
from torch import nn

from chorus.bench.kernel_work import Work, t3_step_work
from chorus.bench.roofline import ClassRanges, Roof, profile_classes, roofline_report, stage
from chorus.bench.vocoder_pass import PassInputs, run_encoder, run_hift, run_solver
from chorus.models.s3gen import encoder as enc
from chorus.models.s3gen import estimator as est
from chorus.models.s3gen.hift import ResBlock, Snake
from chorus.models.s3gen.s3gen import S3Gen

VOCODER_STAGES = ("encoder", "estimator", "hift")
GEMM_OPS = {op: "t3.linear" for op in ("aten::mm", "aten::addmm", "aten::_addmm_activation", "aten::linear",
                                        "aten::matmul", "aten::bmm")}


def _encoder_class(module: nn.Module) -> str | None:
    if isinstance(module, (nn.Linear, enc.FeedForward)):
        return "encoder.linear"
    if isinstance(module, enc.RelPositionAttention):
        return "encoder.attention"
    if isinstance(module, (enc.PreLookahead, enc.CausalUpsample)):
        return "encoder.conv"
    if isinstance(module, nn.LayerNorm):
        return "encoder.norm"
    return None


def _estimator_class(module: nn.Module) -> str | None:
    if isinstance(module, (nn.Linear, est.FeedForward, est.TimestepEmbedding)):
        return "estimator.linear"
    if isinstance(module, est.SelfAttention):
        return "estimator.attention"
    if isinstance(module, nn.Conv1d):
        return "estimator.conv"
    if isinstance(module, (est.CausalBlock, nn.LayerNorm)):
        return "estimator.norm"
    return None


def _hift_class(path: str, module: nn.Module) -> str | None:
    if isinstance(module, Snake):
        return "hift.snake"
    if isinstance(module, ResBlock) or ("resblocks" in path and isinstance(module, nn.Conv1d)):
        return "hift.resblock_conv"  # a ResBlock's own range: its residual adds, or fused Snake + conv kernels
    if path.startswith("ups."):
        return "hift.upsample"
    if path == "conv_pre" or path == "conv_post" or path.startswith("source_downs."):
        return "hift.conv" if isinstance(module, nn.Conv1d) else None
    return None


def s3gen_ranges(ranges: ClassRanges, s3gen: S3Gen) -> None:
    """Register every class range of a vocoder pass (see the module's docstring)."""
    flow, hift = s3gen.flow, s3gen.mel2wav
    for module in flow.encoder.modules():
        if (name := _encoder_class(module)) is not None:
            ranges.module(module, name)
    ranges.module(flow.encoder_proj, "encoder.linear")
    for module in flow.decoder.estimator.modules():
        if (name := _estimator_class(module)) is not None:
            ranges.module(module, name)
        if isinstance(module, est.TransformerBlock):
            ranges.method(module, "run", "estimator.norm")  # the stack calls run, not forward
    for path, module in hift.named_modules():
        if (name := _hift_class(path, module)) is not None:
            ranges.module(module, name)
    for method in ("predict_f0", "harmonic_source", "_source_spectrum"):
        ranges.method(hift, method, "hift.source")
    ranges.method(hift, "_inverse_stft", "hift.istft")


@torch.inference_mode()
def profile_vocoder_pass(s3gen: S3Gen, inp: PassInputs, work: dict[str, Work], roof: Roof | None,
                         pass_seconds: float) -> dict:
    """The split's modules at the pass's shapes, profiled once (they ran warm in the split
    before), against ``work`` (every class of the pass) and ``roof``."""
    mask = torch.ones(inp.tokens.shape[0], inp.frames, dtype=torch.bool, device=s3gen.device)

    def call() -> None:
        with stage("encoder"):
            mu = run_encoder(s3gen, inp)
        with stage("estimator"):
            mel = run_solver(s3gen, inp, mu, mask)
        with stage("hift"):
            run_hift(s3gen, inp, mel)

    with ClassRanges() as ranges:
        s3gen_ranges(ranges, s3gen)
        times = profile_classes(call, ranges, VOCODER_STAGES, s3gen.device)
    return roofline_report(work, times, roof, s3gen.dtype, pass_seconds)


def profile_t3_step(engine, request_ids: list[str], rows: int, roof: Roof | None, step_seconds: float) -> dict:
    """One scheduled decode step of ``engine`` (every request decoding): its forward run eagerly
    once untimed, once profiled, then the step executed and committed as usual."""
    scheduler, runner = engine.scheduler, engine.runner
    model = runner.model
    requests = [scheduler.get_request(rid) for rid in request_ids]
    assert None not in requests, "every request must still be decoding when its step is profiled"
    context = round(sum(r.num_tokens for r in requests) / len(requests))
    prompt_tokens = requests[0].prompt.num_tokens
    out = scheduler.schedule()
    inputs = runner.prepare(out)
    graphs, runner.graphs = runner.graphs, None

    def call() -> None:
        with stage("t3"):
            runner.forward_logits(inputs)

    try:
        with torch.inference_mode(), ClassRanges() as ranges:
            for method in ("attend", "attend_rotary"):
                ranges.method(runner.cache, method, "t3.attention")
            call()  # kernel variants of an eager step at this shape chosen outside the profile
            times = profile_classes(call, ranges, ("t3",), model.device, ops=GEMM_OPS)
    finally:
        runner.graphs = graphs
    scheduler.update_from_output(out, runner.execute(out))
    kv = getattr(runner.cache, "kv", None)
    kv_elem = kv.element_size() if kv is not None else None
    work = t3_step_work(model.config, rows, context, prompt_tokens, rows // len(requests),
                        model.dtype.itemsize, kv_elem)
    report = roofline_report(work, times, roof, model.dtype, step_seconds)
    return {"rows": rows, "context_tokens": context, "prompt_tokens": prompt_tokens} | report
