"""``fp8_linear``'s ``torch._scaled_mm`` path against its emulation (the reference), on a GPU."""
import pytest
import torch

from chorus.models.fp8 import fp8_linear, fp8_linear_reference, quantize_rows, quantize_weight

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                       reason="FP8 GEMMs need compute capability 8.9+"),
]

# the two paths sum the same fp32 products in different orders and both round once to bf16: the GPU
# result is within one bf16 step (2**-8 relative) of the unrounded emulation, plus the fp32 sums'
# reordering (far below); a margin, not yet measured on a card
BF16_STEP = 2.0 ** -8


@pytest.mark.parametrize("rows", [1, 7, 128, 300])
@pytest.mark.parametrize("shape", [(3072, 1024), (1024, 4096)])  # Llama's fused q|k|v and down_proj
@pytest.mark.parametrize("with_bias", [False, True])
def test_scaled_mm_equals_the_emulation(rows, shape, with_bias):
    g = torch.Generator(device="cuda").manual_seed(rows)
    n, k = shape
    x = torch.randn(rows, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
    bias = torch.randn(n, device="cuda", generator=g).bfloat16() if with_bias else None
    weight = quantize_weight(w)
    out = fp8_linear(x, *weight, bias=bias)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, n)
    reference = fp8_linear_reference(*quantize_rows(x), *weight, bias)
    assert ((out.float() - reference).abs() <= BF16_STEP * reference.abs() + 1e-6).all()


def test_a_weight_the_gpu_gemm_cannot_take_is_refused_when_quantised():
    with pytest.raises(ValueError, match=r"multiples of 16; this one is \[24, 64\]"):
        quantize_weight(torch.randn(24, 64, device="cuda"))
