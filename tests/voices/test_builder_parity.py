"""Voice building against the reference ``prepare_conditionals`` of the original and Turbo entry classes.

The reference's VoiceEncoder, S3 tokenizer and CAMPPlus are built full size with seeded random
weights (biases, norms and BatchNorm statistics perturbed), saved as ``ve.safetensors`` and the
``tokenizer.*`` / ``speaker_encoder.*`` part of ``s3gen.safetensors``, and loaded by
``VoiceFrontEnd.from_checkpoint``. The reference method runs unmodified on a stand-in ``self``
that carries exactly the attributes it reads (``s3gen.embed_ref`` is the reference's own method);
this avoids building the reference T3 and flow, which the method never touches.

Every field of the resulting conditionals is compared: tokens exactly (except where a reference
FSQ value sits within 1e-4 of a rounding boundary), embeddings and the prompt mel within 1e-4.
"""
from __future__ import annotations

import os
import types
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile
import torch

from chorus.audio import load_audio
from chorus.models.loading import Checkpoint
from chorus.models.variants import get_variant
from chorus.voices import Voice, VoiceFrontEnd
from tests.conftest import DATA_DIR

pytestmark = [pytest.mark.oracle, pytest.mark.fullsize]

TOLERANCE = 1e-4
BOUNDARY_MARGIN = 1e-4
FSQ_SCALE = 0.9990000128746033


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Make norms, biases and BatchNorm statistics matter (they start at exactly 1 / 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                module.running_mean.normal_(0.0, 0.1, generator=g)
                module.running_var.uniform_(0.5, 1.5, generator=g)
        for name, param in model.named_parameters():
            if name.endswith("bias") or name.endswith("ln.weight") or (param.dim() == 1 and name.endswith("weight")):
                param.add_(0.05 * torch.randn(param.shape, generator=g))


@pytest.fixture(scope="module")
def reference_models(oracle):
    from chatterbox.models.s3gen.xvector import CAMPPlus as ReferenceCAMPPlus
    from chatterbox.models.s3tokenizer import S3Tokenizer as ReferenceS3Tokenizer
    from chatterbox.models.voice_encoder import VoiceEncoder as ReferenceVoiceEncoder

    torch.manual_seed(0)
    tokenizer = ReferenceS3Tokenizer().eval()
    campplus = ReferenceCAMPPlus(memory_efficient=False).eval()
    voice_encoder = ReferenceVoiceEncoder().eval()
    for seed, model in enumerate((tokenizer, campplus, voice_encoder), start=1):
        _perturb(model, seed)
    return SimpleNamespace(tokenizer=tokenizer, campplus=campplus, voice_encoder=voice_encoder)


@pytest.fixture(scope="module")
def checkpoint_dir(reference_models, module_tmp_path_factory):
    """``ve.safetensors`` and the voice part of ``s3gen.safetensors`` / ``s3gen_meanflow.safetensors``."""
    from safetensors.torch import save_file

    directory = module_tmp_path_factory.mktemp("voice-ckpt")
    save_file({k: v.contiguous() for k, v in reference_models.voice_encoder.state_dict().items()},
              str(directory / "ve.safetensors"))
    s3gen = {f"tokenizer.{k}": v.contiguous() for k, v in reference_models.tokenizer.state_dict().items()}
    s3gen.update({f"speaker_encoder.{k}": v.contiguous() for k, v in reference_models.campplus.state_dict().items()})
    for name in ("s3gen.safetensors", "s3gen_meanflow.safetensors"):
        save_file(s3gen, str(directory / name))
    return directory


@pytest.fixture(scope="module")
def front_ends(checkpoint_dir):
    original = VoiceFrontEnd.from_checkpoint(Checkpoint(get_variant("original"), checkpoint_dir))
    # Turbo shares the loaded models; only the variant's clip rules differ
    turbo = VoiceFrontEnd(get_variant("turbo"), original.voice_encoder, original.s3_tokenizer, original.campplus)
    return {"original": original, "turbo": turbo}


def reference_conditionals(reference_models, variant_name: str, path: str) -> dict:
    """Run the reference ``prepare_conditionals`` of ``variant_name`` on ``path``; returns the conds dict."""
    from chatterbox.models.s3gen.s3gen import S3Token2Mel
    from chatterbox.models.s3gen.utils.mel import mel_spectrogram
    from chatterbox.tts import ChatterboxTTS
    from chatterbox.tts_turbo import ChatterboxTurboTTS

    entry = ChatterboxTurboTTS if variant_name == "turbo" else ChatterboxTTS
    s3gen = SimpleNamespace(tokenizer=reference_models.tokenizer, speaker_encoder=reference_models.campplus,
                            mel_extractor=mel_spectrogram, device=torch.device("cpu"), dtype=torch.float32)
    s3gen.embed_ref = types.MethodType(S3Token2Mel.embed_ref, s3gen)
    owner = SimpleNamespace(
        s3gen=s3gen, ve=reference_models.voice_encoder, device="cpu", conds=None,
        t3=SimpleNamespace(hp=SimpleNamespace(speech_cond_prompt_len=get_variant(variant_name).t3.speech_cond_prompt_len)),
        DEC_COND_LEN=entry.DEC_COND_LEN, ENC_COND_LEN=entry.ENC_COND_LEN)
    owner.norm_loudness = types.MethodType(ChatterboxTurboTTS.norm_loudness, owner)
    with torch.inference_mode():
        entry.prepare_conditionals(owner, path)
    return {"t3": dict(owner.conds.t3.__dict__), "gen": dict(owner.conds.gen)}


def _fsq_values(reference_tokenizer, wav_16k: torch.Tensor) -> torch.Tensor:
    """Pre-rounding FSQ values of the reference tokenizer for one clip: (T, 8)."""
    mel = reference_tokenizer.log_mel_spectrogram(wav_16k)[None]
    hidden, _ = reference_tokenizer.encoder(mel, torch.tensor([mel.shape[-1]]))
    return (reference_tokenizer.quantizer._codebook.project_down(hidden).float().tanh() * FSQ_SCALE)[0]


def _assert_tokens_match(got: torch.Tensor, expected: torch.Tensor, values: torch.Tensor | None, label: str):
    assert got.shape == expected.shape, f"{label}: {tuple(got.shape)} vs {tuple(expected.shape)}"
    differ = (got != expected).reshape(-1)
    if not differ.any():
        return
    assert values is not None, f"{label}: {int(differ.sum())} tokens differ"
    on_boundary = ((values[: differ.shape[0]].abs() - 0.5).abs() < BOUNDARY_MARGIN).any(-1)
    assert not (differ & ~on_boundary).any(), f"{label}: {int(differ.sum())} tokens differ off a rounding boundary"


def _compare(voice: Voice, expected: dict, label: str, fsq=None) -> dict:
    t3, gen = expected["t3"], expected["gen"]
    errors = {}
    for name, got, want in (("speaker_embedding", voice.speaker_embedding, t3["speaker_emb"]),
                            ("s3gen_prompt_mel", voice.s3gen_prompt_mel, gen["prompt_feat"]),
                            ("xvector", voice.xvector, gen["embedding"])):
        assert got.shape == want.shape, f"{label} {name}: {tuple(got.shape)} vs {tuple(want.shape)}"
        errors[name] = (got.float() - want.float()).abs().max().item()
        assert errors[name] <= TOLERANCE, f"{label} {name}: max abs error {errors[name]:.3g}"
    _assert_tokens_match(voice.t3_prompt_tokens, t3["cond_prompt_speech_tokens"].long(),
                         None if fsq is None else fsq["t3"], f"{label} t3 tokens")
    _assert_tokens_match(voice.s3gen_prompt_tokens, gen["prompt_token"].long(),
                         None if fsq is None else fsq["s3gen"], f"{label} s3gen tokens")
    assert gen["prompt_token_len"].tolist() == [voice.s3gen_prompt_tokens.shape[1]]
    assert gen["prompt_feat_len"] is None and t3["cond_prompt_speech_emb"] is None
    assert voice.t3_prompt_embeds is None
    return errors


def _boundary_values(reference_models, path: str, variant_name: str) -> dict:
    """FSQ values of the two clips the reference tokenizes (T3 prompt and S3Gen prompt)."""
    from chorus.audio import SincResampler, prepare_reference, ReferencePolicy

    ref = prepare_reference(path, ReferencePolicy.for_variant(get_variant(variant_name)))
    with torch.inference_mode():
        wav16 = SincResampler(24000, 16000)(torch.from_numpy(ref.s3gen_prompt_24k))
        return {"t3": _fsq_values(reference_models.tokenizer, torch.from_numpy(ref.t3_prompt_16k)),
                "s3gen": _fsq_values(reference_models.tokenizer, wav16)}


@pytest.mark.parametrize("variant_name,clip", [("original", "sample-01.mp3"), ("turbo", "sample-01-02.flac")])
def test_voice_matches_reference_prepare_conditionals(reference_models, front_ends, variant_name, clip,
                                                      record_property):
    path = os.path.join(DATA_DIR, clip)
    expected = reference_conditionals(reference_models, variant_name, path)
    voice = front_ends[variant_name].build(path)
    assert voice.name == os.path.splitext(clip)[0]
    try:
        errors = _compare(voice, expected, variant_name)
    except AssertionError as exc:
        if "tokens differ" not in str(exc):
            raise
        errors = _compare(voice, expected, variant_name, fsq=_boundary_values(reference_models, path, variant_name))
    record_property(f"voice_errors[{variant_name}]", errors)
    print(f"\n{variant_name} voice from {clip}: " + ", ".join(f"{k} {v:.2g}" for k, v in errors.items())
          + f"; T3 prompt {voice.t3_prompt_tokens.shape[1]} tokens, S3Gen prompt "
            f"{voice.s3gen_prompt_tokens.shape[1]} tokens / {voice.s3gen_prompt_mel.shape[1]} mel frames")


def test_odd_length_clip_from_an_array_matches_reference(reference_models, front_ends, tmp_path):
    """An array input whose 24 kHz mel has an odd length: the reference cuts the prompt tokens to floor(Tm/2)."""
    samples = load_audio(os.path.join(DATA_DIR, "sample-01-02.flac"), 24000).samples[: 24000 * 7 + 500]
    path = tmp_path / "odd.wav"
    soundfile.write(str(path), samples, 24000, subtype="FLOAT")  # lossless, so both sides see the same samples
    expected = reference_conditionals(reference_models, "original", str(path))
    voice = front_ends["original"].build(samples, sample_rate=24000, name="odd")
    assert voice.s3gen_prompt_mel.shape[1] == 351 and voice.s3gen_prompt_tokens.shape[1] == 175
    try:
        _compare(voice, expected, "odd-length")
    except AssertionError as exc:
        if "tokens differ" not in str(exc):
            raise
        _compare(voice, expected, "odd-length", fsq=_boundary_values(reference_models, str(path), "original"))


def test_voice_round_trips_through_a_file_and_the_conditionals_layout(front_ends, tmp_path):
    voice = front_ends["turbo"].build(os.path.join(DATA_DIR, "sample-01-02.flac"), name="me")
    loaded = Voice.load(voice.save(tmp_path / "me.safetensors"))
    assert loaded.content_hash == voice.content_hash and loaded.name == "me"
    again = Voice.from_conditionals(voice.to_conditionals())
    assert again.content_hash == voice.content_hash
    assert np.isclose(voice.speaker_embedding.norm().item(), 1.0, atol=1e-5)
