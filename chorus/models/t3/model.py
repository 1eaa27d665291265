"""T3: text tokens + voice conditioning -> speech-token logits, for every Chatterbox variant.

``T3Model`` holds the weights and the pieces of one forward: conditioning, input embeddings
(in the exact order and with the exact position embeddings of the reference), the backbone
and the speech head. Running a sequence step by step is the job of a runner
(:mod:`chorus.models.t3.runner`) or of the engine.

State-dict keys are exactly the official checkpoint keys. Two official tables are never used
at inference (the backbone's inner token table, ``tfmr.embed_tokens`` or ``tfmr.wte``, and
``text_head``); they are checked on load and then dropped.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import nn

from chorus.models.checkpoint import check_state_dict
from chorus.models.t3 import gpt2, llama
from chorus.models.t3.attention import AttentionCache, ContiguousKVCache
from chorus.models.t3.backbone import Backbone, Shapes
from chorus.models.t3.cond_encoder import T3CondEncoder
from chorus.models.variants import BackboneConfig, T3Config

_BACKBONES = {"llama": llama.LlamaBackbone, "gpt2": gpt2.GPT2Backbone}


def _backbone_class(config: BackboneConfig):
    if config.kind not in _BACKBONES:
        raise ValueError(f"unknown backbone kind {config.kind!r}")
    return _BACKBONES[config.kind]


def build_backbone(config: BackboneConfig) -> Backbone:
    return _backbone_class(config)(config)


class LearnedPositions(nn.Module):
    """A learned absolute position table (``<name>.emb.weight`` in the checkpoint)."""

    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.emb = nn.Embedding(rows, dim)

    @property
    def rows(self) -> int:
        return self.emb.num_embeddings

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.emb(positions)


class T3Model(nn.Module):
    """T3 weights plus the steps of a forward. Build it with :meth:`from_state_dict`.

    Sequence of one request: ``encode_conditioning`` -> ``prefill_embeds`` (rows x [cond | text
    | BOS]) -> ``forward`` over a KV cache -> ``speech_logits``; then per sampled token
    ``speech_embeds`` (at speech position i + 1) -> ``forward`` -> ``speech_logits``.
    """

    def __init__(self, config: T3Config):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.tfmr = build_backbone(config.backbone)
        self.cond_enc = T3CondEncoder(config)
        self.text_emb = nn.Embedding(config.text_vocab_size, d)
        self.speech_emb = nn.Embedding(config.speech_vocab_size, d)
        self.text_pos_emb = LearnedPositions(config.text_pos_rows, d) if config.learned_positions else None
        self.speech_pos_emb = (
            LearnedPositions(config.speech_pos_rows, d) if config.learned_positions else None
        )
        self.speech_head = nn.Linear(d, config.speech_vocab_size, bias=config.speech_head_bias)

    # ---- checkpoint -------------------------------------------------------------------------

    @staticmethod
    def checkpoint_shapes(config: T3Config) -> Shapes:
        """Every key of the official T3 checkpoint (including the unused ones) -> shape."""
        d = config.hidden_size
        backbone = _backbone_class(config.backbone).checkpoint_shapes(config.backbone)
        shapes: Shapes = {f"tfmr.{k}": v for k, v in backbone.items()}
        shapes.update({f"cond_enc.{k}": v for k, v in T3CondEncoder.checkpoint_shapes(config).items()})
        shapes["text_emb.weight"] = (config.text_vocab_size, d)
        shapes["speech_emb.weight"] = (config.speech_vocab_size, d)
        if config.learned_positions:
            shapes["text_pos_emb.emb.weight"] = (config.text_pos_rows, d)
            shapes["speech_pos_emb.emb.weight"] = (config.speech_pos_rows, d)
        shapes["text_head.weight"] = (config.text_vocab_size, d)
        shapes["speech_head.weight"] = (config.speech_vocab_size, d)
        if config.speech_head_bias:
            shapes["speech_head.bias"] = (config.speech_vocab_size,)
        return shapes

    @staticmethod
    def unused_checkpoint_keys(config: T3Config) -> tuple[str, ...]:
        """Official keys that inference never reads; checked on load, then dropped."""
        unused = _backbone_class(config.backbone).UNUSED_CHECKPOINT_KEYS
        return (*(f"tfmr.{k}" for k in unused), "text_head.weight")

    @classmethod
    def from_state_dict(
        cls, config: T3Config, state: Mapping[str, torch.Tensor], *,
        dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
        source: str = "T3 state dict",
    ) -> "T3Model":
        """Build an inference-ready model from an official state dict.

        Keys and shapes must match :meth:`checkpoint_shapes` exactly (otherwise
        :class:`chorus.models.checkpoint.CheckpointMismatchError` names every difference).
        Unused tables are dropped; every kept tensor is converted to ``dtype``/``device`` once.
        The model is returned in eval mode without gradients.
        """
        check_state_dict(state, cls.checkpoint_shapes(config), source)
        with torch.device("meta"):
            model = cls(config)
        kept = {
            key: state[key].to(device=device, dtype=dtype)
            for key in model.state_dict()
        }
        model.load_state_dict(kept, strict=True, assign=True)
        model.tfmr.materialize(device)
        return model.eval().requires_grad_(False)

    # ---- conditioning -----------------------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        return self.speech_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.speech_head.weight.device

    def prompt_embeds(self, prompt_tokens: torch.Tensor) -> torch.Tensor:
        """Speech-prompt tokens [B, P] -> embeddings [B, P, D] (speech positions 0..P-1 added
        for variants with learned positions)."""
        if prompt_tokens.ndim != 2:
            raise ValueError(f"prompt tokens must be [batch, length], got {tuple(prompt_tokens.shape)}")
        tokens = prompt_tokens.to(device=self.device, dtype=torch.long)
        embeds = self.speech_emb(tokens)
        if self.speech_pos_emb is not None:
            length = tokens.shape[1]
            if length > self.speech_pos_emb.rows:
                raise ValueError(
                    f"speech prompt of {length} tokens exceeds the {self.speech_pos_emb.rows} "
                    "speech positions of this model"
                )
            embeds = embeds + self.speech_pos_emb(torch.arange(length, device=self.device))
        return embeds

    def encode_conditioning(
        self, speaker_emb: torch.Tensor, prompt_tokens: torch.Tensor | None, exaggeration: float,
        *, prompt_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Conditioning embeddings [1, C, D] that start every sequence of this voice.

        speaker_emb: [1, 256] voice-encoder embedding. prompt_tokens: [1, P] speech tokens of
        the reference clip, or None. prompt_embeds: an already embedded prompt [1, P, D] (a
        built-in voice may carry one as ``cond_prompt_speech_emb``); when given it is used
        as-is and prompt_tokens is ignored. exaggeration: emotion strength; ignored by
        variants without an emotion token (Turbo, Nano).
        """
        speaker = speaker_emb.to(device=self.device, dtype=self.dtype)
        if prompt_embeds is not None:
            prompt = prompt_embeds.to(device=self.device, dtype=self.dtype)
        elif prompt_tokens is not None:
            prompt = self.prompt_embeds(prompt_tokens)
        else:
            prompt = None
        emotion = exaggeration if self.config.emotion_adv else None
        return self.cond_enc(speaker, prompt, emotion)

    # ---- input embeddings -------------------------------------------------------------------

    def frame_text(self, text_ids: torch.Tensor) -> torch.Tensor:
        """Tokenizer output [Lt] -> the text part of the input, on the host: SOT + ids + EOT for
        variants that frame the text (original, multilingual), the ids unchanged otherwise."""
        ids = torch.as_tensor(text_ids).to(device="cpu", dtype=torch.long).reshape(-1)
        sot, eot = self.config.start_text_token, self.config.stop_text_token
        if sot is None:
            return ids
        assert eot is not None
        return torch.cat([ids.new_tensor([sot]), ids, ids.new_tensor([eot])])

    def speech_embeds(self, tokens: torch.Tensor, speech_positions: torch.Tensor | None) -> torch.Tensor:
        """Speech tokens [N] -> input embeddings [N, D].

        speech_positions [N]: index of each token in the speech part of its sequence: BOS is
        0 and the i-th sampled token (i = 0, 1, ...) is fed back at i + 1. Required for
        variants with learned positions, ignored by the others.
        """
        embeds = self.speech_emb(tokens)
        if self.speech_pos_emb is not None:
            assert speech_positions is not None, "this variant needs speech positions"
            embeds = embeds + self.speech_pos_emb(speech_positions)
        return embeds

    def bos_embeds(self) -> torch.Tensor:
        """The start-of-speech part of the prefill: [bos_copies, D] (two copies for the
        original and multilingual variants, as the reference feeds BOS twice)."""
        copies = self.config.bos_copies
        tokens = torch.full((copies,), self.config.start_speech_token, dtype=torch.long, device=self.device)
        return self.speech_embeds(tokens, torch.zeros_like(tokens))

    def prefill_embeds(self, cond: torch.Tensor, text_ids: torch.Tensor, *, cfg: bool) -> torch.Tensor:
        """[cond | framed text | BOS] for one request -> [rows, L, D].

        cond: [1, C, D] from :meth:`encode_conditioning`; text_ids: tokenizer output [Lt]
        (unframed). With ``cfg`` there are two rows: 0 conditional, 1 unconditional (no token
        embeddings, the text position embeddings kept, as the reference does).
        """
        return self.prefill_embeds_many([(cond, text_ids, cfg)])[0]

    def prefill_embeds_many(self, requests: Sequence[tuple[torch.Tensor, torch.Tensor, bool]]) -> list[torch.Tensor]:
        """:meth:`prefill_embeds` of several requests, ``(cond, text_ids, cfg)`` each, equal to
        it bit for bit. Their text is looked up together: every request's framed ids and text
        positions go to the device in one copy (from pinned memory, so it does not wait for the
        device's queued work) and through each table once; per request there is only the
        concatenation. A burst of arrivals then costs the engine's thread a few tensor calls
        instead of about ten per request, each of which can hand the GIL to another thread
        (docs/engine.md, "Admission")."""
        for cond, _, cfg in requests:
            if cfg and not self.config.supports_cfg:
                raise ValueError("this variant has no classifier-free guidance")
            if cond.ndim != 3 or cond.shape[0] != 1:
                raise ValueError(f"conditioning must be [1, C, D], got {tuple(cond.shape)}")
        framed = [self.frame_text(text_ids) for _, text_ids, _ in requests]
        lengths = [f.shape[0] for f in framed]
        if self.text_pos_emb is not None and max(lengths, default=0) > self.text_pos_emb.rows:
            raise ValueError(f"text of {max(lengths)} tokens (with start/stop) exceeds the "
                             f"{self.text_pos_emb.rows} text positions of this model")
        if not requests:
            return []
        positions = torch.cat([torch.arange(n) for n in lengths])
        host = torch.cat([*framed, positions])
        if self.device.type == "cuda":
            # pinned, so the copy is queued behind the device's work instead of waiting for it: a
            # request arriving while a T3 step runs is embedded without a sync (docs/engine.md,
            # "Admission"); the caching host allocator keeps the buffer until the copy is done
            host = host.pin_memory()
        ids, positions = host.to(self.device, non_blocking=True).split(sum(lengths))
        text = self.text_emb(ids)
        unconditional = torch.zeros_like(text) if any(cfg for _, _, cfg in requests) else None
        if self.text_pos_emb is not None:
            position_embeds = self.text_pos_emb(positions)
            text = text + position_embeds
            if unconditional is not None:
                unconditional = unconditional + position_embeds
        bos = self.bos_embeds()
        out, start = [], 0
        for (cond, _, cfg), length in zip(requests, lengths):
            cond, end = cond[0].to(self.dtype), start + length
            rows = [torch.cat([cond, text[start:end], bos])]
            if cfg:
                rows.append(torch.cat([cond, unconditional[start:end], bos]))
            out.append(torch.stack(rows))
            start = end
        return out

    # ---- backbone and head ------------------------------------------------------------------

    def forward(
        self, embeds: torch.Tensor, positions: torch.Tensor, cache: AttentionCache
    ) -> torch.Tensor:
        """Backbone over a flat batch: embeds [N, D], positions [N] -> final hidden [N, D]."""
        return self.tfmr(embeds, positions, cache)

    def speech_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden states [..., D] -> speech-token logits [..., speech_vocab]."""
        return self.speech_head(hidden)

    def new_contiguous_cache(self, rows: int, max_len: int) -> ContiguousKVCache:
        """A :class:`ContiguousKVCache` shaped for this model, on its device and dtype."""
        bb = self.config.backbone
        return ContiguousKVCache(
            bb.num_layers, rows, max_len, bb.num_kv_heads, bb.head_dim,
            dtype=self.dtype, device=self.device,
        )

