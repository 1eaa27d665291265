"""Random-weight S3Gen models and voices for the vocoder-stage tests and measurements, and an
attention-free stand-in for the flow (:func:`local_flow`) that checks frame bookkeeping exactly.

Tiny models shrink the flow's encoder depth and estimator width and HiFT's channels; they are
built as plain modules, saved as state dicts and loaded back through the real loading code
(``FlowDecoder.from_state_dict``, ``HiFTGenerator.from_state_dict`` with its weight-norm folding).
Every weight matters: parameters are perturbed (norm scales and biases move off 1 and 0) and the
F0 read-out is scaled so most frames are voiced and the harmonic source counts.
"""
from __future__ import annotations

import torch

from chorus.models.s3gen.encoder import EncoderConfig
from chorus.models.s3gen.estimator import EstimatorConfig
from chorus.models.s3gen.f0_predictor import F0PredictorConfig
from chorus.models.s3gen.flow import FlowConfig, FlowDecoder
from chorus.models.s3gen.hift import HiFTConfig, HiFTGenerator
from chorus.models.s3gen.s3gen import S3Gen
from chorus.models.variants import get_variant
from chorus.voices import Voice

F0_READOUT_SCALE = 4000.0
TINY_HIFT = HiFTConfig(base_channels=32, f0=F0PredictorConfig(hidden_channels=32))


def tiny_flow_config(meanflow: bool) -> FlowConfig:
    return FlowConfig(
        meanflow=meanflow,
        encoder=EncoderConfig(width=64, heads=2, num_layers=2, num_up_layers=1, ffn_width=64),
        estimator=EstimatorConfig(channels=32, heads=2, head_dim=16, blocks_per_level=1, mid_levels=2),
    )


def _perturbed_state(module: torch.nn.Module, seed: int, scale: float = 0.05) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in module.state_dict().items()}


def random_s3gen(variant_name: str, *, tiny: bool = True, seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: str = "cpu") -> S3Gen:
    """A random-weight S3Gen of the variant (without the voice models)."""
    variant = get_variant(variant_name)
    meanflow = variant.s3gen.meanflow
    config = tiny_flow_config(meanflow) if tiny else FlowConfig(meanflow=meanflow, cfg_rate=variant.s3gen.cfg_rate)
    hift_config = TINY_HIFT if tiny else HiFTConfig()
    torch.manual_seed(seed)
    flow_state = _perturbed_state(FlowDecoder(config), seed + 1)
    hift_state = _perturbed_state(HiFTGenerator(hift_config), seed + 2)
    for key in ("f0_predictor.classifier.weight", "f0_predictor.classifier.bias"):
        hift_state[key] = hift_state[key] * F0_READOUT_SCALE
    flow = FlowDecoder.from_state_dict(config, flow_state, dtype=dtype, device=device)
    hift = HiFTGenerator.from_state_dict(hift_state, dtype=dtype, device=device, config=hift_config)
    return S3Gen(variant, flow, hift).eval()


def random_voice(prompt_tokens: int = 30, seed: int = 0, odd_mel: bool = False) -> Voice:
    """A voice with a random prompt (prompt mel ``2 Tp`` frames, or ``2 Tp - 1`` with ``odd_mel``)."""
    g = torch.Generator().manual_seed(seed)
    frames = 2 * prompt_tokens - (1 if odd_mel else 0)
    return Voice(
        speaker_embedding=torch.rand(1, 256, generator=g),
        t3_prompt_tokens=torch.randint(0, 6561, (1, 20), generator=g),
        s3gen_prompt_tokens=torch.randint(0, 6561, (1, prompt_tokens), generator=g),
        s3gen_prompt_mel=torch.randn(1, frames, 80, generator=g) - 5.0,
        xvector=torch.randn(1, 192, generator=g),
        name=f"voice-{seed}",
    )


def random_tokens(count: int, seed: int) -> list[int]:
    return torch.randint(0, 6561, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


def local_flow(s3gen: S3Gen):
    """A stand-in for ``FlowDecoder.generate_mel`` whose frame at flow column ``c`` depends only on
    the token there and the noise of that column (no attention): what a pass leaves out (earlier
    tokens, the start of the prompt) must then not change any frame HiFT reads, bitwise. The
    frames' values are a fixed random table per token plus a tenth of the noise."""
    table = torch.randn(6561, 2, 80, generator=torch.Generator().manual_seed(0)) * 0.5 - 5.0

    def generate_mel(tokens, lengths, cond, noise, speaker, n_steps, guidance):
        frames = table[tokens.cpu()].reshape(tokens.shape[0], -1, 80).transpose(1, 2)  # [B, 80, 2 L]
        return (frames.to(noise.device, noise.dtype) + 0.1 * noise).to(s3gen.dtype)

    return generate_mel
