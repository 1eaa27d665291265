"""The flow encoder's fused relative-position attention: the Triton kernel (under the interpreter
on the CPU) against its PyTorch reference, the encoder's backend switch; on a GPU, bf16 against
fp32 and a full-size encoder with the kernel against one without."""
from __future__ import annotations

import math
import os

import pytest
import torch

from chorus.models.s3gen.encoder import EncoderConfig, RelPositionAttention, UpsampleConformerEncoder
from chorus.models.s3gen.fused_ops import (
    rel_position_attention, rel_position_attention_reference, triton_available,
)
from chorus.vocoder.quality import snr_db
from tests.models.s3gen.oracle_s3gen import torch_threads

needs_triton = pytest.mark.skipif(
    not triton_available() or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs Triton (and TRITON_INTERPRET=1 without a GPU, set by tests/conftest.py)")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy, inside the interpreter
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32: the kernel sums the same products in another order (online softmax, tiles); the
# interpreter's fp32 dots are exact, so the outputs differ by a few ulps (measured: 3e-7 relative)
FP32_MAX_RELATIVE_ERROR = 2e-6
# tiles of 16 x 16 or 16 x 32 so small lengths span several tiles of queries and keys
SMALL_TILES = (16, 16)
# bf16 kernel against the fp32 reference of the same bf16 inputs: the kernel rounds the softmax
# weights (for the P V dot) and the output once each, about 2^-9 relative apiece
BF16_MAX_RELATIVE_ERROR = 1e-2
# a full-size bf16 encoder with the kernel against one with the plain ops: each is about 40 dB from
# fp32 on random weights (the plain ops, measured on the CPU), and two equally good bf16 paths are
# about that far apart; not yet run on a GPU
ENCODER_SNR_FLOOR_DB = 30.0


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


def _attention_inputs(batch: int, heads: int, length: int, head_dim: int, seed: int,
                      lengths: list[int] | None = None, dtype: torch.dtype = torch.float32):
    """q_content, q_position, k, v ``[B, H, T, D]`` laid out as the encoder's (views of
    ``[B, T, H, D]``), the table ``[1, H, 2T-1, D]`` and a key mask of right-padded items."""
    g = torch.Generator().manual_seed(seed)

    def heads_view(rows: int, lead: int = batch) -> torch.Tensor:
        return torch.randn(lead, rows, heads, head_dim, generator=g).to(DEVICE, dtype).transpose(1, 2)

    q_content, q_position, k, v = (heads_view(length) for _ in range(4))
    p = heads_view(2 * length - 1, lead=1)
    lengths = torch.tensor(lengths if lengths is not None else [length] * batch)
    key_mask = (torch.arange(length)[None, :] < lengths[:, None]).to(DEVICE)
    return q_content, q_position, k, v, p, key_mask, 1.0 / math.sqrt(head_dim)


def _relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return ((got.double() - exact.double()).norm() / exact.double().norm()).item()


def _kernel(*inputs, tile=SMALL_TILES):
    return rel_position_attention(*inputs, backend="triton", tile=tile)


# ------------------------------------------------------------------------------ the kernel
@needs_triton
def test_the_kernel_equals_the_reference_for_one_item():
    inputs = _attention_inputs(1, 2, 48, 64, seed=1)
    out = _kernel(*inputs)
    assert out.shape == (1, 48, 128) and out.is_contiguous()
    assert _relative_error(out, rel_position_attention_reference(*inputs)) < FP32_MAX_RELATIVE_ERROR


@needs_triton
def test_the_kernel_leaves_out_the_padded_keys_of_a_batch():
    inputs = _attention_inputs(3, 2, 40, 32, seed=2, lengths=[40, 29, 5])
    out = _kernel(*inputs)
    assert _relative_error(out, rel_position_attention_reference(*inputs)) < FP32_MAX_RELATIVE_ERROR
    # the short item alone, unpadded, gives its valid rows the same values
    alone = [t[2:3, :, :5] for t in inputs[:4]] + [inputs[4][:, :, 35:44], inputs[5][2:3, :5], inputs[6]]
    assert _relative_error(out[2:3, :5], _kernel(*alone)) < FP32_MAX_RELATIVE_ERROR


@needs_triton
def test_the_kernel_leaves_out_masked_keys_anywhere_in_the_sequence():
    q_content, q_position, k, v, p, key_mask, scale = _attention_inputs(2, 2, 33, 16, seed=3)
    key_mask[0, ::3] = False
    key_mask[1, 10:20] = False
    inputs = (q_content, q_position, k, v, p, key_mask, scale)
    assert _relative_error(_kernel(*inputs), rel_position_attention_reference(*inputs)) < FP32_MAX_RELATIVE_ERROR


@needs_triton
@pytest.mark.parametrize("length", [1, 37, 130])
def test_the_kernel_handles_lengths_that_are_no_multiple_of_its_tiles(length):
    inputs = _attention_inputs(2, 2, length, 16, seed=length, lengths=[length, max(1, length - 9)])
    out = _kernel(*inputs, tile=(16, 32) if length > 100 else SMALL_TILES)
    assert _relative_error(out, rel_position_attention_reference(*inputs)) < FP32_MAX_RELATIVE_ERROR


@needs_triton
def test_the_kernel_refuses_a_head_dim_it_cannot_tile():
    inputs = _attention_inputs(1, 2, 8, 24, seed=4)
    with pytest.raises(AssertionError, match="needs a head dim that is a power of two >= 16.*got 24.*backend='torch'"):
        _kernel(*inputs)


# ------------------------------------------------------------------------------ the encoder
def test_the_encoder_backend_reaches_every_layer_and_rejects_unknown_names():
    encoder = UpsampleConformerEncoder(EncoderConfig(width=64, heads=2, num_layers=2, num_up_layers=1, ffn_width=64))
    layers = [m for m in encoder.modules() if isinstance(m, RelPositionAttention)]
    assert len(layers) == 3 and encoder.ops_backend == "torch"  # the plain ops unless told otherwise
    encoder.ops_backend = "triton"
    assert {layer.ops_backend for layer in layers} == {"triton"}
    with pytest.raises(ValueError, match=r"encoder attention backend must be one of \('auto', 'triton', 'torch'\)"):
        encoder.ops_backend = "cuda"


def test_the_torch_backend_is_the_reference_bitwise():
    inputs = _attention_inputs(2, 2, 20, 16, seed=5, lengths=[20, 13])
    assert torch.equal(rel_position_attention(*inputs, backend="torch"), rel_position_attention_reference(*inputs))


@needs_triton
def test_an_encoder_with_the_kernel_equals_one_with_the_plain_ops():
    torch.manual_seed(6)
    encoder = UpsampleConformerEncoder(EncoderConfig(width=64, heads=2, num_layers=2, num_up_layers=1,
                                                     ffn_width=64)).to(DEVICE).eval()
    x = torch.randn(2, 21, 64, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    lengths = torch.tensor([21, 12], device=DEVICE)
    with torch.inference_mode():
        plain, _ = encoder(x, lengths)
        encoder.ops_backend = "triton"
        fused, _ = encoder(x, lengths)
    valid = torch.arange(42, device=DEVICE)[None, :] < 2 * lengths[:, None]
    assert _relative_error(fused[valid], plain[valid]) < FP32_MAX_RELATIVE_ERROR


# ------------------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
def test_the_bf16_kernel_is_within_its_bound_of_the_fp32_reference():
    inputs = _attention_inputs(4, 8, 600, 64, seed=8, lengths=[600, 517, 300, 41], dtype=torch.bfloat16)
    exact = rel_position_attention_reference(*(t.float() if t.is_floating_point() else t for t in inputs[:6]),
                                             inputs[6])
    fused = rel_position_attention(*inputs, backend="triton")
    assert fused.dtype == torch.bfloat16
    assert _relative_error(fused, exact) < BF16_MAX_RELATIVE_ERROR
    # and about as close as the plain ops in bf16, which round the position scores and the bias
    # besides the softmax weights and the output (not yet run on a GPU: the margin is a guess)
    assert _relative_error(fused, exact) <= 1.25 * _relative_error(rel_position_attention_reference(*inputs), exact)


@pytest.mark.gpu
def test_a_full_size_bf16_encoder_with_the_kernel_stays_near_the_plain_ops():
    torch.manual_seed(9)
    encoder = UpsampleConformerEncoder(EncoderConfig()).eval()
    g = torch.Generator().manual_seed(10)
    with torch.no_grad():
        for param in encoder.parameters():  # norm scales and biases off 1 and 0
            param.add_(0.05 * torch.randn(param.shape, generator=g))
    encoder = encoder.to("cuda", torch.bfloat16)
    x = torch.randn(4, 600, 512, generator=g).to("cuda", torch.bfloat16)
    lengths = torch.tensor([600, 550, 420, 97], device="cuda")
    with torch.inference_mode():
        plain, _ = encoder(x, lengths)
        encoder.ops_backend = "triton"
        fused, _ = encoder(x, lengths)
    valid = torch.arange(1200, device="cuda")[None, :] < 2 * lengths[:, None]
    assert snr_db(plain[valid].float(), fused[valid].float()) >= ENCODER_SNR_FLOOR_DB
