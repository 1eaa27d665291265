"""``chorus bench sampler``: the sampler's Triton kernel against the PyTorch path, on a CUDA GPU.

For each variant (original: vocabulary 8194, turbo: 6563) and row count, with the variant's
default parameters (every row sampled):

* ``draw_torch_us`` / ``draw_triton_us``: ``sample_next_tokens`` alone (noise, add, argmax),
  the PyTorch path and the kernel, each captured in a CUDA graph; the median replay time;
* ``step_torch_us`` / ``step_triton_us``: the engine's whole graphed sampling step
  (``SamplerGraphs.sample``: logits copy, CFG gather, processors, draw, penalty record, step
  counters), with the draw on either path.

Before timing, the kernel's tokens are checked against the PyTorch path's. ``sweep`` also times
the kernel at other vocabulary tiles and warp counts (docs/sampling.md).
"""
from __future__ import annotations

import functools

import torch

import chorus.engine.sampler_graphs as sampler_graphs
import chorus.sampling.triton_sampler as triton_sampler
from chorus.bench.cuda_timing import median_cuda_ms
from chorus.bench.report import write_report
from chorus.models.variants import get_variant
from chorus.sampling import (
    SamplingBatch, SamplingParams, initial_penalty_mask, process_logits, sample_next_tokens,
)


def graph_us(fn, reps: int = 200) -> float:
    """Median time of one replay of a CUDA graph that calls ``fn`` once."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(10):
        graph.replay()
    return median_cuda_ms(graph.replay, reps) * 1000.0


def step_us(variant, params, rows: int, backend: str, reps: int = 200) -> float:
    """Median time of SamplerGraphs.sample (one replay) with the draw on ``backend``."""
    original = sampler_graphs.sample_next_tokens
    sampler_graphs.sample_next_tokens = functools.partial(sample_next_tokens, backend=backend)
    try:
        graphs = sampler_graphs.SamplerGraphs(variant, "cuda", max_rows=rows)
        vocab = variant.t3.speech_vocab_size
        pair = 2 if variant.t3.supports_cfg else 1
        batch = SamplingBatch.build(params, variant)
        seen = [initial_penalty_mask(variant, 1, "cuda") for _ in range(rows)]
        cond = [pair * i for i in range(rows)]
        uncond = [pair * i + 1 for i in range(rows)] if pair == 2 else None
        graphs.load(batch, seen, [0] * rows, cond, uncond)
        logits = torch.randn(pair * rows, vocab, device="cuda") * 3
        for _ in range(5):
            graphs.sample(logits)
        torch.cuda.synchronize()
        return median_cuda_ms(lambda: graphs.sample(logits), reps) * 1000.0
    finally:
        sampler_graphs.sample_next_tokens = original


def measure(variant_name: str, rows: int, sweep: bool) -> dict:
    variant = get_variant(variant_name)
    vocab = variant.t3.speech_vocab_size
    params = [SamplingParams.for_variant(variant, seed=1000 + i) for i in range(rows)]
    batch = SamplingBatch.build(params, variant, "cuda")
    seen = initial_penalty_mask(variant, rows, "cuda")
    steps = torch.zeros(rows, dtype=torch.int64, device="cuda")
    cond = torch.randn(rows, vocab, device="cuda") * 3
    uncond = torch.randn(rows, vocab, device="cuda") * 3 if variant.t3.supports_cfg else None
    processed = process_logits(cond, batch, seen, steps, uncond_logits=uncond)
    expected = sample_next_tokens(processed, batch, steps, backend="torch")
    assert torch.equal(sample_next_tokens(processed, batch, steps, backend="triton"), expected)
    result = {
        "variant": variant_name, "rows": rows, "vocab": vocab,
        "draw_torch_us": graph_us(lambda: sample_next_tokens(processed, batch, steps, backend="torch")),
        "draw_triton_us": graph_us(lambda: sample_next_tokens(processed, batch, steps, backend="triton")),
        "step_torch_us": step_us(variant, params, rows, "torch"),
        "step_triton_us": step_us(variant, params, rows, "triton"),
    }
    if sweep:
        default = (triton_sampler._BLOCK, triton_sampler._NUM_WARPS)
        result["sweep_us"] = {}
        try:
            for block in (512, 1024, 2048, 4096):
                for warps in (4, 8, 16):
                    triton_sampler._BLOCK, triton_sampler._NUM_WARPS = block, warps
                    assert torch.equal(sample_next_tokens(processed, batch, steps, backend="triton"), expected)
                    result["sweep_us"][f"block{block}_warps{warps}"] = graph_us(
                        lambda: sample_next_tokens(processed, batch, steps, backend="triton"), reps=100)
        finally:
            triton_sampler._BLOCK, triton_sampler._NUM_WARPS = default
    return result


def run(variants: tuple[str, ...], rows: tuple[int, ...], sweep: bool) -> dict:
    """Every variant at every row count; a CUDA device is needed."""
    if not torch.cuda.is_available():
        raise ValueError("chorus bench sampler needs a CUDA device")
    return {"benchmark": "sampler", "device_name": torch.cuda.get_device_name(),
            "results": [measure(v, r, sweep) for v in variants for r in rows]}


def main_json(variants: tuple[str, ...], rows: tuple[int, ...], sweep: bool, out: str | None) -> dict:
    """Run, print the JSON report to stdout (and write it to ``out``, atomically)."""
    report = run(variants, rows, sweep)
    write_report(report, out)
    return report
