"""VoiceEncoder: official keys, librosa-compatible front end, and embedding parity with the reference."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from chorus.audio import load_audio
from chorus.models.checkpoint import CheckpointMismatchError
from chorus.models.loading import read_state_dict
from chorus.models.voice_encoder import VoiceEncoder, trim_silence
from tests.conftest import DATA_DIR

pytestmark = [pytest.mark.oracle, pytest.mark.fullsize]


def _signals() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    clips = {name: load_audio(os.path.join(DATA_DIR, name), 16000).samples
             for name in ["sample-01.mp3", "sample-02.mp3", "sample-01-02.flac"]}
    t = np.arange(3 * 16000) / 16000
    speech = clips["sample-02.mp3"]
    floor = (1e-4 * rng.standard_normal(16000)).astype(np.float32)
    return {
        **clips,
        "tone": (0.4 * np.sin(2 * np.pi * 180 * t) + 0.1 * np.sin(2 * np.pi * 2500 * t)).astype(np.float32),
        "noise": (0.1 * rng.standard_normal(len(t))).astype(np.float32),
        "silence-padded-speech": np.concatenate([floor, speech, floor[:7000], np.zeros(9000, np.float32)]),
        "short-0.4s": speech[8000:14400].copy(),
    }


@pytest.fixture(scope="module")
def signals():
    return _signals()


@pytest.fixture(scope="module")
def reference(oracle):
    from chatterbox.models.voice_encoder import VoiceEncoder as ReferenceVoiceEncoder

    torch.manual_seed(1234)
    model = ReferenceVoiceEncoder().eval()
    with torch.no_grad():  # zero-initialised biases would hide a swapped bias
        for name, param in model.named_parameters():
            if "bias" in name:
                param.add_(0.1 * torch.randn_like(param))
    return model


@pytest.fixture(scope="module")
def checkpoint_dir(reference, module_tmp_path_factory):
    from safetensors.torch import save_file

    directory = module_tmp_path_factory.mktemp("ve")
    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    save_file(state, str(directory / "ve.safetensors"))
    torch.save(state, directory / "ve.pt")
    return directory


@pytest.fixture(scope="module")
def encoder(checkpoint_dir):
    path = checkpoint_dir / "ve.safetensors"
    return VoiceEncoder.from_state_dict(read_state_dict(path), source=str(path))


def test_keys_and_shapes_are_the_official_sixteen(reference):
    expected = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert VoiceEncoder.checkpoint_shapes() == expected
    assert len(expected) == 16


def test_ve_pt_loads_like_ve_safetensors(checkpoint_dir, encoder, signals):
    from_pt = VoiceEncoder.from_state_dict(read_state_dict(checkpoint_dir / "ve.pt"))
    wav = signals["sample-02.mp3"]
    assert torch.equal(from_pt.embed_utterance(wav), encoder.embed_utterance(wav))


def test_wrong_shape_is_rejected_with_a_report(checkpoint_dir):
    state = read_state_dict(checkpoint_dir / "ve.safetensors")
    state["proj.weight"] = state["proj.weight"][:128]
    with pytest.raises(CheckpointMismatchError, match="proj.weight"):
        VoiceEncoder.from_state_dict(state)


def test_trim_matches_librosa(signals):
    import librosa

    for name, wav in signals.items():
        expected = librosa.effects.trim(wav, top_db=20)[0]
        np.testing.assert_array_equal(trim_silence(wav, 20), expected, err_msg=name)


def test_mel_matches_reference_melspec(encoder, reference, signals):
    from chatterbox.models.voice_encoder.melspec import melspectrogram

    for name, wav in signals.items():
        expected = melspectrogram(wav, reference.hp).T
        got = encoder.mel_spectrogram(wav).numpy()
        assert got.shape == expected.shape, name
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)


def test_partial_window_rule_matches_reference(encoder, reference):
    from chatterbox.models.voice_encoder.voice_encoder import get_frame_step, get_num_wins

    step = get_frame_step(0.5, 1.3, reference.hp)
    assert encoder.config.partial_step == step == 77
    for frames in range(1, 1500):
        assert encoder.partial_windows(frames) == get_num_wins(frames, step, 0.8, reference.hp), frames


def test_embedding_matches_reference(encoder, reference, signals):
    for name, wav in signals.items():
        expected = reference.embeds_from_wavs([wav], sample_rate=16000)
        got = encoder.embed_utterance(wav).numpy()
        assert np.abs(got - expected[0]).max() <= 1e-4, name


def test_batched_utterances_equal_single_ones(encoder, signals):
    wavs = [signals["sample-01.mp3"], signals["short-0.4s"], signals["tone"]]
    batched = encoder.embed_utterances(wavs, max_batch=7)
    for wav, row in zip(wavs, batched):
        torch.testing.assert_close(row, encoder.embed_utterance(wav), rtol=0, atol=1e-6)


def test_empty_utterance_raises(encoder):
    with pytest.raises(ValueError, match="empty"):
        encoder.embed_utterance(np.zeros(0, np.float32))
