"""Full-size HiFT against the reference vocoder (CPU, float32), loaded from an official-layout checkpoint.

The reference is built with S3Gen's constructor arguments and random weights that all matter:
weight-norm gains and Snake alphas are perturbed, and the F0 read-out is scaled so most frames are
voiced (otherwise the harmonic source contributes nothing and a broken sine path would pass).
"""
from __future__ import annotations

import os
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from chorus.models.s3gen.hift import HiFTGenerator, draw_source_noise

pytestmark = [pytest.mark.oracle, pytest.mark.fullsize]

DATA_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "data")
SEED = 1234
NUM_FRAMES = 40  # 0.8 s of audio
F0_READOUT_SCALE = 4000.0


def build_reference_hift():
    from chatterbox.models.s3gen.f0_predictor import ConvRNNF0Predictor
    from chatterbox.models.s3gen.hifigan import HiFTGenerator as ReferenceHiFT

    torch.manual_seed(0)
    model = ReferenceHiFT(  # the arguments S3Gen passes
        sampling_rate=24000, upsample_rates=[8, 5, 3], upsample_kernel_sizes=[16, 11, 7],
        source_resblock_kernel_sizes=[7, 7, 11], source_resblock_dilation_sizes=[[1, 3, 5]] * 3,
        f0_predictor=ConvRNNF0Predictor()).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("original0"):
                param.mul_(1 + 0.1 * torch.randn(param.shape, generator=g))
            elif name.endswith("alpha"):
                param.copy_(0.7 + 0.6 * torch.rand(param.shape, generator=g))
        model.f0_predictor.classifier.weight.mul_(F0_READOUT_SCALE)
        model.f0_predictor.classifier.bias.mul_(F0_READOUT_SCALE)
    return model


def run_reference_recording_draws(model, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Reference ``inference`` after ``torch.manual_seed(SEED)``, recording its random draws."""
    import chatterbox.models.s3gen.hifigan as hifigan

    draws: dict[str, list[torch.Tensor]] = {"phases": [], "normal": []}

    class RecordingUniform(hifigan.Uniform):
        def sample(self, sample_shape=torch.Size()):
            value = super().sample(sample_shape)
            draws["phases"].append(value.clone())
            return value

    real_randn_like = torch.randn_like

    def recording_randn_like(*args, **kwargs):
        value = real_randn_like(*args, **kwargs)
        draws["normal"].append(value.clone())
        return value

    torch.manual_seed(SEED)
    with mock.patch.object(hifigan, "Uniform", RecordingUniform), \
            mock.patch.object(torch, "randn_like", recording_randn_like):
        wav, source = model.inference(mel)
    draws["next_uniform"] = torch.rand(4)  # where the reference leaves the random stream
    return wav, source, draws


@pytest.fixture(scope="module")
def parity(oracle, module_tmp_path_factory):
    soundfile = pytest.importorskip("soundfile")
    from safetensors.torch import load_file, save_file
    from chatterbox.models.s3gen.utils.mel import mel_spectrogram

    reference = build_reference_hift()
    path = module_tmp_path_factory.mktemp("hift") / "s3gen.safetensors"
    save_file({f"mel2wav.{k}": v.contiguous() for k, v in reference.state_dict().items()}, str(path))
    checkpoint = load_file(str(path))
    ours = HiFTGenerator.from_state_dict(
        {k[len("mel2wav."):]: v for k, v in checkpoint.items() if k.startswith("mel2wav.")})

    speech, sample_rate = soundfile.read(os.path.join(DATA_DIR, "sample-01.mp3"), dtype="float32")
    assert sample_rate == 24000  # the clip is stored at S3Gen's rate: no resampling needed
    mel = mel_spectrogram(torch.from_numpy(speech[24000: 24000 + 480 * NUM_FRAMES]))
    ref_wav, ref_source, draws = run_reference_recording_draws(reference, mel)
    with torch.inference_mode():
        ref_f0 = reference.f0_predictor(mel)

    torch.manual_seed(SEED)
    noise = draw_source_noise([NUM_FRAMES])
    out = ours(mel, noise=noise)
    next_uniform = torch.rand(4)
    return SimpleNamespace(reference=reference, ours=ours, mel=mel, ref_wav=ref_wav[0], ref_source=ref_source[0, 0],
                           ref_f0=ref_f0[0], draws=draws, noise=noise, out=out, next_uniform=next_uniform)


def test_hift_checkpoint_names_and_shapes_are_the_reference_ones(parity):
    expected = {k: tuple(v.shape) for k, v in parity.reference.state_dict().items()}
    assert HiFTGenerator.checkpoint_shapes() == expected
    assert len(expected) == 328


def test_f0_of_vocoder_matches_reference_and_is_mostly_voiced(parity):
    f0 = parity.out.f0[0]
    assert (parity.ref_f0 > 10).float().mean().item() > 0.9
    assert (f0 - parity.ref_f0).abs().max().item() <= 1e-3


def test_hift_source_draws_equal_the_reference_random_stream(parity):
    recorded_phases = parity.draws["phases"][0][0, :, 0]
    recorded_noise = parity.draws["normal"][0]
    # the reference draws a phase for the fundamental too, then overwrites it with 0
    assert torch.equal(parity.noise.phases[0, 1:], recorded_phases[1:])
    assert parity.noise.phases[0, 0].item() == 0.0
    assert torch.equal(parity.noise.noise, recorded_noise)
    assert torch.equal(parity.next_uniform, parity.draws["next_uniform"])  # same stream position afterwards


def test_hift_source_matches_reference(parity):
    assert (parity.out.source[0] - parity.ref_source).abs().max().item() <= 1e-5


def test_hift_waveform_matches_reference(parity, record_property):
    ours, ref = parity.out.wav[0], parity.ref_wav
    assert ours.shape == ref.shape == (480 * NUM_FRAMES,)
    error = ours - ref
    snr_db = 10 * torch.log10(ref.pow(2).sum() / error.pow(2).sum().clamp_min(1e-30)).item()
    max_abs = error.abs().max().item()
    record_property("snr_db", snr_db)
    record_property("max_abs_error", max_abs)
    print(f"HiFT full-size parity: SNR {snr_db:.1f} dB, max abs error {max_abs:.3g}")
    assert ref.abs().max().item() < 0.99  # not saturated: the clamp is not hiding differences
    assert snr_db >= 60.0


def test_hift_default_noise_reproduces_reference_after_same_seed(parity):
    torch.manual_seed(SEED)
    out = parity.ours(parity.mel)
    assert torch.equal(out.wav, parity.out.wav)
