"""The yardstick of ``chorus bench t3``: a plain PyTorch decode step of the same model shape.

One decode step of a variant's T3 with nothing around it: the speech-token embedding (plus the
learned speech position where the variant has one), the backbone built from the variant's
``BackboneConfig`` with Chorus' own layer classes (they take any ``AttentionCache``, so no paged
cache comes with them), its final norm, the speech head and an argmax that is fed back as the
next step's tokens. Attention is ``F.scaled_dot_product_attention`` over a contiguous KV cache
``[rows, kv_heads, context, head_dim]`` per layer in which every row already holds
``context - 1`` keys; the new token's key and value go to the last slot. No scheduler, no block
tables, no sampling. On CUDA the whole step is one captured CUDA graph; on the CPU it runs
eagerly (so tests cover it).

Weights are random (N(0, 0.02), norms at one): the time of a step does not depend on them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from chorus.models.loading import dtype_name
from chorus.models.t3.attention import AttentionCache
from chorus.models.t3.model import LearnedPositions, build_backbone
from chorus.models.variants import T3Config


@dataclass(frozen=True)
class DecodeShape:
    """What one plain step computes.

    rows: batch rows (requests, times two with CFG), one new token each.
    context_tokens: keys each row attends over, the new token's own included.
    speech_position: index of the fed token in the speech part of its row (BOS is 0); only
    variants with learned speech positions read it.
    """

    rows: int
    context_tokens: int
    speech_position: int = 1

    def __post_init__(self):
        if self.rows < 1 or self.context_tokens < 1 or self.speech_position < 0:
            raise ValueError(f"a decode shape needs rows >= 1, context_tokens >= 1 and speech_position >= 0, "
                             f"got {self}")


class PlainDecodeModel(nn.Module):
    """T3's decode path as plain modules; attribute names follow ``T3Model`` so the two state
    dicts share keys and shapes. Build it with :meth:`build`."""

    def __init__(self, config: T3Config):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.tfmr = build_backbone(config.backbone)
        self.speech_emb = nn.Embedding(config.speech_vocab_size, d)
        self.speech_pos_emb = LearnedPositions(config.speech_pos_rows, d) if config.learned_positions else None
        self.speech_head = nn.Linear(d, config.speech_vocab_size, bias=config.speech_head_bias)

    @classmethod
    def build(cls, config: T3Config, *, dtype: torch.dtype, device: torch.device | str,
              seed: int = 0) -> "PlainDecodeModel":
        """Random weights directly on ``device`` in ``dtype``, eval mode, no gradients."""
        with torch.device("meta"):
            model = cls(config)
        model = model.to(dtype=dtype).to_empty(device=device)
        generator = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if param.ndim >= 2:
                    param.normal_(0.0, 0.02, generator=generator)
                else:  # norm scales at one, biases at zero
                    param.fill_(1.0 if name.endswith("weight") else 0.0)
        model.tfmr.materialize(device)
        return model.eval().requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.speech_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.speech_head.weight.dtype

    def num_parameters(self) -> int:
        """Parameter elements (the Llama MLP's fused gate/up matrix counts once: its two
        parameters are views of it)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, speech_positions: torch.Tensor,
                cache: "ContiguousDecodeCache") -> torch.Tensor:
        """tokens, positions, speech_positions [rows] long -> speech logits [rows, vocab]."""
        embeds = self.speech_emb(tokens)
        if self.speech_pos_emb is not None:
            embeds = embeds + self.speech_pos_emb(speech_positions)
        return self.speech_head(self.tfmr(embeds, positions, cache))


class ContiguousDecodeCache(AttentionCache):
    """The plain step's ``AttentionCache``: per layer K and V of ``[rows, kv_heads, context,
    head_dim]``, the last slot being the new token's. A step overwrites that slot, so replays run
    at a constant context."""

    def __init__(self, model: PlainDecodeModel, shape: DecodeShape):
        bb = model.config.backbone
        size = (bb.num_layers, shape.rows, bb.num_kv_heads, shape.context_tokens, bb.head_dim)
        self.keys = torch.zeros(size, dtype=model.dtype, device=model.device)
        self.values = torch.zeros(size, dtype=model.dtype, device=model.device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keys, values = self.keys[layer], self.values[layer]
        keys[:, :, -1] = k
        values[:, :, -1] = v
        # one query per row and causal by construction: every cached key is at or before it;
        # enable_gqa only when needed (no variant groups its heads, and torch < 2.5 lacks it)
        grouped = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
        return F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, **grouped).squeeze(2)


class PlainDecodeStep:
    """Static inputs, the cache and (on CUDA) the captured graph of one decode step at ``shape``.
    Each call runs one step; its argmax becomes the next call's tokens."""

    def __init__(self, model: PlainDecodeModel, shape: DecodeShape, *, cuda_graph: bool = True):
        config = model.config
        if config.learned_positions and shape.speech_position >= config.speech_pos_rows:
            raise ValueError(f"speech position {shape.speech_position} is past the model's "
                             f"{config.speech_pos_rows} speech positions")
        if shape.context_tokens > config.backbone.max_positions:
            raise ValueError(f"a context of {shape.context_tokens} tokens is past the backbone's "
                             f"{config.backbone.max_positions} positions")
        dev = model.device
        self.model, self.shape = model, shape
        self.cache = ContiguousDecodeCache(model, shape)
        self.tokens = torch.zeros(shape.rows, dtype=torch.long, device=dev)
        self.positions = torch.full((shape.rows,), shape.context_tokens - 1, dtype=torch.long, device=dev)
        self.speech_positions = torch.full((shape.rows,), shape.speech_position, dtype=torch.long, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        if cuda_graph and dev.type == "cuda":
            self._capture()

    @property
    def mode(self) -> str:
        return "cuda_graph" if self.graph is not None else "eager"

    @torch.inference_mode()
    def _step(self) -> None:
        logits = self.model(self.tokens, self.positions, self.speech_positions, self.cache)
        self.tokens.copy_(logits.argmax(dim=-1))

    def _capture(self) -> None:
        stream = torch.cuda.Stream(device=self.model.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # library workspaces and lazy initialisation outside the capture
                self._step()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize(self.model.device)
        self.graph = graph

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_decode_step(model: PlainDecodeModel, shape: DecodeShape, *, steps: int, warmup_steps: int,
                     cuda_graph: bool = True) -> tuple[float, str]:
    """Milliseconds per plain decode step at ``shape`` (mean of ``steps`` timed steps after
    ``warmup_steps``), and the mode it ran in (``"cuda_graph"`` or ``"eager"``). Frees its cache
    and graph before returning."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    step = PlainDecodeStep(model, shape, cuda_graph=cuda_graph)
    try:
        for _ in range(warmup_steps):
            step()
        _sync(model.device)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(model.device)
        return 1000 * (time.perf_counter() - start) / steps, step.mode
    finally:
        del step
        if model.device.type == "cuda":
            torch.cuda.empty_cache()


def describe(model: PlainDecodeModel, mode: str) -> dict:
    """What the calibration runs, for the report."""
    config = model.config
    bb = config.backbone
    return {
        "what": "one decode step in plain PyTorch: speech embedding"
                + (" + learned speech position" if config.learned_positions else "")
                + f", {bb.kind} backbone, final norm, speech head, argmax fed back; no scheduler, "
                  "block tables or sampling",
        "attention": "F.scaled_dot_product_attention over a contiguous KV cache [rows, kv_heads, context, "
                     "head_dim] per layer",
        "mode": mode,
        "dtype": dtype_name(model.dtype),
        "backbone": bb.kind, "num_layers": bb.num_layers, "hidden_size": bb.hidden_size,
        "num_heads": bb.num_heads, "num_kv_heads": bb.num_kv_heads, "head_dim": bb.head_dim,
        "intermediate_size": bb.intermediate_size, "speech_vocab_size": config.speech_vocab_size,
        "parameters": model.num_parameters(),
        "context": "per batch size, the decode entry's context_tokens: keys per row in the middle of the "
                   "engine's timed steps (prompt plus tokens generated so far), the new token's included",
    }
