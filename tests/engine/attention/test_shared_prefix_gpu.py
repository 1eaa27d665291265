"""Shared-prefix Triton attention on a CUDA device at Turbo-like shapes: 16 heads x 64, block
16, 256 decode rows whose contexts begin with the same 400-token voice prompt (25 shared
blocks), then 30-130 tokens of their own. Compared with the plain Triton decode path and the
fp32 reference, eagerly and under CUDA-graph capture and replay; also over an FP8 pool (scales
not powers of two) against the plain FP8 kernels and the scaled reference.

Bounds on ||out - ref|| / ||ref||: bf16 1e-2 (as the plain kernels: P is rounded to bf16 before
the P @ V dot of the prefix tiles and the output is rounded; FP8 pools alike, as in
test_fp8_gpu.py), fp32 2e-5.
"""
import pytest
import torch

from chorus.engine.attention import (
    SharedPrefixTensors, paged_attention, paged_attention_reference, triton_available,
)
from chorus.engine.attention.shared_prefix import empty_plan
from tests.engine.attention.paged_batch import rel_error
from tests.engine.attention.shared_batch import make_shared_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(),
                       reason="needs CUDA and Triton"),
]

BOUND = {torch.float32: 2e-5, torch.bfloat16: 1e-2}
fp8_capable = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                                 reason="FP8 conversions need compute capability 8.9+")


def _turbo_batch(dtype, *, rows=256, voices=1, loners=0, prefills=(), seed=0):
    gen = torch.Generator().manual_seed(seed)
    suffix = torch.randint(30, 131, (rows,), generator=gen).tolist()
    decodes = [(i % voices if i < rows - loners else -1, 400 + s) for i, s in enumerate(suffix)]
    return make_shared_batch([25] * voices, decodes, list(prefills), heads=16, head_dim=64,
                             block_size=16, dtype=dtype, device="cuda", seed=seed)


def _plain(batch, out=None, **scales):
    return paged_attention(*batch.args(), num_decodes=batch.num_decodes, max_query_len=64,
                           max_seq_len=batch.max_seq_len, out=out, **scales)


def _shared(batch, shared, out=None, **scales):
    return paged_attention(*batch.args(), num_decodes=batch.num_decodes, max_query_len=64,
                           max_seq_len=batch.max_seq_len, out=out, shared_prefix=shared, **scales)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [8, 64, 256])
def test_one_voice_matches_plain_attention(rows, dtype):
    batch = _turbo_batch(dtype, rows=rows)
    shared = batch.shared()
    assert shared.max_groups == 1 and int(shared.group_start[1]) == rows
    ref = paged_attention_reference(*batch.args())
    plain = _plain(batch)
    out = _shared(batch, shared, out=torch.full_like(batch.q, float("nan")))
    assert rel_error(out, ref) < BOUND[dtype], rel_error(out, ref)
    assert rel_error(out, plain) < BOUND[dtype], rel_error(out, plain)


def test_several_voices_loners_and_prefill_rows():
    batch = _turbo_batch(torch.bfloat16, rows=200, voices=3, loners=9,
                         prefills=[(400, 400), (470, 70)], seed=1)
    shared = batch.shared(launch_groups=16)
    ref = paged_attention_reference(*batch.args())
    out = _shared(batch, shared, out=torch.full_like(batch.q, float("nan")))
    assert rel_error(out, ref) < BOUND[torch.bfloat16], rel_error(out, ref)


@fp8_capable
@pytest.mark.parametrize("rows, voices, loners, prefills", [
    (8, 1, 0, ()), (256, 1, 0, ()), (200, 3, 9, ((400, 400), (470, 70))),
])
def test_fp8_pool_matches_the_plain_fp8_kernels(rows, voices, loners, prefills):
    batch = _turbo_batch(torch.bfloat16, rows=rows, voices=voices, loners=loners, prefills=prefills, seed=rows)
    k_scale, v_scale = batch.to_fp8(0.017, 0.013)
    shared = batch.shared(launch_groups=8)
    assert int(shared.prefix_len.gt(0).sum()) == rows - loners
    ref = paged_attention_reference(*batch.args(), k_scale=k_scale, v_scale=v_scale)
    plain = _plain(batch, k_scale=k_scale, v_scale=v_scale)
    out = _shared(batch, shared, out=torch.full_like(batch.q, float("nan")), k_scale=k_scale, v_scale=v_scale)
    assert rel_error(out, plain) < BOUND[torch.bfloat16], rel_error(out, plain)
    assert rel_error(out, ref) < BOUND[torch.bfloat16], rel_error(out, ref)


@pytest.mark.parametrize("fp8", [False, pytest.param(True, marks=fp8_capable)])
def test_replays_in_a_cuda_graph_with_a_new_plan_each_step(fp8):
    batch = _turbo_batch(torch.bfloat16, rows=256, voices=2, loners=6, seed=2)
    scales = dict(zip(("k_scale", "v_scale"), batch.to_fp8(0.017, 0.013))) if fp8 else {}
    plan_tensors = batch.shared(launch_groups=8)             # static buffers, fixed bound
    planned = SharedPrefixTensors(plan_tensors.prefix_len.clone(), plan_tensors.group_rows.clone(),
                                  plan_tensors.group_start.clone(), 8)
    out = torch.empty_like(batch.q)
    _shared(batch, plan_tensors, out=out, **scales)          # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _shared(batch, plan_tensors, out=out, **scales)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _shared(batch, plan_tensors, out=out, **scales)

    # new queries; then the same step with no groups, then grouped again
    batch.q.copy_(torch.randn_like(batch.q))
    ref = paged_attention_reference(*batch.args(), **scales)
    for plan in (empty_plan(batch.seq_lens.shape[0]), None):
        if plan is None:
            for dst, src in ((plan_tensors.prefix_len, planned.prefix_len),
                             (plan_tensors.group_rows, planned.group_rows),
                             (plan_tensors.group_start, planned.group_start)):
                dst.copy_(src)
        else:
            plan_tensors.copy_(plan)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_error(out, ref) < BOUND[torch.bfloat16], rel_error(out, ref)
