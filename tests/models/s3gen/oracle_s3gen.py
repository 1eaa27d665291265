"""Reference S3Gen as a test oracle: build it (full size or shrunk) with random weights that all
matter, save it in the official file layout, and run its flow with pinned noise.

Shrinking never edits the reference: the constructor names that ``chatterbox.models.s3gen.s3gen``
calls are replaced, for the duration of a build, by factories that override their arguments.
The reference hard-codes the encoder width (512), its 4 up-layers (trimmed after construction
here), the mel size (80), S3Tokenizer and CAMPPlus.

``chatterbox`` is imported lazily so that collecting tests works without the oracle installed.
"""
from __future__ import annotations

import contextlib
import os
from unittest import mock

import torch
from safetensors.torch import load_file, save_file

from chorus.models.s3gen import EncoderConfig, EstimatorConfig, FlowConfig

TOLERANCE = 1e-4


def tiny_flow_config(meanflow: bool = False) -> FlowConfig:
    """A flow the reference can also build: encoder width stays 512, everything else shrinks."""
    return FlowConfig(
        meanflow=meanflow,
        encoder=EncoderConfig(num_layers=2, num_up_layers=1, ffn_width=64),
        estimator=EstimatorConfig(channels=32, heads=2, head_dim=16, blocks_per_level=1, mid_levels=2),
    )


@contextlib.contextmanager
def torch_threads(count: int):
    """Run with ``count`` intra-op threads. Tiny models run no faster on two, and on a busy
    machine two threads waiting on each other make every small op take milliseconds."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def oracle_encoder_kwargs(config: EncoderConfig) -> dict:
    """Arguments of the reference ``UpsampleConformerEncoder`` for a Chorus encoder config."""
    if config.width != 512 or config.lookahead != 3 or config.upsample != 2:
        raise ValueError("the reference fixes encoder width 512, lookahead 3 and upsample 2")
    return dict(output_size=config.width, attention_heads=config.heads,
                linear_units=config.ffn_width, num_blocks=config.num_layers)


def oracle_estimator_kwargs(config: EstimatorConfig, meanflow: bool) -> dict:
    """Arguments of the reference ``ConditionalDecoder`` for a Chorus estimator config."""
    if config.ffn_mult != 4:
        raise ValueError("the reference fixes the feed-forward multiplier at 4")
    return dict(in_channels=config.in_channels, out_channels=config.out_channels, channels=[config.channels],
                attention_head_dim=config.head_dim, n_blocks=config.blocks_per_level,
                num_mid_blocks=config.mid_levels, num_heads=config.heads, meanflow=meanflow)


def _trim_up_layers(encoder, count: int):
    if count > len(encoder.up_encoders):
        raise ValueError(f"the reference builds {len(encoder.up_encoders)} up-layers, asked for {count}")
    encoder.up_encoders = encoder.up_encoders[:count]
    return encoder


@contextlib.contextmanager
def shrunk_s3gen(flow: FlowConfig | None = None, hift_kwargs: dict | None = None,
                 f0_kwargs: dict | None = None):
    """While active, ``S3Token2Wav(...)`` builds its encoder/estimator from ``flow`` and its
    HiFT / F0 predictor with ``hift_kwargs`` / ``f0_kwargs`` overriding the reference's arguments."""
    import chatterbox.models.s3gen.s3gen as s3gen_module

    patches = []
    if flow is not None:
        make_encoder, make_estimator = s3gen_module.UpsampleConformerEncoder, s3gen_module.ConditionalDecoder

        def encoder_factory(**kwargs):
            kwargs.update(oracle_encoder_kwargs(flow.encoder))
            return _trim_up_layers(make_encoder(**kwargs), flow.encoder.num_up_layers)

        def estimator_factory(**kwargs):
            kwargs.update(oracle_estimator_kwargs(flow.estimator, kwargs.get("meanflow", False)))
            return make_estimator(**kwargs)

        patches += [mock.patch.object(s3gen_module, "UpsampleConformerEncoder", encoder_factory),
                    mock.patch.object(s3gen_module, "ConditionalDecoder", estimator_factory)]
    for name, overrides in (("HiFTGenerator", hift_kwargs), ("ConvRNNF0Predictor", f0_kwargs)):
        if overrides:
            def factory(*args, _make=getattr(s3gen_module, name), _overrides=overrides, **kwargs):
                return _make(*args, **{**kwargs, **_overrides})

            patches.append(mock.patch.object(s3gen_module, name, factory))
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


def _is_constant(tensor: torch.Tensor) -> bool:
    flat = tensor.reshape(-1)
    if flat.numel() > 1 and flat[0] != flat[1]:
        return False  # the usual case for random tensors; skips the full scan
    return bool((flat == flat[0]).all())


def _noise(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(tensor.shape, generator=generator, dtype=torch.float32).to(tensor.dtype)


def perturb_weights(module: torch.nn.Module, seed: int, scale: float = 0.1) -> None:
    """Make every weight matter: add seeded noise to constant-initialised tensors (norm scales
    and shifts, zero biases, BatchNorm statistics, Snake alphas) and to the meanflow time mixer,
    which starts as ``[I | 0]`` and so would ignore r."""
    generator = torch.Generator().manual_seed(seed)
    tensors = list(module.named_parameters())
    tensors += [(n, b) for n, b in module.named_buffers() if n.endswith(("running_mean", "running_var"))]
    with torch.no_grad():
        for name, tensor in tensors:
            if not tensor.is_floating_point() or tensor.numel() == 0:
                continue
            if name.endswith("time_embed_mixer.weight"):
                tensor.add_(_noise(tensor, generator) * tensor.shape[1] ** -0.5)
                continue
            if not _is_constant(tensor):
                continue  # already random
            noise = _noise(tensor, generator)
            if name.endswith("running_var"):
                tensor.mul_((noise * scale).exp())
            else:
                tensor.add_(noise * scale)


def build_oracle_s3gen(meanflow: bool = False, flow: FlowConfig | None = None, seed: int = 0,
                       hift_kwargs: dict | None = None, f0_kwargs: dict | None = None):
    """The reference ``S3Token2Wav`` (eval, fp32, CPU) with seeded random weights, perturbed.

    ``flow`` shrinks the flow (its ``meanflow`` must agree); None keeps the full size.
    """
    from chatterbox.models.s3gen.s3gen import S3Token2Wav

    if flow is not None and flow.meanflow != meanflow:
        raise ValueError("flow.meanflow and meanflow disagree")
    torch.manual_seed(seed)
    with shrunk_s3gen(flow, hift_kwargs, f0_kwargs):
        model = S3Token2Wav(meanflow=meanflow)
    perturb_weights(model, seed + 1)
    return model.eval()


def build_oracle_flow(config: FlowConfig, seed: int = 0):
    """Only the reference flow (``CausalMaskedDiffWithXvec``), without tokenizer, CAMPPlus and
    HiFT: quicker for shrunk configs. Its ``state_dict`` is the ``flow.*`` part, unprefixed."""
    from chatterbox.models.s3gen.configs import CFM_PARAMS
    from chatterbox.models.s3gen.decoder import ConditionalDecoder
    from chatterbox.models.s3gen.flow import CausalMaskedDiffWithXvec
    from chatterbox.models.s3gen.flow_matching import CausalConditionalCFM
    from chatterbox.models.s3gen.transformer.upsample_encoder import UpsampleConformerEncoder

    torch.manual_seed(seed)
    encoder = UpsampleConformerEncoder(input_size=512, use_cnn_module=False, macaron_style=False,
                                       **oracle_encoder_kwargs(config.encoder))
    encoder = _trim_up_layers(encoder, config.encoder.num_up_layers)
    estimator = ConditionalDecoder(causal=True, dropout=0.0, act_fn="gelu",
                                   **oracle_estimator_kwargs(config.estimator, config.meanflow))
    decoder = CausalConditionalCFM(spk_emb_dim=80, cfm_params=CFM_PARAMS, estimator=estimator)
    model = CausalMaskedDiffWithXvec(encoder=encoder, decoder=decoder)
    perturb_weights(model, seed + 1)
    return model.eval()


def official_file_name(meanflow: bool) -> str:
    return "s3gen_meanflow.safetensors" if meanflow else "s3gen.safetensors"


def save_official(model: torch.nn.Module, directory: str, meanflow: bool) -> str:
    """Write ``model.state_dict()`` as the released checkpoint file would be named; returns the path."""
    path = os.path.join(directory, official_file_name(meanflow))
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, path)
    return path


def load_official(path: str) -> dict[str, torch.Tensor]:
    return load_file(path)


@contextlib.contextmanager
def recorded_randn():
    """Record every ``torch.randn`` / ``torch.randn_like`` draw made while active (in order)."""
    draws: list[torch.Tensor] = []
    randn, randn_like = torch.randn, torch.randn_like

    def recording_randn(*args, **kwargs):
        out = randn(*args, **kwargs)
        draws.append(out.clone())
        return out

    def recording_randn_like(*args, **kwargs):
        out = randn_like(*args, **kwargs)
        draws.append(out.clone())
        return out

    with mock.patch.object(torch, "randn", recording_randn), \
            mock.patch.object(torch, "randn_like", recording_randn_like):
        yield draws


def oracle_ref_dict(prompt_tokens: torch.Tensor, prompt_mel: torch.Tensor, xvector: torch.Tensor) -> dict:
    """A fresh reference conditioning dict for one item (the reference mutates it in place)."""
    return dict(
        prompt_token=prompt_tokens.clone(),
        prompt_token_len=torch.tensor([prompt_tokens.shape[1]]),
        prompt_feat=prompt_mel.clone(),
        prompt_feat_len=None,
        embedding=xvector.clone(),
    )
