"""S3Gen end to end (tokens -> 24 kHz waveform) against the reference ``S3Token2Wav.inference``.

The reference is built full size with seeded random weights that all matter (norms, biases and
the meanflow mixer perturbed; the F0 read-out scaled so most frames are voiced and the harmonic
source counts), saved as the official file and loaded by ``S3Gen.from_checkpoint``. Both sides
get the same seed: the reference after ``torch.manual_seed(seed)``, Chorus through per-item
generators. Inputs are short (50 prompt tokens, 20 new tokens) and the standard flow runs 2 steps
(+ CFG) to keep CPU time down. The batch test reuses the loaded models.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from chorus.audio import load_audio
from chorus.models.loading import Checkpoint
from chorus.models.s3gen.mel import log_mel_spectrogram
from chorus.models.s3gen.s3gen import (
    SAMPLES_PER_TOKEN, SILENCE_TOKEN, S3Gen, item_generators, output_num_samples,
)
from chorus.models.variants import get_variant
from chorus.voices import Voice
from tests.conftest import DATA_DIR
from tests.models.s3gen.oracle_s3gen import build_oracle_s3gen, oracle_ref_dict, save_official

pytestmark = [pytest.mark.oracle, pytest.mark.fullsize]

F0_READOUT_SCALE = 4000.0
MIN_SNR_DB = 60.0
NEW_TOKENS = 20


@dataclass
class Pair:
    reference: torch.nn.Module  # S3Token2Wav
    ours: S3Gen


def _voice(prompt_tokens: int, mel_frames: int, seed: int, offset_s: float = 1.0) -> Voice:
    """A voice whose prompt mel is real speech (sample-01) and whose tokens / x-vector are random."""
    g = torch.Generator().manual_seed(seed)
    speech = load_audio(os.path.join(DATA_DIR, "sample-01.mp3"), 24000).samples
    start = int(offset_s * 24000)
    mel, _ = log_mel_spectrogram(torch.from_numpy(speech[start: start + 480 * mel_frames + 240]))
    return Voice(
        speaker_embedding=torch.rand(1, 256, generator=g),
        t3_prompt_tokens=torch.randint(0, 6561, (1, 150), generator=g),
        s3gen_prompt_tokens=torch.randint(0, 6561, (1, prompt_tokens), generator=g),
        s3gen_prompt_mel=mel[:, :, :mel_frames].transpose(1, 2).contiguous(),
        xvector=torch.randn(1, 192, generator=g),
        name=f"test-{seed}",
    )


@pytest.fixture(scope="module", params=["original", "turbo"])
def pair(request, oracle, module_tmp_path_factory):
    variant = get_variant(request.param)
    meanflow = variant.s3gen.meanflow
    reference = build_oracle_s3gen(meanflow=meanflow, seed=11 + meanflow)
    with torch.no_grad():
        reference.mel2wav.f0_predictor.classifier.weight.mul_(F0_READOUT_SCALE)
        reference.mel2wav.f0_predictor.classifier.bias.mul_(F0_READOUT_SCALE)
    directory = module_tmp_path_factory.mktemp(f"s3gen-{variant.name}")
    path = save_official(reference, str(directory), meanflow)
    assert os.path.basename(path) == variant.files.s3gen
    ours = S3Gen.from_checkpoint(Checkpoint(variant, directory), voice_models=False)
    os.remove(path)
    yield Pair(reference, ours)


def _reference_wav(pair: Pair, tokens: list[int], voice: Voice, seed: int, steps: int) -> torch.Tensor:
    ref_dict = oracle_ref_dict(voice.s3gen_prompt_tokens, voice.s3gen_prompt_mel, voice.xvector)
    torch.manual_seed(seed)
    wav, _ = pair.reference.inference(speech_tokens=torch.tensor([tokens]), ref_dict=ref_dict,
                                      n_cfm_timesteps=steps)
    return wav[0]


def _snr_db(reference: torch.Tensor, actual: torch.Tensor) -> float:
    noise = (actual.double() - reference.double()).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(reference.double().pow(2).sum().item() / noise)


def test_tokens_to_wav_matches_reference_inference(pair, record_property):
    variant = pair.ours.variant
    # an odd prompt-mel length (Turbo case) exercises the reference's one-frame shift
    voice = _voice(50, 101 if variant.s3gen.meanflow else 100, seed=3)
    raw = torch.randint(0, 6561, (NEW_TOKENS,), generator=torch.Generator().manual_seed(4)).tolist()
    steps = 2
    tokens = pair.ours.postprocess_tokens(raw)
    assert tokens == raw + [SILENCE_TOKEN] * variant.append_silence_tokens
    expected = _reference_wav(pair, tokens, voice, seed=1234, steps=steps)
    [actual] = pair.ours.tokens_to_wav([raw], voice, seeds=[1234], n_steps=steps)
    assert actual.dtype == torch.float32 and actual.dim() == 1
    assert actual.shape == expected.shape
    assert actual.shape[0] == output_num_samples(len(tokens), voice.s3gen_prompt_mel.shape[1], 50, variant)
    assert bool((actual[:480] == 0).all())  # the trim of the first 20 ms
    snr = _snr_db(expected, actual)
    record_property(f"s3gen_snr_db[{variant.name}]", snr)
    print(f"\nS3Gen {variant.name} ({steps} steps): SNR {snr:.1f} dB, max abs error "
          f"{(actual - expected).abs().max().item():.3g}, peak {expected.abs().max().item():.3f}")
    assert snr >= MIN_SNR_DB


def test_same_seed_same_audio_and_other_seed_other_audio(pair):
    voice = _voice(30, 60, seed=5)
    tokens = list(range(100, 110))
    [a], [b], [c] = (pair.ours.tokens_to_wav([tokens], voice, seeds=[seed], n_steps=2) for seed in (7, 7, 8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    [d] = pair.ours.tokens_to_wav([tokens], voice, generators=[item_generators(7, "cpu")], n_steps=2)
    assert torch.equal(a, d)


@pytest.mark.parametrize("pair", ["turbo"], indirect=True)  # the cheaper meanflow model
def test_batched_items_equal_each_item_alone(pair, record_property):
    voices = [_voice(40, 80, seed=21), _voice(25, 51, seed=22, offset_s=2.0)]
    g = torch.Generator().manual_seed(9)
    lengths = [7, 23, 1, 15]
    items = [torch.randint(0, 6561, (n,), generator=g).tolist() for n in lengths]
    item_voices = [voices[0], voices[1], voices[1], voices[0]]
    seeds = [101, 102, 103, 104]
    batched = pair.ours.tokens_to_wav(items, item_voices, seeds=seeds)
    worst = 0.0
    for tokens, voice, seed, got in zip(items, item_voices, seeds, batched):
        [alone] = pair.ours.tokens_to_wav([tokens], voice, seeds=[seed])
        assert got.shape == alone.shape
        worst = max(worst, (got - alone).abs().max().item())
    record_property("s3gen_batch_vs_single_max_abs", worst)
    print(f"\nbatched vs alone: max abs difference {worst:.3g}")
    assert worst <= 1e-4


@pytest.mark.parametrize("pair", ["turbo"], indirect=True)
def test_one_voice_for_all_items_equals_a_voice_per_item(pair):
    voice = _voice(30, 60, seed=31)
    items = [[5, 6, 7, 8], [9, 10]]
    shared = pair.ours.tokens_to_wav(items, voice, seeds=[1, 2])
    per_item = pair.ours.tokens_to_wav(items, [voice, replace(voice)], seeds=[1, 2])  # two objects
    for a, b in zip(shared, per_item):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("pair", ["original"], indirect=True)  # multilingual uses the standard flow
def test_multilingual_drops_the_last_token_of_audio(pair):
    multilingual = S3Gen(get_variant("multilingual"), pair.ours.flow, pair.ours.mel2wav)
    voice = _voice(30, 60, seed=41)
    tokens = list(range(200, 212))
    [full] = pair.ours.tokens_to_wav([tokens], voice, seeds=[5], n_steps=2)
    [cut] = multilingual.tokens_to_wav([tokens], voice, seeds=[5], n_steps=2)
    assert full.shape[0] == 12 * SAMPLES_PER_TOKEN
    assert cut.shape[0] == 11 * SAMPLES_PER_TOKEN
    assert torch.equal(cut, full[: cut.shape[0]])


def test_items_without_tokens_give_empty_audio(pair):
    voice = _voice(30, 60, seed=51)
    variant = pair.ours.variant
    eos = variant.t3.stop_speech_token
    out = pair.ours.tokens_to_wav([[eos], [1, 2, 3]] if variant.append_silence_tokens == 0 else [[], [1, 2]],
                                  voice, seeds=[1, 2], n_steps=2)
    if variant.append_silence_tokens:
        # Turbo still vocodes its three silence tokens
        assert out[0].shape[0] == 3 * SAMPLES_PER_TOKEN and out[1].shape[0] == 5 * SAMPLES_PER_TOKEN
    else:
        assert out[0].shape == (0,) and out[1].shape[0] == 3 * SAMPLES_PER_TOKEN
    assert np.isfinite(out[1].numpy()).all()
