"""HiFT's fused Snake: the Triton kernel (under the interpreter on the CPU) against its PyTorch
reference, the masked residual, and a whole tiny HiFT decode with and without the kernel; bf16
rounding and a full-size bf16 decode on a GPU."""
from __future__ import annotations

import os

import pytest
import torch

from chorus.models.s3gen.fused_ops import (masked_residual, snake, snake_conv, snake_conv_reference, snake_reference,
                                          triton_available)
from chorus.models.s3gen.hift import Snake
from tests.vocoder.models import random_s3gen

needs_triton = pytest.mark.skipif(
    not triton_available() or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs Triton (and TRITON_INTERPRET=1 without a GPU, set by tests/conftest.py)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _activations(batch: int, channels: int, length: int, seed: int = 0, dtype=torch.float32):
    """x [B, C, L] (a few large values, where sin(alpha x) wraps), alpha [C] around 1, and a
    mask [B, 1, L] that cuts each item but the first a little shorter."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, length, generator=g) * 3
    alpha = 0.2 + torch.rand(channels, generator=g) * 2
    counts = torch.tensor([length - 5 * b for b in range(batch)]).clamp(min=1)
    mask = (torch.arange(length) < counts[:, None]).unsqueeze(1).float()
    return x.to(DEVICE, dtype), alpha.to(DEVICE, dtype), mask.to(DEVICE, dtype)


@needs_triton
@pytest.mark.parametrize("masked", [False, True])
def test_the_snake_kernel_matches_the_reference_in_fp32(masked):
    x, alpha, mask = _activations(3, 5, 1500)  # past one 1024-sample block
    mask = mask if masked else None
    got = snake(x, alpha, mask, backend="triton")
    torch.testing.assert_close(got, snake_reference(x, alpha, mask), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu  # the interpreter narrows fp32 to bf16 by truncation; a GPU rounds to nearest
def test_the_snake_kernel_rounds_where_the_bf16_reference_rounds():
    x, alpha, mask = _activations(2, 4, 700, seed=1, dtype=torch.bfloat16)
    got, want = snake(x, alpha, mask, backend="triton"), snake_reference(x, alpha, mask)
    assert got.dtype == torch.bfloat16
    # the two sines may differ in fp32's last bit, which moves a bf16 rounding once in a while:
    # never by more than one bf16 step of the value, and almost never at all
    step = want.float().abs().clamp(min=1e-30) * 2.0 ** -7
    differs = got != want
    assert ((got.float() - want.float()).abs() <= step).all()
    assert differs.float().mean() < 0.01


@needs_triton
def test_the_snake_kernel_leaves_masked_steps_zero():
    x, alpha, mask = _activations(3, 2, 40, seed=2)
    got = snake(x, alpha, mask, backend="triton")
    assert not got[mask.expand_as(got) == 0].any()
    assert got[mask.expand_as(got) == 1].any()


def test_the_masked_residual_is_the_residual_plus_the_masked_delta_bit_for_bit():
    x, _, mask = _activations(2, 3, 50, seed=3)
    delta = _activations(2, 3, 50, seed=4)[0]
    assert torch.equal(masked_residual(x, delta, mask), delta * mask + x)
    assert torch.equal(masked_residual(x, delta, None), x + delta)


def test_a_snake_module_runs_the_reference_on_the_cpu_by_default():
    module = Snake(4)
    x, _, mask = _activations(2, 4, 30, seed=4)
    x, mask = x.cpu(), mask.cpu()
    assert module.ops_backend == "auto"
    assert torch.equal(module(x, mask), snake_reference(x, module.alpha, mask))


def test_the_hift_ops_backend_reaches_every_snake_and_rejects_unknown_names():
    hift = random_s3gen("turbo").mel2wav
    hift.ops_backend = "torch"
    assert {m.ops_backend for m in hift.modules() if isinstance(m, Snake)} == {"torch"}
    with pytest.raises(ValueError, match="HiFT ops backend must be one of"):
        hift.ops_backend = "cuda"


def _conv_inputs(c_in: int, c_out: int, taps: int, seed: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(c_out, c_in, taps, generator=g) / (c_in * taps) ** 0.5
    bias = 0.1 * torch.randn(c_out, generator=g)
    return weight.to(DEVICE, dtype), bias.to(DEVICE, dtype)


@needs_triton
@pytest.mark.parametrize("c_in, c_out, taps, dilation", [(5, 3, 3, 1), (70, 66, 7, 3), (64, 64, 11, 5)])
@pytest.mark.parametrize("masked, with_residual", [(False, False), (True, False), (True, True)])
def test_the_snake_conv_kernel_matches_the_reference_in_fp32(c_in, c_out, taps, dilation, masked, with_residual):
    """Channel counts off the 64-wide tiles, lengths across two sample tiles (the GPU's 128 and the
    interpreter's 1024), every tap reaching into the zero padding at both ends."""
    x, alpha, mask = _activations(2, c_in, 1030, seed=c_in)
    weight, bias = _conv_inputs(c_in, c_out, taps, seed=taps)
    residual = _activations(2, c_out, 1030, seed=7)[0] * mask if with_residual else None
    mask = mask if masked else None
    padding = dilation * (taps - 1) // 2
    got = snake_conv(x, alpha, weight, bias, dilation, padding, mask, residual, backend="triton")
    want = snake_conv_reference(x, alpha, weight, bias, dilation, padding, mask, residual)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_triton
def test_the_snake_conv_kernel_sees_a_weight_changed_in_place():
    """The kernel's copy of the weight (laid out by taps) is made again once the weight moves."""
    x, alpha, _ = _activations(1, 4, 20, seed=8)
    weight, bias = _conv_inputs(4, 4, 3, seed=9)
    before = snake_conv(x, alpha, weight, bias, 1, 1, backend="triton")
    weight.mul_(2.0)
    after = snake_conv(x, alpha, weight, bias, 1, 1, backend="triton")
    torch.testing.assert_close(after, snake_conv_reference(x, alpha, weight, bias, 1, 1), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before, after)


@pytest.mark.gpu
def test_the_bf16_snake_conv_kernel_is_closer_to_fp32_than_the_bf16_reference():
    """In bf16 the kernel rounds once (Snake in fp32, fp32 sums, one store) where the plain ops
    round after every step, so against the fp32 reference its error is no larger than theirs
    and within 1% of the output's RMS (the stated bound, docs/vocoder.md)."""
    x, alpha, mask = _activations(4, 64, 3000, seed=11)
    weight, bias = _conv_inputs(64, 64, 11, seed=12)
    residual = _activations(4, 64, 3000, seed=13)[0] * mask
    want = snake_conv_reference(x, alpha, weight, bias, 5, 25, mask, residual)
    low = [t.bfloat16() for t in (x, alpha, weight, bias, mask, residual)]
    fused = snake_conv(*low[:4], 5, 25, *low[4:], backend="triton").float()
    plain = snake_conv_reference(*low[:4], 5, 25, *low[4:]).float()

    def rms(t):
        return t.pow(2).mean().sqrt().item()

    assert rms(fused - want) <= rms(plain - want)
    assert rms(fused - want) <= 0.01 * rms(want)


@needs_triton
def test_a_tiny_hift_decodes_the_same_audio_with_the_kernel():
    hift = random_s3gen("turbo", device=DEVICE).mel2wav
    g = torch.Generator().manual_seed(5)
    counts = torch.tensor([6, 4])  # few frames: the interpreter runs every program in Python
    mel = ((torch.randn(2, 80, 6, generator=g) - 4) * (torch.arange(6) < counts[:, None, None])).to(DEVICE)
    source = (0.1 * torch.randn(2, 6 * hift.config.samples_per_frame, generator=g)).to(DEVICE)
    counts = counts.to(DEVICE)
    with torch.inference_mode():
        hift.ops_backend = "torch"
        want = hift.decode(mel, source, counts)
        hift.ops_backend = "triton"
        got = hift.decode(mel, source, counts)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not got[1, 4 * hift.config.samples_per_frame:].any()


@pytest.mark.gpu
def test_a_full_size_bf16_decode_with_the_kernel_is_as_close_to_fp32_as_without():
    """Full-size turbo HiFT: the fused decode in bf16 against an fp32 reference without TF32 is at
    least as close as the plain ops' bf16 decode, less 0.5 dB (random weights amplify a moved
    rounding), and the fused fp32 decode is the plain fp32 one to within fp32's rounding."""
    from chorus.vocoder.quality import snr_db

    fp32 = random_s3gen("turbo", tiny=False, seed=3, device="cuda").mel2wav
    bf16 = random_s3gen("turbo", tiny=False, seed=3, dtype=torch.bfloat16, device="cuda").mel2wav
    g = torch.Generator().manual_seed(6)
    counts = torch.tensor([500 - 7 * (i % 3) for i in range(8)])
    mel = ((torch.randn(8, 80, 500, generator=g) - 4) * (torch.arange(500) < counts[:, None, None])).cuda()
    source = (0.1 * torch.randn(8, 500 * 480, generator=g)).cuda()
    counts = counts.cuda()
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.inference_mode():
            fp32.ops_backend = "torch"
            want = fp32.decode(mel, source, counts).cpu()
            fp32.ops_backend = "triton"
            fused_fp32 = fp32.decode(mel, source, counts).cpu()
            bf16.ops_backend = "torch"
            plain = bf16.decode(mel.bfloat16(), source, counts).cpu()
            bf16.ops_backend = "triton"
            fused = bf16.decode(mel.bfloat16(), source, counts).cpu()
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    valid = torch.arange(500 * 480) < 480 * counts.cpu()[:, None]
    assert snr_db(want[valid], fused_fp32[valid]) >= 60.0
    assert snr_db(want[valid], fused[valid]) >= snr_db(want[valid], plain[valid]) - 0.5
    assert not fused[~valid].any()
