"""A padded batch of mels of different lengths vocodes each item exactly as it would be vocoded alone."""
from __future__ import annotations

import pytest
import torch

from chorus.models.s3gen.f0_predictor import F0PredictorConfig
from chorus.models.s3gen.hift import HiFTConfig, HiFTGenerator, SourceNoise, draw_source_noise, fold_weight_norm

TINY = HiFTConfig(base_channels=32, f0=F0PredictorConfig(hidden_channels=32))
LENGTHS = [7, 12, 3, 10]


def snr_db(reference: torch.Tensor, test: torch.Tensor) -> float:
    return 10 * torch.log10(reference.pow(2).sum() / (test - reference).pow(2).sum().clamp_min(1e-30)).item()


@pytest.fixture(scope="module")
def tiny_hift() -> HiFTGenerator:
    torch.manual_seed(0)
    model = HiFTGenerator(TINY)
    with torch.no_grad():
        model.f0_predictor.classifier.weight.mul_(4000.0)  # voiced frames: exercise the sine path
        for name, param in model.named_parameters():
            if name.endswith("alpha"):
                param.uniform_(0.5, 1.5)
    return fold_weight_norm(model).eval()


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    mels = [torch.randn(1, 80, n, generator=g) for n in LENGTHS]
    padded = torch.full((len(LENGTHS), 80, max(LENGTHS)), 50.0)  # loud filler
    for i, mel in enumerate(mels):
        padded[i, :, : LENGTHS[i]] = mel[0]
    noise = draw_source_noise(
        LENGTHS, TINY, noise_generators=[torch.Generator().manual_seed(10 + i) for i in range(len(LENGTHS))],
        phase_generators=[torch.Generator().manual_seed(20 + i) for i in range(len(LENGTHS))])
    return mels, padded, noise


def item_noise(noise: SourceNoise, i: int) -> SourceNoise:
    return SourceNoise(phases=noise.phases[i:i + 1], noise=noise.noise[i:i + 1, :, : LENGTHS[i] * 480])


def test_hift_batch_items_equal_each_item_alone(tiny_hift, batch):
    mels, padded, noise = batch
    out = tiny_hift(padded, torch.tensor(LENGTHS), noise)
    for i, n in enumerate(LENGTHS):
        alone = tiny_hift(mels[i], noise=item_noise(noise, i))
        assert (alone.f0 > 10).float().mean() > 0.5
        assert torch.allclose(out.f0[i, :n], alone.f0[0], rtol=1e-5, atol=1e-3)
        assert (out.source[i, : n * 480] - alone.source[0]).abs().max().item() <= 1e-4
        wav = out.wav[i, : n * 480]
        assert snr_db(alone.wav[0], wav) >= 60.0
        assert (wav - alone.wav[0]).abs().max().item() <= 1e-4


def test_hift_padding_content_never_reaches_the_output(tiny_hift, batch):
    _, padded, noise = batch
    other = padded.clone()
    for i, n in enumerate(LENGTHS):
        other[i, :, n:] = -30.0 * torch.randn(80, max(LENGTHS) - n)
    first = tiny_hift(padded, torch.tensor(LENGTHS), noise)
    second = tiny_hift(other, torch.tensor(LENGTHS), noise)
    assert torch.equal(first.wav, second.wav) and torch.equal(first.f0, second.f0)


def test_hift_output_is_zero_past_each_item(tiny_hift, batch):
    _, padded, noise = batch
    out = tiny_hift(padded, torch.tensor(LENGTHS), noise)
    assert out.wav.shape == (len(LENGTHS), 480 * max(LENGTHS))
    assert out.wav_lengths.tolist() == [480 * n for n in LENGTHS]
    for i, n in enumerate(LENGTHS):
        assert out.wav[i, 480 * n:].abs().sum().item() == 0.0
        assert out.f0[i, n:].abs().sum().item() == 0.0


def test_source_noise_of_an_item_depends_only_on_its_own_generators():
    def draw(frame_counts, seeds):
        return draw_source_noise(frame_counts, TINY, noise_generators=[torch.Generator().manual_seed(s) for s in seeds],
                                 phase_generators=[torch.Generator().manual_seed(s + 1) for s in seeds])

    together = draw([5, 2, 9], [7, 8, 9])
    alone = draw([2], [8])
    assert torch.equal(together.phases[1], alone.phases[0])
    assert torch.equal(together.noise[1, :, : 2 * 480], alone.noise[0])
    assert together.noise[1, :, 2 * 480:].abs().sum().item() == 0.0


def test_hift_rejects_frame_counts_outside_the_batch(tiny_hift):
    with pytest.raises(ValueError):
        tiny_hift(torch.zeros(2, 80, 5), torch.tensor([5, 6]))


def test_hift_accepts_a_batch_padded_past_its_longest_item(tiny_hift):
    mel = torch.randn(2, 80, 8)
    out = tiny_hift(mel, torch.tensor([5, 6]))  # default noise covers 6 frames, the batch 8
    assert out.wav.shape == (2, 8 * 480)
    assert out.wav[:, 6 * 480:].abs().sum().item() == 0.0


def test_full_frame_counts_give_what_no_counts_give(tiny_hift, batch):
    # the masked path (what a CUDA graph captures) equals the unmasked one when nothing is padded
    mels, _, noise = batch
    mel = mels[0].expand(2, -1, -1).contiguous()
    counts = torch.full((2,), mel.shape[-1])
    source = SourceNoise(noise.phases[:2], noise.noise[:2, :, : mel.shape[-1] * 480])
    with torch.inference_mode():
        f0 = tiny_hift.predict_f0(mel, counts)
        masked = tiny_hift.decode(mel, tiny_hift.harmonic_source(f0, counts, source), counts)
        plain = tiny_hift.decode(mel, tiny_hift.harmonic_source(tiny_hift.predict_f0(mel), None, source))
    assert torch.equal(f0, tiny_hift.predict_f0(mel))
    torch.testing.assert_close(masked, plain, rtol=1e-5, atol=1e-6)
