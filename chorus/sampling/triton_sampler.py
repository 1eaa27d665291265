"""The sampler's noise, add and argmax as one Triton kernel (the CUDA path of ``sample_next_tokens``).

The PyTorch path builds the counter hash of ``counter_rng`` over ``[rows, vocab]`` from some
thirty small int64 kernels, then two float64 logs, an add and an argmax: launch-bound even
inside a CUDA graph. Here one program per row walks the vocabulary in tiles and computes, per
token, the same function in registers:

* the hash in native uint32 arithmetic (multiplication wraps mod 2**32, ``>>`` on uint32 is a
  logical shift), which is ``counter_rng``'s int64 emulation of the same uint32 function, so
  the bits are equal by construction and tested equal (:func:`uniform_hash_triton`);
* the uniform ``(h + 0.5) * 2**-32`` in float64 (exact), the noise ``-log(-log(u))`` with two
  float64 logs, and ``processed.to(float64) + noise`` (greedy rows add nothing);
* a running maximum with the lowest index on ties (``torch.argmax``'s rule), and ``NO_TOKEN``
  when none of the row's processed logits is finite (not -inf).

The logs: compiled for CUDA the kernel calls libdevice's ``__nv_log`` explicitly, the CUDA math
library's double-precision ``log``, which is what PyTorch's CUDA ``log`` kernel runs for float64;
so the noise, and with it every token, equals the PyTorch path's on the same device (checked bit
for bit on an H200; with Triton 3.6 ``tl.log`` on fp64 gave the same PTX, but naming the
function keeps that from depending on how a Triton version lowers the math dialect). Under the
Triton interpreter (CPU tests) ``tl.log`` is numpy's, which may differ from torch's CPU log in
the last ulp; a token can then differ only where two noisy scores agree to about 1e-15.

Nothing reads a device value on the host and the output's size depends on shapes only, so the
launch is CUDA-graph capturable (``chorus.engine.sampler_graphs`` captures it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

# counter_rng's constants (one owner: the values are read from there at import)
from chorus.sampling.counter_rng import _LANE_SALTS
from chorus.sampling.triton_mix import mix32 as _mix32

_SALT2 = tl.constexpr(_LANE_SALTS[2])
_SALT3 = tl.constexpr(_LANE_SALTS[3])

# Vocabulary tile per loop iteration and warps per row: the fastest of tiles 512..4096 x 4/8/16
# warps on an H200 at 1, 64 and 256 rows (chorus bench sampler --sweep); 16 warps hide
# the float64 logs' latency best, tiles of 512 or 1024 were within 1 us of each other.
_BLOCK = 1024
_NUM_WARPS = 16


@triton.jit
def _row_keys(lanes_ptr, stride_lanes, steps_ptr, stride_steps, row):
    """The row's two step keys (counter_rng.uniform_hash's key0, key1) as uint32 scalars."""
    lane0 = tl.load(lanes_ptr + row * stride_lanes).to(tl.uint32)  # values < 2**32: truncation is exact
    lane1 = tl.load(lanes_ptr + row * stride_lanes + 1).to(tl.uint32)
    step = tl.load(steps_ptr + row * stride_steps).to(tl.uint32)  # the low word, as `& 0xFFFFFFFF`
    key0 = _mix32(lane0 ^ _mix32(step ^ _SALT2))
    key1 = _mix32(lane1 ^ _mix32(step ^ _SALT3))
    return key0, key1


@triton.jit
def _token_hash(cols, key0, key1):
    """uint32 hash of token ids ``cols`` under the row's keys."""
    return _mix32(_mix32(_mix32(cols.to(tl.uint32)) ^ key0) ^ key1)


@triton.jit
def _log(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def _gumbel(h, LIBDEVICE: tl.constexpr):
    """-log(-log(u)) for u = (h + 0.5) / 2**32, in float64, as counter_rng.gumbel_noise."""
    u = (h.to(tl.float64) + 0.5) * 2.3283064365386963e-10  # 2**-32: both steps exact
    return -_log(-_log(u, LIBDEVICE), LIBDEVICE)


# the seed lanes, steps and greedy flags are read as one scalar per row, from static graph buffers
# (columns at odd offsets and strides) or from fresh eager tensors: specialising on their strides
# or alignment would only give the graphed and the eager sampler two variants of one kernel
@triton.jit(do_not_specialize=["stride_lanes", "stride_steps"],
            do_not_specialize_on_alignment=["lanes_ptr", "steps_ptr", "greedy_ptr"])
def _sample_kernel(logits_ptr, stride_logits, lanes_ptr, stride_lanes, steps_ptr, stride_steps, greedy_ptr,
                   out_ptr, vocab, NO_TOKEN: tl.constexpr, ANY_NOISE: tl.constexpr, LIBDEVICE: tl.constexpr,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    noisy = False
    key0 = tl.zeros((), tl.uint32)
    key1 = tl.zeros((), tl.uint32)
    if ANY_NOISE:
        noisy = tl.load(greedy_ptr + row) == 0
        key0, key1 = _row_keys(lanes_ptr, stride_lanes, steps_ptr, stride_steps, row)
    # Per lane: the best score seen and its token; a later tile only wins with a strictly
    # larger score, so each lane keeps its lowest index among equal scores.
    best = tl.full((BLOCK,), float("-inf"), tl.float64)
    best_idx = offs
    finite = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, vocab, BLOCK):
        cols = start + offs
        mask = cols < vocab
        logit = tl.load(logits_ptr + row * stride_logits + cols, mask=mask, other=float("-inf")).to(tl.float64)
        finite = tl.maximum(finite, (logit != float("-inf")).to(tl.int32))
        score = logit
        if noisy:
            score = logit + _gumbel(_token_hash(cols, key0, key1), LIBDEVICE)
        better = score > best
        best = tl.where(better, score, best)
        best_idx = tl.where(better, cols, best_idx)
    top = tl.max(best, axis=0)
    token = tl.min(tl.where(best == top, best_idx, vocab), axis=0)  # first index of the maximum
    token = tl.where(tl.max(finite, axis=0) > 0, token, NO_TOKEN)
    tl.store(out_ptr + row, token.to(tl.int64))


@triton.jit
def _noise_kernel(lanes_ptr, stride_lanes, steps_ptr, stride_steps, out_ptr, vocab, HASH_ONLY: tl.constexpr,
                  LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    """The sampling kernel's hashes (int64) or noise (float64) written out, for the tests."""
    row = tl.program_id(0)
    key0, key1 = _row_keys(lanes_ptr, stride_lanes, steps_ptr, stride_steps, row)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < vocab
        h = _token_hash(cols, key0, key1)
        if HASH_ONLY:
            tl.store(out_ptr + row * vocab + cols, h.to(tl.int64), mask=mask)
        else:
            tl.store(out_ptr + row * vocab + cols, _gumbel(h, LIBDEVICE), mask=mask)


def _check_rows(lanes: torch.Tensor, steps: torch.Tensor, rows: int) -> None:
    assert lanes.shape == (rows, 2) and lanes.dtype == torch.int64 and lanes.stride(1) == 1, (lanes.shape, lanes.dtype)
    assert steps.shape == (rows,) and steps.dtype == torch.int64, (steps.shape, steps.dtype)


def sample_triton(processed: torch.Tensor, lanes: torch.Tensor, steps: torch.Tensor, greedy: torch.Tensor,
                  all_greedy: bool, no_token: int) -> torch.Tensor:
    """[R] int64 tokens: the exponential race over ``processed`` [R, V] (see the module
    docstring); ``lanes`` [R, 2] int64 seed lanes, ``steps`` [R] int64, ``greedy`` [R] bool."""
    rows, vocab = processed.shape
    assert processed.stride(1) == 1, "the logits' rows must be contiguous"
    _check_rows(lanes, steps, rows)
    assert greedy.shape == (rows,) and greedy.dtype == torch.bool and greedy.is_contiguous(), greedy.shape
    out = torch.empty(rows, dtype=torch.int64, device=processed.device)
    if rows:
        _sample_kernel[(rows,)](processed, processed.stride(0), lanes, lanes.stride(0), steps, steps.stride(0),
                                greedy.view(torch.uint8), out, vocab, NO_TOKEN=no_token, ANY_NOISE=not all_greedy,
                                LIBDEVICE=processed.is_cuda, BLOCK=_BLOCK, num_warps=_NUM_WARPS)
    return out


def _noise(lanes: torch.Tensor, steps: torch.Tensor, vocab: int, hash_only: bool) -> torch.Tensor:
    rows = lanes.shape[0]
    _check_rows(lanes, steps, rows)
    dtype = torch.int64 if hash_only else torch.float64
    out = torch.empty(rows, vocab, dtype=dtype, device=lanes.device)
    if rows:
        _noise_kernel[(rows,)](lanes, lanes.stride(0), steps, steps.stride(0), out, vocab, HASH_ONLY=hash_only,
                               LIBDEVICE=lanes.is_cuda, BLOCK=_BLOCK, num_warps=_NUM_WARPS)
    return out


def uniform_hash_triton(lanes: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """The kernel's [R, V] uint32 hashes (in int64), to compare with ``counter_rng.uniform_hash``."""
    return _noise(lanes, steps, vocab, hash_only=True)


def gumbel_noise_triton(lanes: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """The kernel's [R, V] float64 noise, to compare with ``counter_rng.gumbel_noise``."""
    return _noise(lanes, steps, vocab, hash_only=False)
