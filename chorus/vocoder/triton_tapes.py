"""A pass's noise-tape read as one Triton kernel (the CUDA path of ``job.read_tapes``).

The PyTorch path computes ``NoiseTape``'s values (``counter_rng``'s integer hash of column and
row key, then Box-Muller) from some ninety small int64 and float32 kernels per read, each a
tensor call on the vocoder thread, where on a server every tensor call can wait for the GIL
behind T3's host loop (docs/vocoder.md, "A pass's host work"). Here one launch computes a
read: one program per (item, row, tile of columns) computes, per column,

* the hash in native uint32 arithmetic (multiplication wraps mod 2**32, ``>>`` on uint32 is a
  logical shift): ``counter_rng``'s int64 emulation of the same uint32 function, so the bits are
  equal by construction;
* the uniforms ``(first + 0.5) * 2**-32`` and ``second * 2**-32`` in float32 and
  ``sqrt(-2 log u1) cos(2 pi u2)``, in the PyTorch path's order of float32 operations, with the
  CUDA math library's ``logf`` and ``cosf`` (libdevice, named explicitly as in
  ``triton_sampler``) and a correctly rounded square root: the functions PyTorch's CUDA kernels
  call, so the values equal the PyTorch path's on the same device (a ``gpu`` test checks them bit
  for bit). Under the Triton interpreter (CPU tests) the log and cosine are numpy's, which may
  differ from torch's CPU ones in the last ulp.

An item's columns are at most two ranges of its tape (a stream's prompt frames and its window's
frames), given with the row keys in one small int64 array: one host-to-device copy per read.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

from chorus.sampling.triton_mix import mix32 as _mix32

_BLOCK = 1024
MAX_RANGES = 2
"""Column ranges an item may have."""


@triton.jit
def _box_muller(first, second, LIBDEVICE: tl.constexpr):
    u1 = (first.to(tl.float32) + 0.5) * 2.3283064365386963e-10  # 2**-32; in (0, 1]
    u2 = second.to(tl.float32) * 2.3283064365386963e-10
    angle = 6.283185307179586 * u2
    if LIBDEVICE:
        radius = tl.sqrt_rn(-2.0 * libdevice.log(u1))
        return radius * libdevice.cos(angle)
    else:
        radius = tl.sqrt_rn(-2.0 * tl.log(u1))
        return radius * tl.cos(angle)


@triton.jit(do_not_specialize=["width"])
def _read_kernel(meta_ptr, out_ptr, width, ROWS: tl.constexpr, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    item = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1)
    meta = meta_ptr + item * (2 * ROWS + 4)
    key0 = tl.load(meta + 2 * row).to(tl.uint32)  # values < 2**32: the truncation is exact
    key1 = tl.load(meta + 2 * row + 1).to(tl.uint32)
    first_start = tl.load(meta + 2 * ROWS)
    first_len = tl.load(meta + 2 * ROWS + 1)
    second_start = tl.load(meta + 2 * ROWS + 2)
    second_len = tl.load(meta + 2 * ROWS + 3)
    w = tl.program_id(2).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    column = tl.where(w < first_len, first_start + w, second_start + (w - first_len))
    hashed = _mix32(column.to(tl.uint32))
    value = _box_muller(_mix32(hashed ^ key0), _mix32(hashed ^ key1), LIBDEVICE)
    value = tl.where(w < first_len + second_len, value, 0.0)
    offsets = (item * ROWS + row) * width + w
    tl.store(out_ptr + offsets, value.to(out_ptr.dtype.element_ty), mask=w < width)


def read_tapes_triton(row_keys: Sequence[np.ndarray], ranges: Sequence[Sequence[tuple[int, int]]], width: int,
                      dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[items, rows, width]`` noise of item ``i``'s ``ranges[i]`` (at most ``MAX_RANGES``
    ``(start, end)`` column ranges, laid out in order, zero after) under its tape's row keys
    ``row_keys[i]`` (``[rows, 2]`` int64)."""
    items, rows = len(row_keys), row_keys[0].shape[0]
    meta = np.zeros((items, 2 * rows + 4), np.int64)
    meta[:, :2 * rows] = np.stack(row_keys).reshape(items, 2 * rows)
    for i, item_ranges in enumerate(ranges):
        assert len(item_ranges) <= MAX_RANGES, f"at most {MAX_RANGES} column ranges per item, got {len(item_ranges)}"
        for k, (start, end) in enumerate(item_ranges):
            assert 0 <= start <= end < 2**32, (start, end)
            meta[i, 2 * rows + 2 * k:2 * rows + 2 * k + 2] = start, end - start
    assert (meta[:, 2 * rows + 1] + meta[:, 2 * rows + 3] <= width).all(), "an item has more columns than width"
    out = torch.empty(items, rows, width, dtype=dtype, device=device)
    if items and width:
        grid = (items, rows, triton.cdiv(width, _BLOCK))
        _read_kernel[grid](torch.from_numpy(meta).to(device), out, width, ROWS=rows, LIBDEVICE=out.is_cuda,
                           BLOCK=_BLOCK)
    return out
