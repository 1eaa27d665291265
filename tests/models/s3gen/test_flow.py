"""The token->mel flow on tiny configs: batching, noise layout, quirks, loading, reference parity."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from chorus.models.checkpoint import CheckpointMismatchError
from chorus.models.s3gen import FlowConfig, FlowDecoder
from tests.models.s3gen.oracle_s3gen import (
    TOLERANCE,
    build_oracle_flow,
    oracle_ref_dict,
    recorded_randn,
    tiny_flow_config,
    torch_threads,
)


@pytest.fixture(autouse=True)
def _single_thread():
    with torch_threads(1):
        yield


def _random_flow(config: FlowConfig, seed: int = 0) -> FlowDecoder:
    torch.manual_seed(seed)
    flow = FlowDecoder(config).eval()
    with torch.no_grad():
        for p in flow.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return flow


@dataclass
class Item:
    tokens: torch.Tensor  # [N]
    prompt_tokens: torch.Tensor  # [Tp]
    prompt_mel: torch.Tensor  # [Tm, 80]
    xvector: torch.Tensor  # [192]


def _item(new: int, prompt: int, prompt_mel: int, seed: int) -> Item:
    g = torch.Generator().manual_seed(seed)
    return Item(torch.randint(0, 6561, (new,), generator=g), torch.randint(0, 6561, (prompt,), generator=g),
                torch.randn(prompt_mel, 80, generator=g) - 4, torch.randn(192, generator=g))


def _pad(rows: list[torch.Tensor], fill: float = 0) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(r) for r in rows])
    out = torch.full((len(rows), int(lengths.max()), *rows[0].shape[1:]), fill, dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, lengths


def _run(flow: FlowDecoder, items: list[Item], noise, **kwargs):
    tokens, token_lengths = _pad([it.tokens for it in items], fill=6560)
    prompt, prompt_lengths = _pad([it.prompt_tokens for it in items], fill=6560)
    mel, mel_lengths = _pad([it.prompt_mel for it in items], fill=7.0)
    xvector = torch.stack([it.xvector for it in items])
    return flow.inference(tokens, token_lengths, prompt, prompt_lengths, mel, mel_lengths, xvector,
                          noise=noise, **kwargs)


# new tokens, prompt tokens, prompt mel frames (the third has an odd prompt mel: 2*8+1)
BATCH = [(7, 12, 24), (3, 5, 10), (9, 8, 17), (5, 15, 30)]


@pytest.mark.parametrize("meanflow", [False, True], ids=["standard", "meanflow"])
def test_batch_of_four_matches_each_item_alone(meanflow):
    flow = _random_flow(tiny_flow_config(meanflow))
    items = [_item(*shape, seed=i) for i, shape in enumerate(BATCH)]
    steps = 3 if not meanflow else 2
    mel, lengths = _run(flow, items, [torch.Generator().manual_seed(100 + i) for i in range(4)], n_steps=steps)
    for i, item in enumerate(items):
        alone, alone_length = _run(flow, [item], torch.Generator().manual_seed(100 + i), n_steps=steps)
        n = int(alone_length)
        assert int(lengths[i]) == n
        assert (mel[i, :, :n] - alone[0]).abs().max() <= TOLERANCE
        assert not mel[i, :, n:].any()


def test_output_has_two_frames_per_new_token():
    flow = _random_flow(tiny_flow_config())
    mel, lengths = _run(flow, [_item(6, 10, 20, seed=0)], torch.Generator().manual_seed(0), n_steps=1)
    assert mel.shape == (1, 80, 12) and lengths.tolist() == [12]


def test_odd_prompt_mel_loses_the_first_new_frame():
    flow = _random_flow(tiny_flow_config())
    mel, lengths = _run(flow, [_item(6, 10, 21, seed=0)], torch.Generator().manual_seed(0), n_steps=1)
    assert lengths.tolist() == [11]


def test_explicit_noise_reproduces_generator_draws_in_reference_order():
    flow = _random_flow(tiny_flow_config(meanflow=True))
    item = _item(5, 6, 12, seed=0)
    from_generator, _ = _run(flow, [item], torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    new_part = torch.randn(1, 80, 10, generator=g)  # drawn first: the new tokens' frames
    full = torch.randn(1, 80, 22, generator=g)  # then the whole length; its first 2*Tp frames stay
    explicit, _ = _run(flow, [item], full, generated_noise=new_part)
    assert torch.equal(from_generator, explicit)
    spliced, _ = _run(flow, [item], torch.cat([full[:, :, :12], new_part], dim=2))
    assert torch.equal(from_generator, spliced)


def test_a_single_voice_is_shared_across_the_batch():
    flow = _random_flow(tiny_flow_config())
    voice = _item(4, 6, 12, seed=0)
    items = [Item(_item(n, 1, 2, seed=n).tokens, voice.prompt_tokens, voice.prompt_mel, voice.xvector)
             for n in (4, 7)]
    noise = torch.randn(2, 80, 26)
    expected, _ = _run(flow, items, noise, n_steps=2)
    tokens, token_lengths = _pad([it.tokens for it in items])
    shared, _ = flow.inference(tokens, token_lengths, voice.prompt_tokens[None], torch.tensor([6]),
                               voice.prompt_mel[None], torch.tensor([12]), voice.xvector[None],
                               noise=noise, n_steps=2)
    assert torch.equal(expected, shared)


def test_rejects_token_ids_outside_the_vocabulary():
    flow = _random_flow(tiny_flow_config())
    item = _item(4, 6, 12, seed=0)
    item.tokens[2] = 6561
    with pytest.raises(ValueError, match="outside"):
        _run(flow, [item], torch.Generator())


def test_from_state_dict_reports_every_mismatch():
    config = tiny_flow_config()
    state = FlowDecoder(config).state_dict()
    state.pop("encoder_proj.bias")
    state["encoder.after_norm.weight"] = torch.zeros(3)
    state["decoder.estimator.time_embed_mixer.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointMismatchError) as error:
        FlowDecoder.from_state_dict(config, state)
    message = str(error.value)
    for key in ("encoder_proj.bias", "encoder.after_norm.weight", "time_embed_mixer.weight"):
        assert key in message


def test_from_state_dict_takes_the_flow_part_of_an_s3gen_file():
    config = tiny_flow_config()
    flow = _random_flow(config)
    s3gen_state = {f"flow.{k}": v for k, v in flow.state_dict().items()}
    s3gen_state["mel2wav.conv_pre.bias"] = torch.zeros(512)
    loaded = FlowDecoder.from_state_dict(config, s3gen_state, prefix="flow.", dtype=torch.float64)
    assert loaded.dtype == torch.float64
    for key, value in flow.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value.double())


@pytest.mark.oracle
@pytest.mark.parametrize(("meanflow", "prompt_mel", "cfg_rate"),
                         [(False, 20, 0.7), (False, 21, 0.7), (False, 20, 0.0), (True, 20, None)],
                         ids=["standard", "standard-odd-prompt-mel", "standard-without-cfg", "meanflow"])
def test_tiny_flow_matches_reference(oracle, meanflow, prompt_mel, cfg_rate):
    config = tiny_flow_config(meanflow)
    reference = build_oracle_flow(config)
    ours = FlowDecoder.from_state_dict(config, reference.state_dict())
    if cfg_rate is not None:
        reference.decoder.inference_cfg_rate = cfg_rate
    item = _item(7, 10, prompt_mel, seed=3)
    tokens, prompt = item.tokens[None], item.prompt_tokens[None]
    steps = 2 if meanflow else 4
    with recorded_randn() as draws:
        torch.manual_seed(11)
        new_noise = torch.randn(1, 80, 2 * 7) if meanflow else None  # as S3Token2Wav.flow_inference
        expected, _ = reference.inference(
            token=tokens.clone(), token_len=torch.tensor([7]), finalize=True, n_timesteps=steps,
            noised_mels=new_noise, meanflow=meanflow,
            **oracle_ref_dict(prompt, item.prompt_mel[None], item.xvector[None]))
    assert len(draws) == (2 if meanflow else 1)
    actual, lengths = _run(ours, [item], torch.Generator().manual_seed(11), n_steps=steps, cfg_rate=cfg_rate)
    assert actual.shape == expected.shape and lengths.tolist() == [expected.shape[2]]
    assert (actual - expected).abs().max() <= TOLERANCE
