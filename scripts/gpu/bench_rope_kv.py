"""RoPE + paged K/V write: the two kernels (``rope_qk_triton``, ``write_kv_triton``) against the
fused one (``rope_write_kv_triton``), on a CUDA GPU; writes JSON to the path given.

    python scripts/gpu/bench_rope_kv.py results/rope_kv.json

The original T3's Llama attention (16 heads x 64, bf16), the engine's default block size, q/k/v
as views of one projection output (as the model produces them), N new tokens at N in 1, 16, 64,
256, for a pool of the model's dtype and (on compute capability 8.9+) an FP8 pool. Each path is
captured in a CUDA graph that runs it once per layer of the model (30 launches or pairs of
launches, each layer with its own pool, as in a decode step); the time per layer is the median
over graph replays divided by the layers. Before timing, the fused path is checked to give the
two kernels' bits. Runs in a few seconds.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_attention import graph_time_us  # noqa: E402

from chorus.engine.attention.triton_paged import rope_write_kv_triton, write_kv_triton  # noqa: E402
from chorus.engine.config import CacheConfig  # noqa: E402
from chorus.models.t3.triton_ops import rope_qk_triton  # noqa: E402
from chorus.models.variants import get_variant  # noqa: E402

TOKENS = (1, 16, 64, 256)
REPLAYS = 200
DTYPE = torch.bfloat16
FP8 = torch.float8_e4m3fn


class Layer:
    """One layer's inputs: a fused projection output [N, 3 * H * D], tables, a pool, slots."""

    def __init__(self, n: int, heads: int, head_dim: int, block_size: int, pool_dtype: torch.dtype, seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        width = heads * head_dim
        qkv = torch.randn(n, 3 * width, generator=g, device="cuda").to(DTYPE)
        self.q, self.k, self.v = (t.view(n, heads, head_dim) for t in qkv.split(width, dim=-1))
        angles = torch.rand(n, 1, head_dim // 2, generator=g, device="cuda") * 100
        angles = torch.cat((angles, angles), dim=-1)
        self.cos, self.sin = angles.cos().to(DTYPE), angles.sin().to(DTYPE)
        num_blocks = -(-n // block_size) + 1
        self.key_cache = torch.zeros(num_blocks, block_size, heads, head_dim, device="cuda", dtype=pool_dtype)
        self.value_cache = torch.zeros_like(self.key_cache)
        self.slots = torch.randperm(num_blocks * block_size, generator=g, device="cuda")[:n]
        quantized = pool_dtype == FP8
        self.scales = dict(k_scale=torch.tensor([0.05], device="cuda") if quantized else None,
                           v_scale=torch.tensor([0.02], device="cuda") if quantized else None)

    def two_step(self) -> torch.Tensor:
        q, k = rope_qk_triton(self.q, self.k, self.cos, self.sin)
        write_kv_triton(self.key_cache, self.value_cache, k, self.v, self.slots, **self.scales)
        return q

    def fused(self) -> torch.Tensor:
        return rope_write_kv_triton(self.q, self.k, self.v, self.cos, self.sin, self.key_cache, self.value_cache,
                                    self.slots, **self.scales)

    def check(self) -> None:
        """The fused path's q and pool bytes equal the two kernels'."""
        q_two = self.two_step()
        pool_two = (self.key_cache.view(torch.uint8).clone(), self.value_cache.view(torch.uint8).clone())
        self.key_cache.zero_()
        self.value_cache.zero_()
        q_fused = self.fused()
        assert torch.equal(q_fused, q_two), "fused q differs from the RoPE kernel's"
        assert torch.equal(self.key_cache.view(torch.uint8), pool_two[0]), "fused key cache differs"
        assert torch.equal(self.value_cache.view(torch.uint8), pool_two[1]), "fused value cache differs"


def main(out_path: str) -> None:
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    bb = get_variant("original").t3.backbone
    heads, head_dim, layers = bb.num_kv_heads, bb.head_dim, bb.num_layers
    assert bb.num_heads == heads
    block_size = CacheConfig().block_size
    pools = {"model-dtype": DTYPE}
    if torch.cuda.get_device_capability() >= (8, 9):
        pools["fp8_e4m3"] = FP8
    rows = []
    for pool_name, pool_dtype in pools.items():
        for n in TOKENS:
            stack = [Layer(n, heads, head_dim, block_size, pool_dtype, seed=i) for i in range(layers)]
            stack[0].check()
            two = graph_time_us([layer.two_step for layer in stack], REPLAYS)
            fused = graph_time_us([layer.fused for layer in stack], REPLAYS)
            row = {"pool": pool_name, "tokens": n, "two_step_us": round(two, 2), "fused_us": round(fused, 2),
                   "speedup": round(two / fused, 3)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {
        "what": "RoPE of q and k plus the paged K/V write, per layer, inside a CUDA graph of one call per layer",
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "heads": heads, "head_dim": head_dim, "block_size": block_size, "dtype": "bfloat16",
        "layers_per_graph": layers, "replays": REPLAYS, "rows": rows,
    }
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench_rope_kv.py OUT.json")
    main(sys.argv[1])
