"""The upsampling conformer encoder: relative positions, padding safety, parity with the reference."""
from __future__ import annotations

import pytest
import torch

from chorus.models.s3gen import FlowDecoder, UpsampleConformerEncoder
from chorus.models.s3gen.encoder import relative_position_table
from chorus.models.s3gen.fused_ops import relative_to_absolute
from tests.models.s3gen.oracle_s3gen import TOLERANCE, build_oracle_flow, tiny_flow_config, torch_threads


@pytest.fixture(autouse=True)
def _single_thread():
    with torch_threads(1):
        yield


TINY = tiny_flow_config().encoder


def _tiny_encoder(seed: int = 0) -> UpsampleConformerEncoder:
    torch.manual_seed(seed)
    encoder = UpsampleConformerEncoder(TINY).eval()
    with torch.no_grad():  # norms start at 1/0 and position biases at 0: make them matter
        for p in encoder.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return encoder


def test_relative_to_absolute_scores_distance_i_minus_j():
    length = 5
    scores = torch.randn(2, 3, length, 2 * length - 1)
    out = relative_to_absolute(scores)
    # column k of the table is distance (length - 1) - k
    for i in range(length):
        for j in range(length):
            assert torch.equal(out[:, :, i, j], scores[:, :, i, (length - 1) - (i - j)])


def test_relative_position_table_is_sinusoid_of_signed_distance():
    table = relative_position_table(4, 8, "cpu", torch.float32)[0]
    assert table.shape == (7, 8)
    distance = torch.arange(3, -4, -1, dtype=torch.float32)[:, None]
    inv_freq = 10000 ** (-torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    torch.testing.assert_close(table[:, 0::2], torch.sin(distance * inv_freq))
    torch.testing.assert_close(table[:, 1::2], torch.cos(distance * inv_freq))


def test_output_is_twice_as_long():
    encoder = _tiny_encoder()
    h, lengths = encoder(torch.randn(2, 7, 512), torch.tensor([7, 4]))
    assert h.shape == (2, 14, 512)
    assert lengths.tolist() == [14, 8]


@torch.no_grad()
def test_padded_batch_matches_items_alone_even_with_garbage_padding():
    encoder = _tiny_encoder()
    lengths = [9, 4, 6]
    items = [torch.randn(1, n, 512) for n in lengths]
    batch = torch.randn(len(items), max(lengths), 512) * 100  # garbage where padded
    for i, item in enumerate(items):
        batch[i, : lengths[i]] = item[0]
    h, out_lengths = encoder(batch, torch.tensor(lengths))
    for i, item in enumerate(items):
        alone, _ = encoder(item, torch.tensor([lengths[i]]))
        n = int(out_lengths[i])
        torch.testing.assert_close(h[i, :n], alone[0], rtol=0, atol=1e-5)


@pytest.mark.oracle
@torch.no_grad()
def test_tiny_encoder_matches_reference(oracle):
    config = tiny_flow_config()
    reference = build_oracle_flow(config)
    ours = FlowDecoder.from_state_dict(config, reference.state_dict())
    embedded = torch.randn(1, 11, 512)
    lengths = torch.tensor([11])
    expected, _ = reference.encoder(embedded, lengths)
    actual, _ = ours.encoder(embedded, lengths)
    assert (actual - expected).abs().max() <= TOLERANCE
