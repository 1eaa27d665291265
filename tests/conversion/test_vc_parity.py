"""Voice conversion against the reference's ``ChatterboxVC`` on random weights (the oracle).

The reference ``S3Token2Wav`` is built with seeded random weights that all matter (norms and
biases perturbed, the F0 read-out scaled so the harmonic source counts), its flow and HiFT shrunk
(the S3 tokenizer and CAMPPlus stay full size: their tokens and x-vector are what is compared),
saved under the official file name and loaded by Chorus's own loaders. Both sides convert the same
files: a 3 s source (44.1 kHz, so both resample it to 16 kHz) and a target clip. Noise is pinned
as in the S3Gen parity tests: the reference runs after ``torch.manual_seed(seed)``, Chorus draws
from per-job generators seeded alike (the vocoder stage's non-streamed job).

Checked: the source's speech tokens exactly; the target's S3Gen conditioning; the flow's mel
within 1e-4 (fp32); the waveform at >= 60 dB SNR, without and with the Perth watermark.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import soundfile
import torch

from chorus.audio import load_audio
from chorus.conversion import ConversionConfig, ConversionPlanner, ConversionRequest, convert_on_stage
from chorus.models.campplus import CAMPPlus
from chorus.models.loading import read_state_dict
from chorus.models.s3gen.f0_predictor import F0PredictorConfig
from chorus.models.s3gen.flow import FlowDecoder
from chorus.models.s3gen.hift import HiFTConfig, HiFTGenerator, canonical_weight_norm_names
from chorus.models.s3gen.s3gen import S3Gen, item_generators
from chorus.models.s3tokenizer import S3TokenizerV2
from chorus.models.variants import get_variant
from chorus.vocoder import VocoderStage
from tests.conftest import DATA_DIR
from tests.models.s3gen.oracle_s3gen import build_oracle_s3gen, save_official, tiny_flow_config, torch_threads

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(180)]

F0_READOUT_SCALE = 4000.0
MIN_SNR_DB = 60.0
MEL_TOLERANCE = 1e-4
SEED = 1234
HIFT_CHANNELS = 32


def _snr_db(reference: np.ndarray, actual: np.ndarray) -> float:
    reference, actual = np.asarray(reference, np.float64), np.asarray(actual, np.float64)
    noise = ((actual - reference) ** 2).sum()
    return math.inf if noise == 0 else 10 * math.log10((reference ** 2).sum() / noise)


def _chorus_s3gen(variant, path: str) -> S3Gen:
    """Chorus's S3Gen from the official file, through each part's loader (shrunk configs)."""
    state = read_state_dict(path)
    flow = FlowDecoder.from_state_dict(tiny_flow_config(variant.s3gen.meanflow), state, prefix="flow.", source=path)
    hift_state = canonical_weight_norm_names({k[len("mel2wav."):]: v for k, v in state.items()
                                              if k.startswith("mel2wav.")})
    hift = HiFTGenerator.from_state_dict(hift_state, source=path, config=HiFTConfig(
        base_channels=HIFT_CHANNELS, f0=F0PredictorConfig(hidden_channels=HIFT_CHANNELS)))
    tokenizer = S3TokenizerV2.from_state_dict(state, prefix="tokenizer.", source=path)
    campplus = CAMPPlus.from_state_dict(state, prefix="speaker_encoder.", source=path)
    return S3Gen(variant, flow, hift, tokenizer, campplus).eval()


class Case:
    def __init__(self, variant, reference, ours: S3Gen, source: str, target: str):
        from chatterbox.vc import ChatterboxVC

        self.variant, self.ours, self.source, self.target = variant, ours, source, target
        self.vc = ChatterboxVC(reference, "cpu")
        self.planner = ConversionPlanner.for_s3gen(ours, builtin_voice=lambda: None, config=ConversionConfig())


@pytest.fixture(scope="module", params=["original", "turbo"])
def case(request, oracle, module_tmp_path_factory):
    variant = get_variant(request.param)
    meanflow = variant.s3gen.meanflow
    with torch_threads(1):
        reference = build_oracle_s3gen(meanflow=meanflow, flow=tiny_flow_config(meanflow), seed=21 + meanflow,
                                       hift_kwargs={"base_channels": HIFT_CHANNELS},
                                       f0_kwargs={"cond_channels": HIFT_CHANNELS})
    with torch.no_grad():
        reference.mel2wav.f0_predictor.classifier.weight.mul_(F0_READOUT_SCALE)
        reference.mel2wav.f0_predictor.classifier.bias.mul_(F0_READOUT_SCALE)
    directory = module_tmp_path_factory.mktemp(f"vc-{variant.name}")
    path = save_official(reference, str(directory), meanflow)
    assert os.path.basename(path) == variant.files.s3gen
    ours = _chorus_s3gen(variant, path)
    os.remove(path)
    # a 3 s source at 44.1 kHz (both sides resample it to 16 kHz) and a target clip
    speech = load_audio(os.path.join(DATA_DIR, "sample-02.mp3"), 44100).samples[: 3 * 44100]
    source = str(directory / "source.wav")
    soundfile.write(source, speech, 44100, subtype="FLOAT")
    yield Case(variant, reference, ours, source, os.path.join(DATA_DIR, "sample-01.mp3"))


def _reference_source(case: Case) -> torch.Tensor:
    import librosa

    return torch.from_numpy(librosa.load(case.source, sr=16000)[0]).float()[None]


def test_source_tokens_equal_the_reference_tokenizer(case):
    with torch_threads(1):
        plan_source = case.planner.prepare_source(ConversionRequest(case.source))
        expected, _ = case.vc.s3gen.tokenizer(_reference_source(case))
        tokens = case.planner.tokenize(plan_source)
    assert np.array_equal(plan_source.wav_16k, _reference_source(case)[0].numpy())
    assert len(tokens) == 75  # 3 s at 25 tokens per second
    assert list(tokens) == expected[0].tolist()


def test_target_clip_conditioning_equals_set_target_voice(case):
    with torch_threads(1):
        case.vc.set_target_voice(case.target)
        ref = case.vc.ref_dict
        ours = case.planner.target_from_clip(case.target)
    assert ours.tokens.tolist() == ref["prompt_token"].tolist()
    torch.testing.assert_close(ours.mel, ref["prompt_feat"].float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(ours.xvector, ref["embedding"].float(), rtol=0, atol=1e-4)


def _reference_unmarked(case: Case, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's mel and waveform of ``generate`` before its watermark (same seed, same
    calls in the same order)."""
    case.vc.set_target_voice(case.target)
    torch.manual_seed(SEED)
    wav, _ = case.vc.s3gen.inference(speech_tokens=tokens, ref_dict=dict(case.vc.ref_dict))
    case.vc.set_target_voice(case.target)
    torch.manual_seed(SEED)
    mel = case.vc.s3gen.flow_inference(tokens, ref_dict=dict(case.vc.ref_dict), finalize=True)
    return mel[0], wav[0]


def test_converted_audio_matches_the_reference(case, record_property):
    with torch_threads(1):
        plan = case.planner.plan(ConversionRequest(case.source, voice=case.target, seed=SEED))
        expected_mel, expected = _reference_unmarked(case, torch.tensor([plan.tokens]))
        got = convert_on_stage(VocoderStage(case.ours), plan)
        # the flow alone, from the same seed, as the stage's non-streamed job draws its noise
        target = plan.target
        mel, _ = case.ours.flow.inference(
            torch.tensor([plan.tokens]), torch.tensor([len(plan.tokens)]), target.tokens,
            torch.tensor([target.tokens.shape[1]]), target.mel, torch.tensor([target.mel.shape[1]]), target.xvector,
            noise=[item_generators(SEED, "cpu")[0]], n_steps=case.variant.s3gen.flow_steps)
    mel_error = (mel[0] - expected_mel).abs().max().item()
    assert mel_error <= MEL_TOLERANCE
    assert got.wav.shape == tuple(expected.shape)
    assert got.wav.shape[0] == 960 * len(plan.tokens)
    snr = _snr_db(expected.numpy(), got.wav)
    record_property(f"vc_snr_db[{case.variant.name}]", snr)
    record_property(f"vc_mel_max_abs[{case.variant.name}]", mel_error)
    print(f"\nVC {case.variant.name}: mel max abs error {mel_error:.3g}, audio SNR {snr:.1f} dB")
    assert snr >= MIN_SNR_DB


@pytest.mark.parametrize("case", ["original"], indirect=True)
def test_watermarked_conversion_matches_reference_generate(case, record_property):
    pytest.importorskip("perth")
    with torch_threads(1):
        plan = case.planner.plan(ConversionRequest(case.source, voice=case.target, seed=SEED, watermark="perth"))
        torch.manual_seed(SEED)
        expected = case.vc.generate(case.source, target_voice_path=case.target)[0].numpy()
        got = convert_on_stage(VocoderStage(case.ours), plan).wav
    assert got.shape == expected.shape
    snr = _snr_db(expected, got)
    record_property("vc_watermarked_snr_db", snr)
    print(f"\nVC generate (watermarked): SNR {snr:.1f} dB")
    assert snr >= MIN_SNR_DB
