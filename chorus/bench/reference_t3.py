"""Times the reference package's own T3 generation loop (``chatterbox-tts``), for benchmark ratios.

The reference is an optional, benchmark-only dependency; Chorus never imports it elsewhere. It
runs as shipped (fp32, one chunk at a time, its own sampling loop), with random weights, and a
forward hook on its speech head fixes each chunk's output length like Chorus's benchmark does
(EOS banned until the length, then forced), and each chunk's output is checked to have that
length. Timing follows :mod:`chorus.bench.reference_timing` (a warm-up call, evenly spaced
chunks, at least a minute of audio).
"""
from __future__ import annotations

import importlib
import importlib.machinery
import sys
import time
import types

import torch

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
from chorus.voices import Voice


def _install_import_shims() -> list[str]:
    """``import chatterbox`` pulls in the watermarker and librosa, which T3 never uses; where
    they are not installed, stand-ins let the package import (T3 code paths are unaffected)."""
    shimmed = []
    try:
        importlib.import_module("perth")
    except Exception:
        perth = types.ModuleType("perth")

        class PerthImplicitWatermarker:  # noqa: D401 - minimal stand-in
            def apply_watermark(self, wav, sample_rate, **_):
                return wav

        perth.PerthImplicitWatermarker = PerthImplicitWatermarker
        perth.__spec__ = importlib.machinery.ModuleSpec("perth", None)
        sys.modules["perth"] = perth
        shimmed.append("perth")
    try:
        importlib.import_module("librosa")
    except Exception:
        librosa = types.ModuleType("librosa")
        filters = types.ModuleType("librosa.filters")

        def _unavailable(*args, **kwargs):
            raise RuntimeError("librosa is not installed; the benchmark does not need this function")

        def mel(*, sr, n_fft, n_mels=128, fmin=0.0, fmax=None, **_):
            # Chorus's filterbank equals librosa's (tested); the reference builds its models with it
            from chorus.models.s3gen.mel import mel_filterbank

            return mel_filterbank(sr, n_fft, n_mels, fmin, fmax).numpy()

        filters.mel = mel
        for module in (librosa, filters):  # some libraries probe importlib specs of optional deps
            module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
        librosa.filters = filters
        librosa.load = librosa.resample = _unavailable
        sys.modules["librosa"], sys.modules["librosa.filters"] = librosa, filters
        shimmed.append("librosa")
    return shimmed


def _build_reference(variant: Variant, device: torch.device):
    from chatterbox.models.t3 import T3
    from chatterbox.models.t3.modules.t3_config import T3Config

    if variant.t3.backbone.kind == "llama":
        hp = T3Config.english_only() if variant.name == "original" else T3Config.multilingual()
    else:
        hp = T3Config(text_tokens_dict_size=variant.t3.text_vocab_size)
        hp.llama_config_name = "GPT2_medium"
        hp.speech_tokens_dict_size = variant.t3.speech_vocab_size
        hp.input_pos_emb = None
        hp.speech_cond_prompt_len = variant.t3.speech_cond_prompt_len
        hp.use_perceiver_resampler = False
        hp.emotion_adv = False
        if variant.name == "nano":
            raise ValueError("the PyPI reference has no nano config; benchmark turbo instead")
    return T3(hp).to(device).eval(), hp


def _force_lengths(t3, eos: int, vocab_real: int):
    state = {"calls": 0, "target": 0}

    def hook(_module, _inputs, output):
        call = state["calls"]
        state["calls"] += 1
        out = output.clone()
        # large finite values, not -inf: the reference's CFG combine would turn -inf - -inf into NaN
        if call < state["target"]:
            out[..., vocab_real:] = -1e9  # no BOS/EOS/unused ids before the length
        else:
            out[...] = -1e9
            out[..., eos] = 0.0
        return out

    handle = t3.speech_head.register_forward_hook(hook)
    return state, handle


@torch.inference_mode()
def run_reference_t3(variant: Variant, voice: Voice, chunks: list[str], chunk_ids: list[list[int]], lengths: list[int],
                     *, cfg_weight: float, device: torch.device, min_chunks: int = DEFAULT_REFERENCE_CHUNKS,
                     min_audio_s: float = MIN_TIMED_AUDIO_S, build=None, clock=time.perf_counter) -> dict:
    """Time the reference T3 loop on the workload ``chunks`` (text ids and forced lengths given):
    one untimed warm-up call, then the chunks :func:`select_reference_chunks` picks, each checked
    to have generated its forced length. ``build(variant, device)`` replaces the reference
    builder (tests pass tiny ones)."""
    shims = _install_import_shims()
    from chatterbox.models.t3.modules.cond_enc import T3Cond

    t3, _ = (build or _build_reference)(variant, device)
    state, handle = _force_lengths(t3, variant.t3.stop_speech_token, variant.t3.num_speech_codes)
    cond = dict(speaker_emb=voice.speaker_embedding.to(device),
                cond_prompt_speech_tokens=voice.t3_prompt_tokens.to(device))
    longest = max(lengths) + 2

    def generate(index: int) -> int:
        state["calls"], state["target"] = 0, lengths[index]
        text = torch.tensor(chunk_ids[index], dtype=torch.long, device=device)[None]
        if variant.t3.start_text_token is not None:
            sot, eot = variant.t3.start_text_token, variant.t3.stop_text_token
            text = torch.nn.functional.pad(text, (1, 0), value=sot)
            text = torch.nn.functional.pad(text, (0, 1), value=eot)
        if variant.t3.backbone.kind == "llama":
            t3_cond = T3Cond(**cond, emotion_adv=0.5 * torch.ones(1, 1, 1, device=device))
            out = t3.inference(t3_cond=t3_cond, text_tokens=torch.cat([text, text]), max_new_tokens=longest,
                               cfg_weight=cfg_weight)
        else:
            out = t3.inference_turbo(T3Cond(**cond), text, max_gen_len=longest)
        generated = int((out[0] < variant.t3.num_speech_codes).sum())  # without BOS/EOS
        check_generated(generated, lengths[index], index)
        return generated

    indices = select_reference_chunks(lengths, min_chunks, min_audio_s)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    try:
        times = time_reference(generate, indices, sync=sync, clock=clock)
    finally:
        handle.remove()
    tokens, elapsed = sum(times.results), times.total_seconds
    rate = tokens / elapsed
    return {"chunks": len(indices), "speech_tokens": tokens, "t3_seconds": round(elapsed, 3),
            "speech_tokens_per_s": round(rate, 1), "per_chunk": per_chunk(times, chunks, lengths),
            "extrapolated_workload_t3_seconds": round(sum(lengths) / rate, 1),
            "method": method(times, len(chunks), lengths, min_chunks, min_audio_s,
                             "workload seconds = the workload's forced speech tokens / the timed chunks' "
                             "speech tokens per second",
                             "t3.inference()" if variant.t3.backbone.kind == "llama" else "t3.inference_turbo()"),
            "dtype": "fp32 (as shipped)", "import_shims": shims,
            "note": "one chunk at a time, as the reference runs; speech_tokens counts what it generated"}
