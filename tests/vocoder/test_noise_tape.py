"""The streams' counter-based noise: a value depends only on (seed, row, column)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from chorus.vocoder import job as job_module
from chorus.vocoder.job import NoiseTape, read_tapes
from tests.vocoder.tensor_calls import TensorCalls


def test_a_slice_equals_the_same_columns_of_a_wider_slice():
    tape = NoiseTape(9, seed=123, device=torch.device("cpu"))
    wide = tape.slice(0, 5000)
    assert torch.equal(tape.slice(1234, 4321), wide[:, 1234:4321])
    assert torch.equal(NoiseTape(9, seed=123, device=torch.device("cpu")).slice(10, 20), wide[:, 10:20])
    assert tape.slice(7, 7).shape == (9, 0)


def test_the_noise_is_standard_normal_and_differs_by_seed_and_row():
    noise = NoiseTape(4, seed=5, device=torch.device("cpu")).slice(0, 200_000).double()
    assert abs(float(noise.mean())) < 0.01 and abs(float(noise.std()) - 1) < 0.01
    kurtosis = float(((noise - noise.mean()) ** 4).mean() / noise.var() ** 2)
    assert abs(kurtosis - 3) < 0.05
    correlation = torch.corrcoef(noise[:, :50_000])
    assert (correlation - torch.eye(4, dtype=torch.float64)).abs().max() < 0.03
    other = NoiseTape(4, seed=6, device=torch.device("cpu")).slice(0, 50_000).double()
    assert abs(float(torch.corrcoef(torch.stack([noise[0, :50_000], other[0]]))[0, 1])) < 0.03


def test_the_tape_gives_its_dtype():
    assert NoiseTape(80, seed=1, device=torch.device("cpu"), dtype=torch.bfloat16).slice(0, 3).dtype == torch.bfloat16


def _read_and_slices(device: str, dtype=torch.float32):
    tapes = [NoiseTape(9, seed=s, device=torch.device(device), dtype=dtype) for s in (1, 2, 3)]
    ranges = [[(0, 700)], [(40, 90), (500, 800)], [(3000, 3001)]]  # one, two (a prompt, a window), one column
    columns = [np.concatenate([np.arange(a, b) for a, b in r]) for r in ranges]
    read = read_tapes(tapes, columns, 800)
    sliced = [torch.cat([t.slice(a, b) for a, b in r], dim=1) for t, r in zip(tapes, ranges)]
    return read, sliced


@pytest.mark.parametrize("group", [1 << 22, 9 * 800])  # all items in one group; one item per group
def test_one_read_of_many_tapes_equals_their_slices_bitwise_and_zero_after(monkeypatch, group):
    monkeypatch.setattr(job_module, "READ_GROUP_ELEMENTS", group)
    read, sliced = _read_and_slices("cpu")
    assert read.shape == (3, 9, 800)
    for row, expected in zip(read, sliced):
        width = expected.shape[1]
        assert torch.equal(row[:, :width], expected)
        assert not row[:, width:].any()


def test_a_read_gives_the_tapes_dtype():
    read, sliced = _read_and_slices("cpu", torch.bfloat16)
    assert read.dtype == torch.bfloat16 and torch.equal(read[0, :, :700], sliced[0])


@pytest.mark.gpu
def test_one_read_equals_the_slices_bitwise_on_cuda():
    read, sliced = _read_and_slices("cuda")
    for row, expected in zip(read, sliced):
        assert torch.equal(row[:, :expected.shape[1]], expected)


@pytest.mark.gpu
def test_the_noise_is_the_same_on_cuda():
    cpu = NoiseTape(9, seed=77, device=torch.device("cpu")).slice(100, 30_000)
    cuda = NoiseTape(9, seed=77, device=torch.device("cuda")).slice(100, 30_000).cpu()
    torch.testing.assert_close(cuda, cpu, rtol=1e-5, atol=1e-5)


def test_a_new_stream_makes_few_tensor_calls():
    """Streams are added on the vocoder thread, where each tensor call can wait for the GIL
    behind T3's host loop (docs/vocoder.md, "Streams' noise"): a tape is numpy work, and a new
    stream's few tensor calls are its seeds and harmonic phases (200 calls before)."""
    cpu = torch.device("cpu")
    with TensorCalls() as calls:
        NoiseTape(80, seed=7, device=cpu)
    assert calls.total == 0
    with TensorCalls() as calls:
        job_module.new_stream(7, cpu, torch.float32, 9, 20)
    assert calls.total <= 12
