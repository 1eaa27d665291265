"""S3TokenizerV2: official keys, log-mel front end and tokens identical to the reference."""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch

from chorus.audio import load_audio
from chorus.models.loading import read_state_dict
from chorus.models.s3tokenizer import S3TokenizerConfig, S3TokenizerV2
from tests.conftest import DATA_DIR

pytestmark = pytest.mark.oracle
BOUNDARY_MARGIN = 1e-4  # FSQ values this close to +-0.5 may round either way under float reordering
FSQ_SCALE = 0.9990000128746033


def _signals() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    clips = {name: load_audio(os.path.join(DATA_DIR, name), 16000).samples
             for name in ["sample-01.mp3", "sample-02.mp3", "sample-01-02.flac"]}
    t = np.arange(int(2.5 * 16000)) / 16000
    speech = clips["sample-02.mp3"]
    return {
        **clips,
        "tone": (0.4 * np.sin(2 * np.pi * 180 * t) + 0.1 * np.sin(2 * np.pi * 2500 * t)).astype(np.float32),
        "noise": (0.1 * rng.standard_normal(len(t))).astype(np.float32),
        "silence-padded-speech": np.concatenate([np.zeros(16000, np.float32), speech, np.zeros(12345, np.float32)]),
    }


def _perturb_norms_and_biases(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("ln.weight"):
                param.add_(0.1 * torch.randn(param.shape, generator=gen))
            elif name.endswith("bias"):
                param.add_(0.05 * torch.randn(param.shape, generator=gen))


def _reference_fsq_values(reference, mel: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    hidden, _ = reference.encoder(mel, lens)
    return reference.quantizer._codebook.project_down(hidden).float().tanh() * FSQ_SCALE


def _assert_tokens_match(got: torch.Tensor, expected: torch.Tensor, values: torch.Tensor, label: str) -> None:
    """Tokens must be equal except where a reference FSQ value sits on a rounding boundary."""
    assert got.shape == expected.shape, label
    differ = got != expected
    on_boundary = ((values.abs() - 0.5).abs() < BOUNDARY_MARGIN).any(-1)
    assert not (differ & ~on_boundary).any(), f"{label}: {int(differ.sum())} tokens differ off a boundary"


@pytest.fixture(scope="module")
def signals():
    return _signals()


@pytest.fixture(scope="module")
def reference(oracle):
    from chatterbox.models.s3tokenizer import S3Tokenizer

    torch.manual_seed(0)
    model = S3Tokenizer().eval()
    _perturb_norms_and_biases(model, seed=1)
    return model


@pytest.fixture(scope="module")
def s3gen_file(reference, module_tmp_path_factory):
    """The tokenizer part of an s3gen.safetensors, lacking ``_mel_filters`` like some real files."""
    from safetensors.torch import save_file

    path = module_tmp_path_factory.mktemp("s3gen") / "s3gen.safetensors"
    state = {f"tokenizer.{k}": v.contiguous() for k, v in reference.state_dict().items() if k != "_mel_filters"}
    state["flow.input_embedding.weight"] = torch.zeros(4, 4)  # other S3Gen keys are ignored
    save_file(state, str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer(s3gen_file):
    return S3TokenizerV2.from_state_dict(read_state_dict(s3gen_file), prefix="tokenizer.", source=str(s3gen_file))


def test_keys_and_shapes_match_reference(reference):
    expected = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert S3TokenizerV2.checkpoint_shapes() == expected


def test_absent_buffers_are_recomputed_exactly(tokenizer, reference):
    assert torch.equal(tokenizer._mel_filters, reference._mel_filters)
    assert torch.equal(tokenizer.window, reference.window)


def test_default_attention_norm_eps_matches_installed_s3tokenizer(reference, tokenizer):
    assert tokenizer.encoder.blocks[0].attn_ln.eps == reference.encoder.blocks[0].attn_ln.eps == 1e-5


@pytest.mark.fullsize
def test_log_mel_matches_reference(tokenizer, reference, signals):
    for name, wav in signals.items():
        expected = reference.log_mel_spectrogram(torch.from_numpy(wav))
        got = tokenizer.log_mel(torch.from_numpy(wav))
        assert got.shape == expected.shape == (128, len(wav) // 160), name
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6, msg=name)


@pytest.mark.fullsize
def test_tokens_and_fsq_values_match_reference(tokenizer, reference, signals):
    for name, wav in signals.items():
        if name == "sample-01.mp3":
            continue  # the first part of sample-01-02.flac
        expected, expected_lens = reference.forward([wav])
        mel = tokenizer.log_mel(torch.from_numpy(wav))[None]
        lens = torch.tensor([mel.shape[-1]])
        with torch.inference_mode():
            ref_values = _reference_fsq_values(reference, mel, lens)
            values, got_lens = tokenizer.fsq_values(mel, lens)
        assert (values - ref_values).abs().max().item() <= 1e-4, name
        assert torch.equal(got_lens, expected_lens), name
        _assert_tokens_match(tokenizer.tokens_from_fsq_values(values, got_lens), expected, ref_values, name)


@pytest.mark.fullsize
@pytest.mark.parametrize("seconds,max_len", [(6, 150), (15, 375)])
def test_prompt_cap_matches_reference(tokenizer, reference, signals, seconds, max_len):
    speech = np.concatenate([signals["sample-01-02.flac"], signals["sample-01.mp3"]])[: seconds * 16000]
    expected, expected_lens = reference.forward([speech], max_len=max_len)
    got, got_lens = tokenizer.tokenize(speech, max_len=max_len)
    assert got_lens.tolist() == expected_lens.tolist() == [max_len]
    assert (got != expected).float().mean().item() <= 0.01  # boundary flips only


@pytest.mark.fullsize
def test_batch_with_lengths_equals_single_items(tokenizer, signals):
    wavs = [signals["sample-02.mp3"], signals["tone"], signals["noise"][:20000]]
    tokens, lens = tokenizer.tokenize(wavs)
    for i, wav in enumerate(wavs):
        single, single_len = tokenizer.tokenize(wav)
        assert lens[i] == single_len[0]
        assert torch.equal(tokens[i, : lens[i]], single[0])
        assert not tokens[i, lens[i]:].any()


# ---- small configurations: long-audio windowing and the eps switch ---------------------------

TINY = S3TokenizerConfig(width=256, heads=4, layers=1)


def _tiny_reference(attn_ln_eps: float = 1e-5):
    from s3tokenizer.model_v2 import ModelConfig
    from s3tokenizer.model_v2 import S3TokenizerV2 as ReferenceV2

    torch.manual_seed(3)
    model = ReferenceV2("speech_tokenizer_v2_25hz", ModelConfig(n_audio_state=256, n_audio_head=4, n_audio_layer=1))
    for block in model.encoder.blocks:
        block.attn_ln.eps = attn_ln_eps
    _perturb_norms_and_biases(model.eval(), seed=4)
    return model


def _random_mels(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    mel = torch.zeros(len(lengths), 128, max(lengths))
    for i, n in enumerate(lengths):
        mel[i, :, :n] = torch.rand(128, n, generator=gen) * 2 - 0.5
    return mel, torch.tensor(lengths)


def test_audio_over_30_seconds_is_windowed_like_reference(oracle):
    reference = _tiny_reference()
    ours = S3TokenizerV2.from_state_dict(reference.state_dict(), config=TINY)  # no mel buffers in this state
    mel, lens = _random_mels([7001, 900, 3000])
    expected, expected_lens = reference.quantize(mel, lens)
    got, got_lens = ours(mel, lens)
    assert got_lens.tolist() == expected_lens.tolist() == [1751, 225, 750]
    for i, n in enumerate(got_lens.tolist()):
        assert (got[i, :n] != expected[i, :n]).float().mean().item() <= 0.01


def test_attention_norm_eps_is_configurable(oracle):
    reference = _tiny_reference(attn_ln_eps=1e-6)
    ours = S3TokenizerV2.from_state_dict(reference.state_dict(), config=replace(TINY, attn_ln_eps=1e-6))
    mel, lens = _random_mels([400])
    with torch.inference_mode():
        values, _ = ours.fsq_values(mel, lens)
        torch.testing.assert_close(values, _reference_fsq_values(reference, mel, lens), rtol=0, atol=1e-5)
