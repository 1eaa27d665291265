"""Times the reference package's whole ``generate()`` (``chatterbox-tts``), for benchmark ratios.

Benchmark-only, like :mod:`chorus.bench.reference_t3`: the reference loads the same
random-weight checkpoint directory (the official layout) with its own ``from_local`` and runs
as shipped (fp32, one chunk at a time: T3, then S3Gen, then its watermarker, a no-op stand-in
where ``resemble-perth`` is absent). A forward hook on its speech head fixes each chunk's length
as Chorus's benchmark does, and what its T3 generated is checked against that length. Timing
follows :mod:`chorus.bench.reference_timing` (a warm-up call, evenly spaced chunks, at least a
minute of audio).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from chorus.bench.reference_t3 import _force_lengths, _install_import_shims
from chorus.bench.reference_timing import (
    DEFAULT_REFERENCE_CHUNKS,
    MIN_TIMED_AUDIO_S,
    check_generated,
    method,
    per_chunk,
    select_reference_chunks,
    time_reference,
)
from chorus.models.variants import Variant


def _load_reference(variant: Variant, directory: Path, device: torch.device):
    if variant.name == "original":
        from chatterbox.tts import ChatterboxTTS

        return ChatterboxTTS.from_local(directory, str(device))
    if variant.name == "turbo":
        from chatterbox.tts_turbo import ChatterboxTurboTTS

        return ChatterboxTurboTTS.from_local(directory, str(device))
    raise ValueError(f"the reference pipeline benchmark covers original and turbo, not {variant.name}")


@torch.inference_mode()
def run_reference_pipeline(variant: Variant, directory: Path, chunks: list[str], lengths: list[int],
                           *, cfg_weight: float, device: torch.device, min_chunks: int = DEFAULT_REFERENCE_CHUNKS,
                           min_audio_s: float = MIN_TIMED_AUDIO_S, load=None, clock=time.perf_counter) -> dict:
    """Time the reference ``generate()`` on the workload ``chunks`` (forced ``lengths``): one
    untimed warm-up call, then the chunks :func:`select_reference_chunks` picks, each checked to
    have generated its forced length. ``load(variant, directory, device)`` replaces the
    reference loader (tests pass tiny ones)."""
    shims = _install_import_shims()
    tts = (load or _load_reference)(variant, Path(directory), device)
    state, handle = _force_lengths(tts.t3, variant.t3.stop_speech_token, variant.t3.num_speech_codes)
    generated: list[int] = []
    name = "inference" if variant.t3.backbone.kind == "llama" else "inference_turbo"
    t3_generate = getattr(tts.t3, name)

    def counting(*args, **kwargs):  # what T3 generated, without BOS/EOS
        out = t3_generate(*args, **kwargs)
        generated.append(int((out[0] < variant.t3.num_speech_codes).sum()))
        return out

    setattr(tts.t3, name, counting)
    kwargs = {"cfg_weight": cfg_weight} if variant.name == "original" else {}

    def generate(index: int) -> int:
        state["calls"], state["target"] = 0, lengths[index]
        generated.clear()
        wav = tts.generate(chunks[index], **kwargs)
        check_generated(sum(generated), lengths[index], index)
        return wav.shape[-1]

    indices = select_reference_chunks(lengths, min_chunks, min_audio_s)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    try:
        times = time_reference(generate, indices, sync=sync, clock=clock)
    finally:
        handle.remove()
        tts = generate = None  # the reference's models go before the cache is emptied
        if device.type == "cuda":
            torch.cuda.empty_cache()
    elapsed, audio = times.total_seconds, sum(times.results) / 24000
    return {"chunks": len(indices), "speech_tokens": sum(lengths[i] for i in indices),
            "audio_seconds": round(audio, 2), "total_seconds": round(elapsed, 3),
            "seconds_per_audio_second": round(elapsed / audio, 5), "x_realtime": round(audio / elapsed, 2),
            "per_chunk": per_chunk(times, chunks, lengths),
            "method": method(times, len(chunks), lengths, min_chunks, min_audio_s,
                             "none needed: the ratio is taken per second of audio (the timed chunks' seconds / "
                             "their audio seconds)", "generate()"),
            "dtype": "fp32 (as shipped)", "import_shims": shims,
            "note": "generate() one chunk at a time, as the reference runs"}
