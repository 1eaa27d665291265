"""A voice: everything T3 and S3Gen need to speak like a reference clip.

A ``Voice`` is built once per reference clip (``chorus.voices.build_voice``) or read from a
checkpoint's built-in ``conds.pt``, then reused by every request. Its ``content_hash`` keys
caches (the engine's conditioning-prefix blocks, the voice store).

On disk a voice is one safetensors file: tensors ``speaker_embedding`` [1, 256],
``t3_prompt_tokens`` [1, P], ``s3gen_prompt_tokens`` [1, Tp], ``s3gen_prompt_mel`` [1, Tm, 80],
``xvector`` [1, 192], optionally ``t3_prompt_embeds``; metadata ``format`` = ``chorus-voice/1``,
``name``, ``variant`` (the variant it was built for) and ``sample_rate`` (of the prompt mel,
24000). Files written before ``variant`` was recorded still load, with a warning.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import torch

logger = logging.getLogger(__name__)

FORMAT = "chorus-voice/1"
VOICE_FILE_SUFFIX = ".safetensors"  # how a saved voice file is told apart from a reference clip
SAMPLE_RATE = 24000  # of s3gen_prompt_mel (S3Gen's output rate)
_TENSORS = ("speaker_embedding", "t3_prompt_tokens", "s3gen_prompt_tokens", "s3gen_prompt_mel", "xvector")
_S3GEN_TENSORS = ("tokens", "mel", "xvector")


class VoiceFormatError(ValueError):
    """A voice file or conditionals dict does not have the expected structure."""


@dataclass(frozen=True, eq=False)
class S3GenPrompt:
    """S3Gen's conditioning of one voice, what S3Gen's ``embed_ref`` makes of the first 10 s of a
    clip (the ``gen`` part of ``conds.pt``): all the vocoder stage needs. A :class:`Voice` carries
    one (:attr:`Voice.s3gen_prompt`); voice conversion to a clip builds one alone (no T3 part)."""

    tokens: torch.Tensor  # [1, Tp] int64
    mel: torch.Tensor  # [1, Tm, 80] float32, 24 kHz log-mel, time-major
    xvector: torch.Tensor  # [1, 192] float32, CAMPPlus, not normalised
    name: str = ""

    def __post_init__(self) -> None:
        def check(cond: bool, what: str) -> None:
            if not cond:
                raise VoiceFormatError(f"S3Gen prompt {self.name or '(unnamed)'}: {what}")

        check(self.tokens.ndim == 2 and self.tokens.shape[0] == 1 and not self.tokens.is_floating_point(),
              "tokens must be integers [1, Tp]")
        check(self.tokens.numel() == 0 or (int(self.tokens.min()) >= 0 and int(self.tokens.max()) < 6561),
              "tokens must be speech codes in [0, 6560]")
        check(self.mel.ndim == 3 and self.mel.shape[0] == 1 and self.mel.shape[2] == 80, "mel must be [1, Tm, 80]")
        check(self.xvector.shape == (1, 192), f"xvector must be [1, 192], got {list(self.xvector.shape)}")

    @functools.cached_property
    def content_hash(self) -> str:
        """Stable hex digest of the three tensors (keys the vocoder's per-voice cache)."""
        return _digest((key, getattr(self, key)) for key in _S3GEN_TENSORS)


def _digest(tensors) -> str:
    h = hashlib.blake2b(digest_size=16)
    for key, tensor in tensors:
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{key}:{t.dtype}:{list(t.shape)};".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True, eq=False)
class Voice:
    """Conditioning of one voice, on the CPU.

    speaker_embedding: [1, 256] voice-encoder embedding (T3 speaker token).
    t3_prompt_tokens: [1, P] speech tokens of the reference clip (T3 prompt).
    s3gen_prompt_tokens: [1, Tp], s3gen_prompt_mel: [1, Tm, 80] (24 kHz log-mel),
    xvector: [1, 192] CAMPPlus embedding (S3Gen speaker conditioning).
    t3_prompt_embeds: an already-embedded T3 prompt [1, P, D], only when a built-in voice
    ships one (it is then used instead of embedding ``t3_prompt_tokens``).
    """

    speaker_embedding: torch.Tensor
    t3_prompt_tokens: torch.Tensor
    s3gen_prompt_tokens: torch.Tensor
    s3gen_prompt_mel: torch.Tensor
    xvector: torch.Tensor
    t3_prompt_embeds: torch.Tensor | None = None
    name: str = ""
    variant: str | None = None  # the variant it was built for; None when unknown (old files)

    def __post_init__(self) -> None:
        def check(cond: bool, what: str) -> None:
            if not cond:
                raise VoiceFormatError(f"voice {self.name or '(unnamed)'}: {what}")

        check(self.speaker_embedding.shape == (1, 256), f"speaker_embedding must be [1, 256], got {list(self.speaker_embedding.shape)}")
        check(self.t3_prompt_tokens.ndim == 2 and self.t3_prompt_tokens.shape[0] == 1, "t3_prompt_tokens must be [1, P]")
        check(self.s3gen_prompt_tokens.ndim == 2 and self.s3gen_prompt_tokens.shape[0] == 1, "s3gen_prompt_tokens must be [1, Tp]")
        check(self.s3gen_prompt_mel.ndim == 3 and self.s3gen_prompt_mel.shape[0] == 1 and self.s3gen_prompt_mel.shape[2] == 80,
              "s3gen_prompt_mel must be [1, Tm, 80]")
        check(self.xvector.shape == (1, 192), f"xvector must be [1, 192], got {list(self.xvector.shape)}")
        for tokens in (self.t3_prompt_tokens, self.s3gen_prompt_tokens):
            check(not tokens.is_floating_point(), "prompt tokens must be integers")
            check(tokens.numel() == 0 or (int(tokens.min()) >= 0 and int(tokens.max()) < 6561),
                  "prompt tokens must be speech codes in [0, 6560]")

    @functools.cached_property
    def content_hash(self) -> str:
        """Stable hex digest of the conditioning values (not of the name). Computed once: the
        engine asks for it on every request, and a voice's tensors are never modified."""
        h = hashlib.blake2b(digest_size=16)
        for key in _TENSORS:
            t = getattr(self, key).detach().to("cpu").contiguous()
            h.update(f"{key}:{t.dtype}:{list(t.shape)};".encode())
            h.update(t.numpy().tobytes())
        if self.t3_prompt_embeds is not None:
            h.update(self.t3_prompt_embeds.detach().float().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    @functools.cached_property
    def s3gen_prompt(self) -> S3GenPrompt:
        """The S3Gen part of this voice (made once per voice object)."""
        return S3GenPrompt(self.s3gen_prompt_tokens, self.s3gen_prompt_mel, self.xvector, name=self.name)

    # ---- conds.pt (the official built-in voice) -----------------------------------------------

    @classmethod
    def from_conditionals(cls, conds: Mapping[str, Any], name: str = "builtin") -> "Voice":
        """From the official ``conds.pt`` dict ``{"t3": {...}, "gen": {...}}``."""
        try:
            t3, gen = conds["t3"], conds["gen"]
            prompt_embeds = t3.get("cond_prompt_speech_emb")
            return cls(
                speaker_embedding=t3["speaker_emb"].float().reshape(1, -1),
                t3_prompt_tokens=t3["cond_prompt_speech_tokens"].long().reshape(1, -1),
                s3gen_prompt_tokens=gen["prompt_token"].long().reshape(1, -1),
                s3gen_prompt_mel=gen["prompt_feat"].float(),
                xvector=gen["embedding"].float().reshape(1, -1),
                t3_prompt_embeds=None if prompt_embeds is None else prompt_embeds.float(),
                name=name,
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise VoiceFormatError(f"not a Chatterbox conditionals dict: missing or malformed {exc}") from exc

    def to_conditionals(self, exaggeration: float = 0.5) -> dict[str, Any]:
        """The official ``conds.pt`` structure (so a voice can replace a checkpoint's built-in one)."""
        return {
            "t3": {
                "speaker_emb": self.speaker_embedding, "clap_emb": None,
                "cond_prompt_speech_tokens": self.t3_prompt_tokens,
                "cond_prompt_speech_emb": self.t3_prompt_embeds,
                "emotion_adv": exaggeration * torch.ones(1, 1, 1),
            },
            "gen": {
                "prompt_token": self.s3gen_prompt_tokens,
                "prompt_token_len": torch.tensor([self.s3gen_prompt_tokens.shape[1]]),
                "prompt_feat": self.s3gen_prompt_mel, "prompt_feat_len": None, "embedding": self.xvector,
            },
        }

    # ---- Chorus voice files -------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        from safetensors.torch import save

        tensors = {k: getattr(self, k).contiguous() for k in _TENSORS}
        if self.t3_prompt_embeds is not None:
            tensors["t3_prompt_embeds"] = self.t3_prompt_embeds.contiguous()
        from chorus.atomic import atomic_file

        metadata = {"format": FORMAT, "name": self.name, "sample_rate": str(SAMPLE_RATE)}
        if self.variant is not None:
            metadata["variant"] = self.variant
        data = save(tensors, metadata=metadata)  # serialised here, written by Python: a full disk is an
        with atomic_file(path) as tmp:  # OSError(ENOSPC), not safetensors' own error type
            tmp.write_bytes(data)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Voice":
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"voice file {path} does not exist")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as exc:
            raise VoiceFormatError(f"{path} is not a Chorus voice file: {exc}") from exc
        if meta.get("format") != FORMAT:
            raise VoiceFormatError(f"{path} is not a Chorus voice file (format {meta.get('format')!r}, expected {FORMAT!r})")
        missing = [k for k in _TENSORS if k not in tensors]
        if missing:
            raise VoiceFormatError(f"voice file {path} lacks {', '.join(missing)}")
        if meta.get("sample_rate", str(SAMPLE_RATE)) != str(SAMPLE_RATE):
            raise VoiceFormatError(f"voice file {path} holds a {meta['sample_rate']} Hz prompt; Chorus voices are "
                                   f"{SAMPLE_RATE} Hz: build it again with `chorus voice create`")
        if "variant" not in meta:
            logger.warning("voice file %s does not record the variant it was built for (written by an older "
                           "Chorus); build it again with `chorus voice create` to have it checked", path)
        return cls(**{k: tensors[k] for k in _TENSORS}, t3_prompt_embeds=tensors.get("t3_prompt_embeds"),
                   name=meta.get("name", path.stem), variant=meta.get("variant"))

    def check_variant(self, variant) -> "Voice":
        """Return this voice if it suits ``variant`` (a :class:`Variant`), else raise
        :class:`VoiceFormatError` naming the variant it was built for. Voices of unknown origin
        pass (old files warn when loaded); see :func:`voices_interchangeable`."""
        if self.variant is not None and not voices_interchangeable(self.variant, variant.name):
            raise VoiceFormatError(
                f"voice {self.name or '(unnamed)'!r} was built for the {self.variant} variant, not {variant.name}: "
                f"build it for {variant.name} with `chorus voice create --variant {variant.name}`")
        return self


def voices_interchangeable(built_for: str, used_by: str) -> bool:
    """Whether a voice built for variant ``built_for`` is what ``used_by`` would build from the
    same clip: the same voice models (same repo and files) and the same clip rules. True for
    multilingual v2/v3; False across original, multilingual, Turbo and Nano."""
    from chorus.audio.reference import ReferencePolicy
    from chorus.models.variants import VARIANTS, get_variant

    if built_for == used_by:
        return True
    if built_for not in VARIANTS:
        return False
    a, b = get_variant(built_for), get_variant(used_by)

    def key(v):
        return v.hub_repo, v.files.voice_encoder, v.files.s3gen, replace(ReferencePolicy.for_variant(v), variant_name="")

    return key(a) == key(b)
