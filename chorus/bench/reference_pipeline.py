"""Times the reference package's whole ``generate()`` (``chatterbox-tts``), for benchmark ratios.

Benchmark-only, like :mod:`chorus.bench.reference_t3`: the reference loads the same
random-weight checkpoint directory (the official layout) with its own ``from_local`` and runs
as shipped (fp32, one chunk at a time: T3, then S3Gen, then its watermarker, a no-op stand-in
where ``resemble-perth`` is absent). A forward hook on its speech head fixes each chunk's length
as Chorus's benchmark does.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from chorus.bench.reference_t3 import _force_lengths, _install_import_shims
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
                           *, cfg_weight: float, device: torch.device) -> dict:
    shims = _install_import_shims()
    tts = _load_reference(variant, Path(directory), device)
    state, handle = _force_lengths(tts.t3, variant.t3.stop_speech_token, variant.t3.num_speech_codes)
    kwargs = {"cfg_weight": cfg_weight} if variant.name == "original" else {}
    times, samples = [], 0
    try:
        for text, n in zip(chunks, lengths):
            state["calls"], state["target"] = 0, n
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            wav = tts.generate(text, **kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
            samples += wav.shape[-1]
    finally:
        handle.remove()
        del tts
        if device.type == "cuda":
            torch.cuda.empty_cache()
    elapsed, audio = sum(times), samples / 24000
    return {"chunks": len(chunks), "speech_tokens": sum(lengths), "audio_seconds": round(audio, 2),
            "total_seconds": round(elapsed, 3), "seconds_per_audio_second": round(elapsed / audio, 5),
            "x_realtime": round(audio / elapsed, 2), "dtype": "fp32 (as shipped)", "import_shims": shims,
            "note": "generate() one chunk at a time, as the reference runs"}
