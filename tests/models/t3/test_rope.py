import math

import torch

from chorus.models.t3.rope import RotaryEmbedding, llama3_inverse_frequencies
from chorus.models.variants import Llama3RopeScaling

THETA = 500000.0
HEAD_DIM = 64


def _direct_llama3(i: int) -> float:
    """The llama3 rule for pair i, written out in float64 from the facts sheet (§2.2)."""
    base = THETA ** (-2 * i / HEAD_DIM)
    wavelength = 2 * math.pi / base
    if wavelength < 8192 / 4:
        return base
    if wavelength > 8192 / 1:
        return base / 8
    s = (8192 / wavelength - 1) / (4 - 1)
    return (1 - s) * base / 8 + s * base


def test_llama3_frequencies_follow_the_rule():
    got = llama3_inverse_frequencies(HEAD_DIM, THETA, Llama3RopeScaling())
    want = torch.tensor([_direct_llama3(i) for i in range(HEAD_DIM // 2)], dtype=torch.float64)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)


def test_llama3_bands():
    scaled = llama3_inverse_frequencies(HEAD_DIM, THETA, Llama3RopeScaling()).double()
    plain = llama3_inverse_frequencies(HEAD_DIM, THETA, None).double()
    assert torch.equal(scaled[:15], plain[:15])  # short wavelengths kept
    torch.testing.assert_close(scaled[18:], plain[18:] / 8, rtol=1e-6, atol=0)  # long ones / 8
    ratio = scaled[15:18] / plain[15:18]
    assert bool(((ratio > 1 / 8) & (ratio < 1)).all())  # blended in between


def test_plain_frequencies():
    got = llama3_inverse_frequencies(HEAD_DIM, 10000.0, None).double()
    want = torch.tensor([10000.0 ** (-2 * i / HEAD_DIM) for i in range(HEAD_DIM // 2)], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


def test_rotation_matches_pairwise_formula():
    rope = RotaryEmbedding(HEAD_DIM, THETA, Llama3RopeScaling())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, HEAD_DIM, generator=g, dtype=torch.float64)
    positions = torch.tensor([0, 1, 7, 300, 5000])
    cos, sin = rope.cos_sin(positions)
    got = RotaryEmbedding.apply(x, cos.double(), sin.double())
    half = HEAD_DIM // 2
    want = torch.empty_like(x)
    for n, p in enumerate(positions.tolist()):
        # angles are formed in fp32, as the reference does; the rotation itself in float64
        angle = (float(p) * rope.inv_freq).double()
        a, b = x[n, :, :half], x[n, :, half:]
        want[n, :, :half] = a * angle.cos() - b * angle.sin()
        want[n, :, half:] = b * angle.cos() + a * angle.sin()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(HEAD_DIM, THETA, Llama3RopeScaling())
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, HEAD_DIM, generator=g), torch.randn(1, 1, HEAD_DIM, generator=g)

    def score(pq: int, pk: int) -> float:
        cq, sq = rope.cos_sin(torch.tensor([pq]))
        ck, sk = rope.cos_sin(torch.tensor([pk]))
        return float((RotaryEmbedding.apply(q, cq, sq) * RotaryEmbedding.apply(k, ck, sk)).sum())

    assert abs(score(10, 3) - score(110, 103)) < 1e-4
    assert abs(score(10, 3) - score(10, 4)) > 1e-3


def test_materialize_rebuilds_frequencies_after_meta_construction():
    with torch.device("meta"):
        rope = RotaryEmbedding(HEAD_DIM, THETA, Llama3RopeScaling())
    assert rope.inv_freq.is_meta
    rope.materialize("cpu")
    assert torch.equal(rope.inv_freq, llama3_inverse_frequencies(HEAD_DIM, THETA, Llama3RopeScaling()))
