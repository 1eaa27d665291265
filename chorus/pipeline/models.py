"""The loaded models of one checkpoint, shared by the pipeline and the exact sequential path."""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

import torch

from chorus.models.loading import Checkpoint, CheckpointNotFoundError, load_t3, parse_device, resolve_dtype
from chorus.models.random_checkpoint import RANDOM_WEIGHTS_TOKEN_CAP
from chorus.models.s3gen.s3gen import S3Gen
from chorus.models.t3.model import T3Model
from chorus.models.variants import Variant, get_variant
from chorus.pipeline.planner import RequestPlanner
from chorus.text import DEFAULT_MAX_CHARS, LanguageStepConfig, TextEncoder, load_text_encoder
from chorus.voices import Voice, VoiceFrontEnd

logger = logging.getLogger(__name__)


@dataclass
class SpeechModels:
    """T3, S3Gen, the text encoder and optionally the voice front end (the models that turn a
    reference clip into a voice) of one checkpoint, on one device. ``random_weights``: the weights
    came from a random-weight checkpoint (set by :meth:`load`), so requests without
    ``max_new_tokens`` are capped (:func:`chorus.models.random_checkpoint.random_weights_token_cap`)."""

    checkpoint: Checkpoint
    t3: T3Model
    s3gen: S3Gen
    text_encoder: TextEncoder
    front_end: VoiceFrontEnd | None = None
    random_weights: bool = False
    _builtin: Voice | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, variant: Variant | str, checkpoint: Checkpoint | str | os.PathLike | None = None, *,
             dtype: str | torch.dtype = "auto", device: str | torch.device | None = "cpu",
             voice_models: bool = True, language_steps: LanguageStepConfig | None = None,
             t3_weights: str | None = None) -> "SpeechModels":
        """Load every model of ``checkpoint`` (a :class:`Checkpoint`, a directory, a hub id, or
        None for the variant's official repo). ``voice_models=False`` skips the models that build
        voices from reference clips (then only built-in and saved voices work). ``dtype="auto"``
        is bf16 on CUDA and fp32 on the CPU; ``device="auto"`` picks CUDA when there is one.
        ``language_steps`` (default lenient) says where the multilingual language steps find their
        models; strict raises here when one is missing (see ``load_text_encoder``). ``t3_weights``: the
        T3 weights' file name when it is not the variant's official one (see ``Checkpoint.open``)."""
        variant = get_variant(variant) if isinstance(variant, str) else variant
        if not isinstance(checkpoint, Checkpoint):
            checkpoint = Checkpoint.open(variant, checkpoint, t3_weights=t3_weights)
        elif t3_weights is not None:
            raise ValueError("t3_weights applies to a checkpoint location; an opened Checkpoint has its file names")
        elif checkpoint.variant.name != variant.name:
            raise ValueError(f"the checkpoint is for {checkpoint.variant.name}, not {variant.name}")
        if checkpoint.has_random_weights:
            logger.warning("the checkpoint at %s has RANDOM WEIGHTS (written by `chorus checkpoint random`): "
                           "every voice speaks noise, and a request without max_new_tokens stops at %d speech "
                           "tokens (%g s) per text chunk; point the checkpoint at real weights to hear speech",
                           checkpoint.directory, RANDOM_WEIGHTS_TOKEN_CAP, RANDOM_WEIGHTS_TOKEN_CAP / 25)
        device = parse_device(device)
        if not isinstance(dtype, torch.dtype):  # a torch dtype is a choice already resolved
            dtype = resolve_dtype(dtype, device)
        text_encoder = load_text_encoder(variant, checkpoint.directory, language_steps=language_steps)
        t3 = load_t3(checkpoint, dtype=dtype, device=device)
        s3gen = S3Gen.from_checkpoint(checkpoint, dtype=dtype, device=device, voice_models=voice_models)
        front_end = VoiceFrontEnd.from_checkpoint(checkpoint, device=device, s3gen=s3gen) if voice_models else None
        return cls(checkpoint, t3, s3gen, text_encoder, front_end, random_weights=checkpoint.has_random_weights)

    @property
    def variant(self) -> Variant:
        return self.checkpoint.variant

    @property
    def device(self) -> torch.device:
        return self.t3.device

    def builtin_voice(self) -> Voice:
        """The checkpoint's ``conds.pt`` voice (read once)."""
        with self._lock:
            if self._builtin is None:
                if not self.checkpoint.has_builtin_voice():
                    raise CheckpointNotFoundError(
                        f"the checkpoint at {self.checkpoint.directory} has no built-in voice "
                        f"({self.variant.files.conds}); pass a reference clip or a voice file")
                self._builtin = Voice.from_conditionals(self.checkpoint.builtin_voice_state())
            return self._builtin

    def conversion_planner(self, config=None):
        """A :class:`chorus.conversion.ConversionPlanner` over this checkpoint's S3Gen and built-in
        voice (needs the voice models: ``voice_models=True``)."""
        from chorus.conversion.config import ConversionConfig
        from chorus.conversion.planner import ConversionPlanner

        return ConversionPlanner.for_s3gen(self.s3gen, builtin_voice=self.builtin_voice,
                                           config=config or ConversionConfig())

    def planner(self, max_chars: int = DEFAULT_MAX_CHARS, *, alignment: bool = False) -> RequestPlanner:
        """``alignment``: the T3 engine keeps alignment queries, so timings may come from T3's attention."""
        build = None if self.front_end is None else self.front_end.build
        return RequestPlanner(self.variant, self.text_encoder, builtin_voice=self.builtin_voice,
                              build_voice=build, max_chars=max_chars, random_weights=self.random_weights,
                              alignment=alignment)
