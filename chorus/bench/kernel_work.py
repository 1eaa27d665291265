"""FLOPs and bytes of the kernel classes of a vocoder pass and of a T3 decode step, from the shapes.

One owner for the counts: ``chorus bench vocoder``'s FLOPs (``vocoder_flops``) are the sums of
these classes' ``flops``, and the roofline report (:mod:`chorus.bench.roofline`) reads the same
classes with their bytes.

- ``flops``: tensor-core work, 2 per multiply-accumulate: linears and matmuls, attention
  products (Q K^T, P V, the encoder's relative-position term), convolutions (a transposed one
  counted over its input). Dilation, stride and padding change nothing.
- ``elementwise_flops``: work off the tensor cores, one FLOP per arithmetic operation per
  element (a sin, exp or division counts one), as a convention: Snake 5 per output element,
  a LayerNorm 8, LayerNorm + Mish 14, a softmax 5 per score, the harmonic source 16 per
  harmonic and sample, a small DFT as its matrix product (4 per bin and sample). These classes
  are bandwidth-bound at any plausible count; their roof is their bytes over the bandwidth.
- ``bytes``: the least traffic of each op of the class: every input read once, every output
  written once, weights once per call, at the element size of the dtype the op runs in (the
  model's, or float32 for HiFT's pitch path and iSTFT). Glue inside a class (activations
  after a linear or conv, masks, pads, residual adds) is taken as fused into it: no bytes.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from chorus.models.s3gen.flow import FlowConfig
from chorus.models.s3gen.fused_ops import ATTENTION_TILE, attention_window
from chorus.models.s3gen.hift import HiFTConfig
from chorus.models.variants import T3Config

SNAKE_FLOPS = 5  # alpha x, sin, square, 1/alpha, add
LAYER_NORM_FLOPS = 8
NORM_MISH_FLOPS = LAYER_NORM_FLOPS + 6
SOFTMAX_FLOPS = 5  # per score: scale/bias, max, exp, sum, divide
HARMONIC_FLOPS = 16  # per harmonic and sample: phase increment, cumsum, wrap, sin, voicing, noise mix
FP32 = 4


@dataclass(frozen=True)
class Work:
    """What one kernel class does in a pass; ``fp32``: it runs in float32 whatever the model's dtype."""

    flops: int = 0
    elementwise_flops: int = 0
    bytes: int = 0
    fp32: bool = False

    def __add__(self, other: "Work") -> "Work":
        return Work(self.flops + other.flops, self.elementwise_flops + other.elementwise_flops,
                    self.bytes + other.bytes, self.fp32 or other.fp32)

    def __mul__(self, times: int) -> "Work":
        return Work(self.flops * times, self.elementwise_flops * times, self.bytes * times, self.fp32)

    @property
    def total_flops(self) -> int:
        return self.flops + self.elementwise_flops


def linear(rows: int, fan_in: int, fan_out: int, elem: int, bias: bool = True, fp32: bool = False) -> Work:
    return Work(2 * rows * fan_in * fan_out, 0,
                elem * (rows * fan_in + rows * fan_out + fan_in * fan_out + (fan_out if bias else 0)), fp32)


def conv(batch: int, in_len: int, out_len: int, c_in: int, c_out: int, kernel: int, elem: int,
         fp32: bool = False) -> Work:
    """A Conv1d (groups 1, with bias): 2 x outputs x (c_in x kernel)."""
    return Work(2 * batch * out_len * c_out * c_in * kernel, 0,
                elem * (batch * c_in * in_len + batch * c_out * out_len + c_out * c_in * kernel + c_out), fp32)


def elementwise(read: int, written: int, flops_per_output: int, elem: int, fp32: bool = False) -> Work:
    return Work(0, flops_per_output * written, elem * (read + written), fp32)


def dft_flops(n_fft: int) -> int:
    """One frame of an n-point real DFT (or its inverse) as a matrix product, and the window."""
    return 4 * (n_fft // 2 + 1) * n_fft + n_fft


def conv_out(length: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1) -> int:
    return (length + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


class Classes(defaultdict):
    """Kernel class name -> its :class:`Work`."""

    def __init__(self):
        super().__init__(Work)

    def add(self, name: str, work: Work) -> None:
        self[name] = self[name] + work


def _sum(classes: dict[str, Work]) -> int:
    return sum(w.flops for w in classes.values())


# ------------------------------------------------------------------------------------ HiFT
def hift_work(hift: HiFTConfig, batch: int, frames: int, elem: int) -> Classes:
    """HiFT over ``frames`` mel frames per item. Classes: ``hift.source`` (the F0 predictor, the
    harmonic source and its STFT, float32), ``hift.conv`` (conv_pre, source_downs, conv_post),
    ``hift.upsample`` (the transposed convs), ``hift.resblock_conv`` (every ResBlock conv, source
    branch included), ``hift.snake``, ``hift.istft`` (float32: magnitude/phase, inverse DFT,
    overlap-add and normalisation)."""
    w, f0 = Classes(), hift.f0
    for i in range(f0.num_layers):
        c_in = hift.in_channels if i == 0 else f0.hidden_channels
        w.add("hift.source", conv(batch, frames, frames, c_in, f0.hidden_channels, f0.kernel_size, FP32, fp32=True))
    w.add("hift.source", linear(batch * frames, f0.hidden_channels, 1, FP32, fp32=True))
    samples, harmonics = frames * hift.samples_per_frame, hift.num_harmonics
    n_fft, hop = hift.istft_n_fft, hift.istft_hop
    stft_channels, spectrum = n_fft + 2, samples // hop + 1
    # harmonic source: F0 per frame and the noise draws in, the excitation out; the 9 -> 1 merge
    w.add("hift.source", Work(2 * batch * samples * harmonics, HARMONIC_FLOPS * batch * samples * harmonics,
                              FP32 * (batch * frames + batch * harmonics * samples + batch * samples), True))
    w.add("hift.source", Work(0, dft_flops(n_fft) * batch * spectrum,
                              FP32 * (batch * samples + batch * stft_channels * spectrum), True))
    w.add("hift.conv", conv(batch, frames, frames, hift.in_channels, hift.base_channels, 7, elem))

    def resblock(channels: int, length: int, kernel: int, dilations) -> None:
        per_unit = 2 * len(dilations)
        w.add("hift.resblock_conv", conv(batch, length, length, channels, channels, kernel, elem) * per_unit)
        snake = elementwise(batch * channels * length, batch * channels * length, SNAKE_FLOPS, elem)
        w.add("hift.snake", (snake + Work(bytes=elem * channels)) * per_unit)

    length, c_in = frames, hift.base_channels
    stages = len(hift.upsample_rates)
    for i, (rate, kernel) in enumerate(zip(hift.upsample_rates, hift.upsample_kernel_sizes)):
        c_out = hift.base_channels // 2 ** (i + 1)
        out_len = (length - 1) * rate - 2 * ((kernel - rate) // 2) + kernel
        w.add("hift.upsample", Work(2 * batch * length * c_in * c_out * kernel, 0,
                                    elem * (batch * c_in * length + batch * c_out * out_len + c_in * c_out * kernel
                                            + c_out)))
        length = out_len + (1 if i == stages - 1 else 0)  # the reflect pad before the last stage's blocks
        factor = math.prod(hift.upsample_rates[i + 1:])
        if factor > 1:
            down = conv_out(spectrum, 2 * factor, factor, factor // 2)
            w.add("hift.conv", conv(batch, spectrum, down, stft_channels, c_out, 2 * factor, elem))
        else:
            w.add("hift.conv", conv(batch, spectrum, spectrum, stft_channels, c_out, 1, elem))
        resblock(c_out, length, hift.source_resblock_kernel_sizes[i], hift.source_resblock_dilations[i])
        for kernel_r, dilations in zip(hift.resblock_kernel_sizes, hift.resblock_dilations):
            resblock(c_out, length, kernel_r, dilations)
        c_in = c_out
    w.add("hift.conv", conv(batch, length, length, c_in, stft_channels, 7, elem))
    bins = n_fft // 2 + 1
    w.add("hift.istft", Work(0, batch * length * (7 * bins + dft_flops(n_fft) + n_fft) + batch * hop * (length - 1),
                             FP32 * (batch * stft_channels * length + batch * hop * (length - 1)), True))
    return w


def hift_flops(hift: HiFTConfig, batch: int, frames: int) -> int:
    return _sum(hift_work(hift, batch, frames, 2))


# ------------------------------------------------------------------------------ the flow
def encoder_work(flow: FlowConfig, batch: int, tokens: int, elem: int, fused_attention: bool = False) -> Classes:
    """The flow encoder over ``tokens`` (prompt + new) per item, and ``encoder_proj``. Classes:
    ``encoder.linear`` (every linear: q/k/v/out, the position table's ``linear_pos``, the
    feed-forward, the embeddings, ``encoder_proj``), ``encoder.attention`` (Q K^T, P V, the
    relative-position product Q_pos P^T over the 2T-1 distances, the softmax), ``encoder.conv``
    (pre-lookahead and upsampling convs), ``encoder.norm`` (the LayerNorms).

    ``fused_attention``: the attention runs as the fused kernel
    (:func:`chorus.models.s3gen.fused_ops.rel_position_attention`), whose position product is one
    dot per tile of keys against the window of the table the tile spans (``attention_window``
    rows for ``ATTENTION_TILE[1]`` keys) and which reads both queries (content and position)."""
    e, w = flow.encoder, Classes()
    d = e.width

    def attention(n: int) -> Work:
        rows, softmax = batch * n, SOFTMAX_FLOPS * batch * e.heads * n * n
        if not fused_attention:
            return Work(2 * rows * (2 * n - 1) * d + 2 * (2 * rows * n * d), softmax,
                        elem * (4 * rows * d + (2 * n - 1) * d))
        block_n = ATTENTION_TILE[1]
        position = 2 * rows * -(-n // block_n) * attention_window(*ATTENTION_TILE) * d
        return Work(position + 2 * (2 * rows * n * d), softmax, elem * (5 * rows * d + (2 * n - 1) * d))

    def norm(rows: int) -> Work:
        return elementwise(rows * d, rows * d, LAYER_NORM_FLOPS, elem) + Work(bytes=2 * d * elem)

    def conformer(n: int) -> None:
        rows = batch * n
        w.add("encoder.linear", linear(rows, d, d, elem) * 4 + linear(rows, d, e.ffn_width, elem)
              + linear(rows, e.ffn_width, d, elem) + linear(2 * n - 1, d, d, elem, bias=False))
        w.add("encoder.attention", attention(n))
        w.add("encoder.norm", norm(rows) * 2)

    frames = e.upsample * tokens
    w.add("encoder.linear", linear(batch * tokens, d, d, elem))  # embed
    w.add("encoder.norm", norm(batch * tokens))
    w.add("encoder.conv", conv(batch, tokens, tokens, d, d, e.lookahead + 1, elem)
          + conv(batch, tokens, tokens, d, d, 3, elem))  # pre-lookahead
    for _ in range(e.num_layers):
        conformer(tokens)
    w.add("encoder.conv", conv(batch, tokens, frames, d, d, 2 * e.upsample + 1, elem))  # up_layer (after the repeat)
    w.add("encoder.linear", linear(batch * frames, d, d, elem))  # up_embed
    w.add("encoder.norm", norm(batch * frames) * 2)  # up_embed's, after_norm
    for _ in range(e.num_up_layers):
        conformer(frames)
    w.add("encoder.linear", linear(batch * frames, d, flow.mel_bins, elem))  # encoder_proj
    return w


def estimator_work(flow: FlowConfig, rows: int, frames: int, elem: int) -> Classes:
    """One estimator call over ``rows`` x ``frames``. Classes: ``estimator.conv`` (the causal
    ResNet blocks' convs and 1x1 residual convs, the levels' causal convs, the final block and
    projection), ``estimator.linear`` (time embedding, time projections, q/k/v/out, the GELU
    feed-forward), ``estimator.attention`` (Q K^T, P V, the softmax), ``estimator.norm`` (each
    causal block's LayerNorm + Mish + mask (+ add), the transformer blocks' residual add +
    LayerNorm)."""
    s, w = flow.estimator, Classes()
    c, inner, embed = s.channels, s.heads * s.head_dim, s.time_embed_dim
    time_mlp = linear(rows, s.in_channels, embed, elem) + linear(rows, embed, embed, elem)
    w.add("estimator.linear", time_mlp * 2 + linear(rows, 2 * embed, embed, elem, bias=False) if flow.meanflow
          else time_mlp)
    cells = rows * c * frames

    def norm_mish(addend: int) -> Work:
        return elementwise(cells + addend, cells, NORM_MISH_FLOPS, elem) + Work(bytes=2 * c * elem)

    def resnet(dim_in: int) -> None:
        w.add("estimator.conv", conv(rows, frames, frames, dim_in, c, 3, elem) + conv(rows, frames, frames, c, c, 3, elem)
              + conv(rows, frames, frames, dim_in, c, 1, elem))
        w.add("estimator.linear", linear(rows, embed, c, elem))
        w.add("estimator.norm", norm_mish(rows * c) + norm_mish(cells))

    def blocks() -> None:
        n, tokens = s.blocks_per_level, rows * frames
        w.add("estimator.linear", (linear(tokens, c, inner, elem, bias=False) * 3 + linear(tokens, inner, c, elem)
                                   + linear(tokens, c, s.ffn_mult * c, elem) + linear(tokens, s.ffn_mult * c, c, elem))
              * n)
        w.add("estimator.attention", Work(2 * (2 * rows * frames * frames * inner),
                                          SOFTMAX_FLOPS * rows * s.heads * frames * frames,
                                          elem * 4 * tokens * inner) * n)
        ln = Work(bytes=2 * c * elem)
        add_norm = elementwise(2 * cells, 2 * cells, LAYER_NORM_FLOPS + 1, elem) + ln
        # the first block's LN1, each block's add + LN3, the adds + next LN1 between blocks, the last add
        w.add("estimator.norm", elementwise(cells, cells, LAYER_NORM_FLOPS, elem) + ln + add_norm * (2 * n - 1)
              + elementwise(2 * cells, cells, 1, elem))

    resnet(s.in_channels)
    blocks()
    w.add("estimator.conv", conv(rows, frames, frames, c, c, 3, elem))  # down
    for _ in range(s.mid_levels):
        resnet(c)
        blocks()
    resnet(2 * c)
    blocks()
    w.add("estimator.conv", conv(rows, frames, frames, c, c, 3, elem) * 2  # up, final block
          + conv(rows, frames, frames, c, s.out_channels, 1, elem))  # final projection
    w.add("estimator.norm", norm_mish(0))  # the final block's
    return w


def solver_work(flow: FlowConfig, rows: int, frames: int, n_steps: int, elem: int) -> Classes:
    """``n_steps`` estimator calls over ``rows`` (CFG rows included)."""
    w = Classes()
    for name, work in estimator_work(flow, rows, frames, elem).items():
        w.add(name, work * n_steps)
    return w


def encoder_flops(flow: FlowConfig, batch: int, tokens: int) -> int:
    return _sum(encoder_work(flow, batch, tokens, 2))


def estimator_flops(flow: FlowConfig, rows: int, frames: int) -> int:
    return _sum(estimator_work(flow, rows, frames, 2))


# ---------------------------------------------------------------------------------- T3
def t3_step_work(t3: T3Config, rows: int, context: int, prompt_tokens: int, prompts: int, elem: int,
                 kv_elem: int | None = None) -> Classes:
    """One decode step of ``rows`` rows, one new token each, every row attending over
    ``context`` keys (its new one included), of which the first ``prompt_tokens`` are a prompt
    shared by all rows of one of ``prompts`` kinds (the CFG pair's two). Classes: ``t3.linear``
    (every layer's projections and MLP, and the speech head) and ``t3.attention`` (Q K^T, P V,
    the softmax; the K/V cache read once per distinct token: each shared prompt once, each row's
    own tokens, and the new K/V written)."""
    bb, w = t3.backbone, Classes()
    d, heads, kv_heads, hd, inner = bb.hidden_size, bb.num_heads, bb.num_kv_heads, bb.head_dim, bb.intermediate_size
    kv_elem = elem if kv_elem is None else kv_elem
    if bb.kind == "llama":
        layer = (linear(rows, d, (heads + 2 * kv_heads) * hd, elem, bias=False) + linear(rows, heads * hd, d, elem, bias=False)
                 + linear(rows, d, 2 * inner, elem, bias=False) + linear(rows, inner, d, elem, bias=False))
    else:
        layer = (linear(rows, d, 3 * d, elem) + linear(rows, d, d, elem) + linear(rows, d, inner, elem)
                 + linear(rows, inner, d, elem))
    w.add("t3.linear", layer * bb.num_layers + linear(rows, d, t3.speech_vocab_size, elem, bias=t3.speech_head_bias))
    distinct = prompts * prompt_tokens + rows * max(0, context - prompt_tokens)
    attention = Work(2 * 2 * rows * context * heads * hd, SOFTMAX_FLOPS * rows * heads * context,
                     elem * rows * (2 * heads + 2 * kv_heads) * hd + kv_elem * 2 * kv_heads * hd * (distinct + rows))
    w.add("t3.attention", attention * bb.num_layers)
    return w
