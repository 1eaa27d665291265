"""CAMPPlus x-vector and its Kaldi fbank front end, against the reference and torchaudio."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from chorus.audio import SincResampler, load_audio
from chorus.models.campplus import CAMPPlus
from chorus.models.checkpoint import CheckpointMismatchError
from chorus.models.fbank import KaldiFbankConfig, kaldi_fbank, kaldi_mel_banks
from chorus.models.loading import read_state_dict
from tests.conftest import DATA_DIR

pytestmark = pytest.mark.oracle


def _signals() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    speech = load_audio(os.path.join(DATA_DIR, "sample-02.mp3"), 16000).samples
    t = np.arange(2 * 16000) / 16000
    return {
        "sample-02.mp3": speech,
        "tone": (0.4 * np.sin(2 * np.pi * 180 * t) + 0.1 * np.sin(2 * np.pi * 2500 * t)).astype(np.float32),
        "noise": (0.1 * rng.standard_normal(len(t))).astype(np.float32),
        "silence-padded-speech": np.concatenate([np.zeros(8000, np.float32), speech[:24000], np.zeros(8123, np.float32)]),
    }


@pytest.fixture(scope="module")
def signals():
    return _signals()


@pytest.fixture(scope="module")
def reference(oracle):
    from chatterbox.models.s3gen.xvector import CAMPPlus as ReferenceCAMPPlus

    torch.manual_seed(0)
    model = ReferenceCAMPPlus(memory_efficient=False).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # fresh BatchNorms are the identity; make every statistic matter
        for module in model.modules():
            if isinstance(module, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
                module.running_mean.normal_(0.0, 0.1, generator=gen)
                module.running_var.uniform_(0.5, 1.5, generator=gen)
                if module.affine:
                    module.weight.add_(0.1 * torch.randn(module.weight.shape, generator=gen))
                    module.bias.add_(0.1 * torch.randn(module.bias.shape, generator=gen))
            elif isinstance(module, torch.nn.Conv1d) and module.bias is not None:
                module.bias.add_(0.1 * torch.randn(module.bias.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def s3gen_file(reference, module_tmp_path_factory):
    from safetensors.torch import save_file

    path = module_tmp_path_factory.mktemp("s3gen") / "s3gen.safetensors"
    state = {f"speaker_encoder.{k}": v.contiguous() for k, v in reference.state_dict().items()}
    state["tokenizer.window"] = torch.hann_window(400)  # other S3Gen keys are ignored
    save_file(state, str(path))
    return path


@pytest.fixture(scope="module")
def campplus(s3gen_file):
    return CAMPPlus.from_state_dict(read_state_dict(s3gen_file), prefix="speaker_encoder.", source=str(s3gen_file))


def test_keys_and_shapes_match_reference(reference):
    expected = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert CAMPPlus.checkpoint_shapes() == expected
    assert len(expected) == 937


def test_missing_weight_is_reported(s3gen_file):
    state = read_state_dict(s3gen_file)
    del state["speaker_encoder.xvector.block2.tdnnd7.cam_layer.linear1.bias"]
    with pytest.raises(CheckpointMismatchError, match="tdnnd7.cam_layer.linear1.bias"):
        CAMPPlus.from_state_dict(state, prefix="speaker_encoder.")


def test_mel_banks_match_torchaudio():
    from torchaudio.compliance.kaldi import get_mel_banks

    expected, _ = get_mel_banks(80, 512, 16000.0, 20.0, 0.0, 100.0, -500.0, 1.0)
    torch.testing.assert_close(kaldi_mel_banks(KaldiFbankConfig())[:, :256], expected, rtol=0, atol=0)


def test_fbank_matches_torchaudio(signals):
    import torchaudio.compliance.kaldi as kaldi

    cases = {**signals, "silence": np.zeros(8000, np.float32), "odd-length": signals["noise"][:12345]}
    for name, wav in cases.items():
        x = torch.from_numpy(wav)
        expected = kaldi.fbank(x[None], num_mel_bins=80)
        got = kaldi_fbank(x)
        assert got.shape == expected.shape, name
        assert (got - expected).abs().max().item() <= 1e-4, name


def test_fbank_batches_equal_length_clips(signals):
    batch = torch.stack([torch.from_numpy(signals["tone"]), torch.from_numpy(signals["noise"])])
    feats = kaldi_fbank(batch)
    torch.testing.assert_close(feats[1], kaldi_fbank(batch[1]), rtol=0, atol=1e-6)


def test_fbank_rejects_clips_shorter_than_one_frame():
    with pytest.raises(ValueError, match="400 samples"):
        kaldi_fbank(torch.zeros(399))


@pytest.mark.fullsize
def test_xvector_matches_reference(campplus, reference, signals):
    for name, wav in signals.items():
        x = torch.from_numpy(wav)
        with torch.inference_mode():
            expected = reference.inference([x])
        got = campplus.embed(x)
        assert got.shape == (1, 192)
        assert (got - expected).abs().max().item() <= 1e-4, name


@pytest.mark.fullsize
def test_embed_ref_path_matches_reference(campplus, reference):
    """S3Gen's embed_ref: 24 kHz clip -> torchaudio-style 16 kHz copy -> x-vector."""
    from torchaudio.transforms import Resample

    wav24 = torch.from_numpy(load_audio(os.path.join(DATA_DIR, "sample-02.mp3"), 24000).samples)[None]
    with torch.inference_mode():
        expected = reference.inference(Resample(24000, 16000)(wav24))
    got = campplus.embed(SincResampler(24000, 16000)(wav24[0]))
    assert (got - expected).abs().max().item() <= 1e-4


@pytest.mark.fullsize
def test_equal_length_batch_equals_single_clips(campplus, signals):
    wavs = [signals["tone"], signals["noise"], signals["sample-02.mp3"]]
    batched = campplus.embed(wavs)
    for wav, row in zip(wavs, batched):
        torch.testing.assert_close(row, campplus.embed(wav)[0], rtol=0, atol=1e-5)
