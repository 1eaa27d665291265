"""The streams' counter-based noise: a value depends only on (seed, row, column)."""
from __future__ import annotations

import os

import pytest
import torch

from chorus.vocoder import job as job_module
from chorus.vocoder.job import NoiseTape, read_tapes
from chorus.triton_backend import kernels_import
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


def _read_and_slices(device: str, dtype=torch.float32, backend: str = "torch", width: int = 800):
    tapes = [NoiseTape(9, seed=s, device=torch.device(device), dtype=dtype) for s in (1, 2, 3)]
    ranges = [[(0, 700)], [(40, 90), (500, 800)], [(3000, 3001)]]  # one, two (a prompt, a window), one column
    read = read_tapes(tapes, ranges, width, backend=backend)
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


_NEEDS_KERNEL = pytest.mark.skipif(
    not kernels_import("chorus.vocoder.triton_tapes")
    or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs Triton (and TRITON_INTERPRET=1 without a GPU, set by tests/conftest.py)")


@_NEEDS_KERNEL
@pytest.mark.parametrize("width", [800, 2100])  # one tile of columns; three, the last one partial
def test_the_kernel_reads_the_same_noise_and_zero_after(width):
    """Under the interpreter the kernel's log and cosine are numpy's: equal to a few ulps here,
    bit for bit on CUDA (below)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    read, sliced = _read_and_slices(device, backend="triton", width=width)
    assert read.shape == (3, 9, width)
    for row, expected in zip(read, sliced):
        torch.testing.assert_close(row[:, :expected.shape[1]], expected, rtol=2e-6, atol=2e-6)
        assert not row[:, expected.shape[1]:].any()


@_NEEDS_KERNEL
def test_the_kernel_gives_the_tapes_dtype():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    read, sliced = _read_and_slices(device, torch.bfloat16, backend="triton")
    assert read.dtype == torch.bfloat16
    torch.testing.assert_close(read[0, :, :700], sliced[0], rtol=2 ** -7, atol=1e-6)  # a bf16 ulp at most


@_NEEDS_KERNEL
def test_the_kernel_takes_at_most_two_ranges_per_item():
    tape = NoiseTape(9, seed=1, device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    with pytest.raises(AssertionError, match="at most 2 column ranges"):
        read_tapes([tape], [[(0, 1), (2, 3), (4, 5)]], 3, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "auto"])  # auto: the Triton kernel on CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_read_equals_the_slices_bitwise_on_cuda(backend, dtype):
    read, sliced = _read_and_slices("cuda", dtype, backend=backend)
    for row, expected in zip(read, sliced):
        assert torch.equal(row[:, :expected.shape[1]], expected)
        assert not row[:, expected.shape[1]:].any()


@pytest.mark.gpu
def test_the_noise_is_the_same_on_cuda():
    cpu = NoiseTape(9, seed=77, device=torch.device("cpu")).slice(100, 30_000)
    cuda = NoiseTape(9, seed=77, device=torch.device("cuda")).slice(100, 30_000).cpu()
    torch.testing.assert_close(cuda, cpu, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 9, 80])
def test_a_tapes_row_keys_are_its_seed_lanes_hashed_with_each_row(rows):
    """The keys are (seed, row) hashes whatever shortcuts make them (the rows' half is made once
    per row count): written out here in arrays, as the tape first made them."""
    import numpy as np

    from chorus.sampling.counter_rng import mix32, seed_lanes, split_seed

    index = np.arange(rows, dtype=np.int64)
    for seed in (0, 7, 2**40 + 3, 2**64 - 1, -5):
        lanes = seed_lanes(np.array([split_seed(seed % 2**64)], dtype=np.int64))[0]
        expected = np.stack([mix32(int(lane) ^ mix32(index ^ salt)) for lane, salt in zip(lanes, job_module._ROW_SALTS)],
                            axis=1)
        assert np.array_equal(NoiseTape(rows, seed=seed, device=torch.device("cpu")).row_keys, expected)


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


@pytest.mark.gpu
def test_after_the_stage_warm_up_streams_compile_no_tape_kernel():
    """The tape kernel's variants (flow and source tapes differ in rows and dtype) compile in
    ``VocoderStage.warmup``, not in a stream's first pass (Triton 3.6 keeps them per device in
    ``device_caches[device][0]``)."""
    from chorus.vocoder import VocoderConfig, VocoderStage
    from chorus.vocoder.triton_tapes import _read_kernel
    from tests.vocoder.conftest import drain
    from tests.vocoder.models import random_s3gen, random_tokens, random_voice

    def variants() -> int:
        return sum(len(caches[0]) for caches in _read_kernel.device_caches.values())

    s3gen = random_s3gen("turbo", seed=3, device="cuda", dtype=torch.bfloat16)
    stage = VocoderStage(s3gen, VocoderConfig(cuda_graphs=False))
    stage.warmup()
    compiled = variants()
    assert compiled >= 2
    for i in range(3):
        stage.add(f"s{i}", random_voice(30, seed=1), seed=i, streaming=True)
        stage.push(f"s{i}", random_tokens(70 + 9 * i, seed=i), final=True)
    assert len(drain(stage)) == 3
    assert variants() == compiled
