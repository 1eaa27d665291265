"""The flow estimator's fused ops: the causal blocks' LayerNorm + Mish + mask (+ add) and the
transformer blocks' residual add + LayerNorm, each Triton kernel (under the interpreter on the CPU)
against its PyTorch reference; the regrouped transformer blocks; a tiny estimator with and
without the kernels; on a GPU, bf16 rounding and a full-size bf16 estimator."""
from __future__ import annotations

import os

import pytest
import torch

from chorus.models.s3gen.estimator import (
    CausalBlock, ConditionalDecoder, EstimatorConfig, TransformerBlock, run_transformer_blocks,
)
from chorus.models.s3gen.fused_ops import (
    add_layer_norm, norm_mish_mask, norm_mish_mask_reference, triton_available,
)
from chorus.models.t3.fused_ops import add_layer_norm_reference
from tests.models.s3gen.oracle_s3gen import torch_threads

needs_triton = pytest.mark.skipif(
    not triton_available() or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs Triton (and TRITON_INTERPRET=1 without a GPU, set by tests/conftest.py)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5
# fp32: the kernels differ from the references only in the norm statistics' summation order and
# Mish's closed form, a few fp32 ulps
FP32_TOLERANCE = dict(rtol=1e-5, atol=1e-5)
# bf16 against an fp32 reference of the same bf16 inputs: the relative (L2) error of the
# reference's own bf16 result is about 2e-3 (three roundings of 2^-9 each). The kernel rounds at
# the same steps; under the interpreter, which narrows fp32 to bf16 by truncation instead of to
# nearest, its error is about 2.5x the reference's (measured); compiled for a GPU, which rounds to
# nearest, it should be the reference's (not yet run on one).
BF16_MAX_RELATIVE_ERROR = 1e-2
BF16_ERROR_MARGIN = 1.25 if torch.cuda.is_available() else 3.0
TINY = EstimatorConfig(channels=32, heads=2, head_dim=16, blocks_per_level=2, mid_levels=1)


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


def _randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEVICE, dtype)


def _frame_mask(batch: int, length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[B, 1, T]`` of ones over each item's frames: item b has ``T - 11 b`` (at least 1), so
    every item but the first ends in padded frames."""
    counts = torch.tensor([max(1, length - 11 * b) for b in range(batch)])
    return (torch.arange(length) < counts[:, None]).unsqueeze(1).to(DEVICE, dtype)


def _block_tail(batch: int, channels: int, length: int, seed: int, dtype: torch.dtype = torch.float32):
    """A causal block's conv output h ``[B, C, T]`` (an offset per frame, which the norm takes
    out), a LayerNorm's weight and bias ``[C]`` away from 1 and 0, and the frame mask."""
    h = _randn(batch, channels, length, seed=seed, scale=2.0) + _randn(batch, 1, length, seed=seed + 1)
    weight = 1.0 + _randn(channels, seed=seed + 2, scale=0.3)
    bias = _randn(channels, seed=seed + 3, scale=0.2)
    return h.to(dtype), weight.to(dtype), bias.to(dtype), _frame_mask(batch, length, dtype)


def _addend(kind: str, batch: int, channels: int, length: int, seed: int,
            dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """None, a time term ``[B, C, 1]`` (read with stride 0 over T) or a residual ``[B, C, T]``."""
    if kind == "none":
        return None
    return _randn(batch, channels, 1 if kind == "time_term" else length, seed=seed, dtype=dtype)


def _relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return ((got.double() - exact.double()).norm() / exact.double().norm()).item()


# ------------------------------------------------------------------ LayerNorm + Mish + mask
@needs_triton
@pytest.mark.parametrize("addend_kind", ["none", "time_term", "residual"])
def test_the_norm_mish_mask_kernel_matches_the_reference_in_fp32(addend_kind):
    # 24 channels (the kernel pads them to 32) and 45 frames: a whole block of 32 and a partial one
    h, weight, bias, mask = _block_tail(3, 24, 45, seed=0)
    addend = _addend(addend_kind, 3, 24, 45, seed=9)
    got = norm_mish_mask(h, weight, bias, EPS, mask, addend, backend="triton")
    want = norm_mish_mask_reference(h, weight, bias, EPS, mask, addend)
    torch.testing.assert_close(got, want, **FP32_TOLERANCE)
    assert got.stride() == want.stride(), "the kernel gives the reference's channels-last layout"


@needs_triton
@pytest.mark.parametrize("addend_kind", ["none", "time_term"])
def test_the_norm_mish_mask_kernel_leaves_padded_frames_zero_or_the_addend(addend_kind):
    h, weight, bias, mask = _block_tail(3, 8, 30, seed=1)
    addend = _addend(addend_kind, 3, 8, 30, seed=2)
    got = norm_mish_mask(h, weight, bias, EPS, mask, addend, backend="triton")
    padded = mask.expand_as(got) == 0
    assert padded.any() and (~padded).any()
    expected = torch.zeros_like(got) if addend is None else addend.expand_as(got)
    assert torch.equal(got[padded], expected[padded])
    assert got[~padded].ne(0).all()


@needs_triton
def test_the_norm_mish_mask_kernel_reads_strided_inputs():
    """h in channels-last memory (as a causal block's input arrives), the mask a slice of a wider
    one, the addend an expanded ``[B, C, 1]`` view (stride 0 over T)."""
    h, weight, bias, _ = _block_tail(2, 16, 37, seed=3)
    h = h.transpose(1, 2).contiguous().transpose(1, 2)
    mask = _frame_mask(2, 50)[:, :, 5:42]
    addend = _randn(2, 16, 1, seed=4).expand(-1, -1, 37)
    assert h.stride(1) == 1 and addend.stride(2) == 0 and not mask.is_contiguous()
    got = norm_mish_mask(h, weight, bias, EPS, mask, addend, backend="triton")
    torch.testing.assert_close(got, norm_mish_mask_reference(h, weight, bias, EPS, mask, addend), **FP32_TOLERANCE)


@needs_triton
def test_the_kernels_mish_holds_at_large_and_very_negative_values():
    """Norm outputs out to +-100 (the bias moves them): Mish's closed form neither overflows where
    e^x does (x is returned past 20) nor loses the small values on the left (relative 1e-5 down to
    about 1e-12, where x e^x leaves fp32's normal range)."""
    h, _, _, mask = _block_tail(2, 8, 12, seed=5)
    weight = torch.full((8,), 0.5, device=DEVICE)
    bias = torch.tensor([-100.0, -40.0, -15.0, -1.2, 0.0, 15.0, 40.0, 100.0], device=DEVICE)
    got = norm_mish_mask(h, weight, bias, EPS, mask, None, backend="triton")
    want = norm_mish_mask_reference(h, weight, bias, EPS, mask, None)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-12)


@needs_triton
@pytest.mark.parametrize("addend_kind", ["none", "residual"])
def test_the_norm_mish_mask_kernel_in_bf16_is_as_close_to_fp32_as_the_reference(addend_kind):
    h, weight, bias, mask = _block_tail(3, 24, 45, seed=6, dtype=torch.bfloat16)
    addend = _addend(addend_kind, 3, 24, 45, seed=7, dtype=torch.bfloat16)
    exact = norm_mish_mask_reference(h.float(), weight.float(), bias.float(), EPS, mask.float(),
                                     None if addend is None else addend.float())
    got = norm_mish_mask(h, weight, bias, EPS, mask, addend, backend="triton")
    plain = norm_mish_mask_reference(h, weight, bias, EPS, mask, addend)
    assert got.dtype == torch.bfloat16
    assert _relative_error(got, exact) <= BF16_MAX_RELATIVE_ERROR
    assert _relative_error(got, exact) <= BF16_ERROR_MARGIN * _relative_error(plain, exact)


# ------------------------------------------------------------------ residual add + LayerNorm
@needs_triton
@pytest.mark.parametrize("layout", ["contiguous", "channels_first"])
def test_add_layer_norm_over_frames_matches_the_reference_in_fp32(layout):
    """``[B, T, C]`` with T odd and C not a power of two; ``channels_first``: x a transposed view
    of ``[B, C, T]`` memory (channel stride T), which the kernel's rows need copied."""
    x = _randn(2, 7, 24, seed=10)
    if layout == "channels_first":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    delta, weight, bias = _randn(2, 7, 24, seed=11), 1.0 + _randn(24, seed=12, scale=0.3), _randn(24, seed=13)
    residual, normed = add_layer_norm(x, delta, weight, bias, EPS, backend="triton")
    want_residual, want_normed = add_layer_norm_reference(x, delta, weight, bias, EPS)
    assert residual.shape == normed.shape == x.shape and residual.is_contiguous() and normed.is_contiguous()
    assert torch.equal(residual, want_residual)
    torch.testing.assert_close(normed, want_normed, **FP32_TOLERANCE)


@needs_triton
def test_add_layer_norm_over_frames_in_bf16_is_as_close_to_fp32_as_the_reference():
    x, delta = _randn(3, 9, 32, seed=14, dtype=torch.bfloat16), _randn(3, 9, 32, seed=15, dtype=torch.bfloat16)
    weight = (1.0 + _randn(32, seed=16, scale=0.3)).bfloat16()
    bias = _randn(32, seed=17, dtype=torch.bfloat16)
    exact = add_layer_norm_reference(x.float(), delta.float(), weight.float(), bias.float(), EPS)
    plain = add_layer_norm_reference(x, delta, weight, bias, EPS)
    got = add_layer_norm(x, delta, weight, bias, EPS, backend="triton")
    for got_part, plain_part, exact_part in zip(got, plain, exact):
        assert got_part.dtype == torch.bfloat16
        assert _relative_error(got_part, exact_part) <= BF16_MAX_RELATIVE_ERROR
        assert _relative_error(got_part, exact_part) <= BF16_ERROR_MARGIN * _relative_error(plain_part, exact_part)


# ------------------------------------------------------------------ the estimator's blocks
def _perturbed(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``module`` with every parameter moved (LayerNorms away from weight 1 and bias 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return module.eval()


def _estimator_inputs(batch: int, frames: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x, mu, cond = torch.randn(3, batch, 80, frames, generator=g).unbind(0)
    spks = torch.randn(batch, 80, generator=g)
    mask = _frame_mask(batch, frames, torch.bool).cpu()[:, 0]
    t = torch.rand(batch, generator=g)
    return x, mask, mu, t, spks, cond


def test_the_regrouped_transformer_blocks_are_the_blocks_in_turn_bit_for_bit():
    torch.manual_seed(0)
    blocks = [_perturbed(TransformerBlock(TINY), seed) for seed in range(3)]
    x = _randn(2, 11, TINY.channels, seed=20).cpu()
    key_mask = _frame_mask(2, 11, torch.bool).cpu()[:, None]
    with torch.no_grad():
        want = x
        for block in blocks:
            want = block(want, key_mask)
        got = run_transformer_blocks(blocks, x, key_mask)
    assert torch.equal(got, want)


def test_the_estimator_runs_the_plain_ops_by_default():
    estimator = ConditionalDecoder(TINY)
    assert estimator.ops_backend == "torch"
    assert {m.ops_backend for m in estimator.modules() if isinstance(m, (CausalBlock, TransformerBlock))} == {"torch"}


def test_the_flow_ops_backend_reaches_every_block_and_rejects_unknown_names():
    estimator = ConditionalDecoder(TINY, meanflow=True)
    keys = set(estimator.state_dict())
    estimator.ops_backend = "auto"
    blocks = [m for m in estimator.modules() if isinstance(m, (CausalBlock, TransformerBlock))]
    # 3 levels of 2 causal blocks and 2 transformer blocks, and the final causal block
    assert len(blocks) == 13 and {m.ops_backend for m in blocks} == {"auto"}
    assert set(estimator.state_dict()) == keys
    with pytest.raises(ValueError, match=r"flow ops backend must be one of \('auto', 'triton', 'torch'\), got 'cuda'"):
        estimator.ops_backend = "cuda"
    assert estimator.ops_backend == "auto"


@needs_triton
def test_a_tiny_estimator_gives_the_same_velocity_with_the_kernels():
    torch.manual_seed(0)
    estimator = _perturbed(ConditionalDecoder(TINY), seed=21).to(DEVICE)
    x, mask, mu, t, spks, cond = (v.to(DEVICE) for v in _estimator_inputs(2, 19, seed=22))
    with torch.inference_mode():
        estimator.ops_backend = "torch"
        want = estimator(x, mask, mu, t, spks, cond)
        estimator.ops_backend = "triton"
        got = estimator(x, mask, mu, t, spks, cond)
    torch.testing.assert_close(got, want, **FP32_TOLERANCE)
    assert not got[~mask[:, None, :].expand_as(got)].any()


# ------------------------------------------------------------------ on a GPU
@pytest.mark.gpu  # the interpreter narrows fp32 to bf16 by truncation; a GPU rounds to nearest
def test_the_kernels_round_where_the_bf16_references_round():
    """Compiled, the kernels round at the references' steps to nearest, as the plain ops do: only
    the norm statistics' summation order and Mish's fp32 arithmetic can move a rounding, which
    almost never happens; the residual sum is the plain sum bit for bit."""
    h, weight, bias, mask = _block_tail(4, 256, 300, seed=30, dtype=torch.bfloat16)
    addend = _addend("residual", 4, 256, 300, seed=31, dtype=torch.bfloat16)
    got = norm_mish_mask(h, weight, bias, EPS, mask, addend, backend="triton")
    assert (got != norm_mish_mask_reference(h, weight, bias, EPS, mask, addend)).float().mean() < 0.01
    x, delta = h.transpose(1, 2), addend.transpose(1, 2).contiguous()
    residual, normed = add_layer_norm(x, delta, weight, bias, EPS, backend="triton")
    want_residual, want_normed = add_layer_norm_reference(x, delta, weight, bias, EPS)
    assert torch.equal(residual, want_residual)
    assert (normed != want_normed).float().mean() < 0.01


@pytest.mark.gpu
def test_a_full_size_bf16_estimator_with_the_kernels_is_as_close_to_fp32_as_without():
    """Full-size turbo estimator (random weights): with ``"auto"`` in bf16 against an fp32
    reference without TF32 it is at least as close as the plain ops' bf16 velocity, less 0.5 dB
    (random weights amplify a moved rounding); the fused fp32 velocity is the plain fp32 one to
    within fp32's rounding; padded frames stay zero."""
    from chorus.vocoder.quality import snr_db
    from tests.vocoder.models import random_s3gen

    fp32 = random_s3gen("turbo", tiny=False, seed=3, device="cuda").flow.decoder.estimator
    bf16 = random_s3gen("turbo", tiny=False, seed=3, dtype=torch.bfloat16, device="cuda").flow.decoder.estimator
    x, mask, mu, t, spks, cond = (v.cuda() for v in _estimator_inputs(4, 300, seed=32))
    r = (t + 0.3).clamp(max=1.0)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    velocity = {}
    try:
        with torch.inference_mode():
            for name, model in (("fp32", fp32), ("bf16", bf16)):
                inputs = [v.to(model.final_proj.weight.dtype) for v in (x, mu, spks, cond)]
                for backend in ("torch", "auto"):
                    model.ops_backend = backend
                    xi, mui, spksi, condi = inputs
                    velocity[name, backend] = model(xi, mask, mui, t, spksi, condi, r=r).float().cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    valid = mask.cpu()[:, None, :].expand_as(velocity["fp32", "torch"])
    want = velocity["fp32", "torch"][valid]
    assert snr_db(want, velocity["fp32", "auto"][valid]) >= 60.0
    assert snr_db(want, velocity["bf16", "auto"][valid]) >= snr_db(want, velocity["bf16", "torch"][valid]) - 0.5
    assert not velocity["bf16", "auto"][~valid].any()
