"""Reference clip -> :class:`Voice`, as each variant's reference ``prepare_conditionals`` does it.

For one clip (see :func:`chorus.audio.prepare_reference` for decoding and the clip rules):

1. the clip at 24 kHz (soxr HQ), brought to -27 LUFS for Turbo/Nano, which also need > 5 s;
2. a 16 kHz soxr copy of the whole clip: the VoiceEncoder embeds all of it (speaker embedding),
   its first 6 s (original, multilingual) or 15 s (Turbo, Nano) give T3's prompt tokens, capped at
   150 / 375 tokens;
3. S3Gen's conditioning from the first 10 s of the 24 kHz clip: its 24 kHz log-mel, and from a
   torchaudio-compatible 16 kHz resampling of it the CAMPPlus x-vector and the S3 prompt tokens,
   cut to ``floor(mel frames / 2)`` when the two lengths disagree.

:class:`VoiceFrontEnd` holds the three models (VoiceEncoder, S3 tokenizer, CAMPPlus) of one
checkpoint so they are loaded once.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Union

import numpy as np
import torch

from chorus.audio import DecodedAudio, ReferenceAudio, ReferencePolicy, SincResampler, prepare_reference
from chorus.audio.io import AudioSource
from chorus.models.campplus import CAMPPlus
from chorus.models.s3gen.mel import log_mel_spectrogram
from chorus.models.s3tokenizer import S3TokenizerV2
from chorus.models.variants import Variant
from chorus.models.voice_encoder import VoiceEncoder
from chorus.voices.voice import S3GenPrompt, Voice

S3GEN_SAMPLE_RATE = 24000
TOKENIZER_SAMPLE_RATE = 16000

VoiceSource = Union[AudioSource, DecodedAudio, ReferenceAudio, np.ndarray]


def prepare_voice_audio(source: VoiceSource, variant: Variant, *, sample_rate: int | None = None) -> ReferenceAudio:
    """Decode (unless given decoded samples) and validate a reference clip for ``variant``.

    ``source`` is a path, bytes, a binary file, a mono float array (with ``sample_rate``),
    :class:`DecodedAudio` or an already prepared :class:`ReferenceAudio` (returned as is when it
    was prepared for this variant's rules). Raises :class:`chorus.audio.AudioError` subclasses
    for undecodable, empty, silent or too-short clips.
    """
    policy = ReferencePolicy.for_variant(variant)
    if isinstance(source, ReferenceAudio):
        if replace(source.policy, max_seconds=policy.max_seconds, variant_name=policy.variant_name) != policy:
            raise ValueError(f"this reference clip was prepared for the {source.policy.variant_name} variant, "
                             f"whose clip rules differ from {variant.name}'s; prepare it again")
        return source
    if isinstance(source, np.ndarray):
        source = DecodedAudio.from_array(source, sample_rate, "a waveform")
    elif sample_rate is not None and not isinstance(source, DecodedAudio):
        raise ValueError("sample_rate is only for waveforms given as arrays")
    return prepare_reference(source, policy)


@torch.inference_mode()
def s3gen_prompt(wav_24k: np.ndarray | torch.Tensor, s3_tokenizer: S3TokenizerV2, campplus: CAMPPlus,
                 *, name: str = "") -> S3GenPrompt:
    """S3Gen conditioning of a 24 kHz clip (already cut to its first 10 s): the reference ``embed_ref``."""
    wav = torch.as_tensor(np.asarray(wav_24k, dtype=np.float32)).reshape(1, -1)
    mel, _ = log_mel_spectrogram(wav)
    mel = mel.transpose(1, 2).contiguous()  # [1, Tm, 80]
    wav_16k = SincResampler(S3GEN_SAMPLE_RATE, TOKENIZER_SAMPLE_RATE)(wav)[0]
    xvector = campplus.embed(wav_16k).cpu()
    tokens, lengths = s3_tokenizer.tokenize(wav_16k)
    tokens = tokens[:, : int(lengths[0])].cpu()
    if mel.shape[1] != 2 * tokens.shape[1]:
        # the reference keeps floor(Tm / 2) tokens (the mel itself is not changed)
        tokens = tokens[:, : mel.shape[1] // 2]
    return S3GenPrompt(tokens=tokens.long(), mel=mel.float(), xvector=xvector.float().reshape(1, -1), name=name)


@torch.inference_mode()
def build_voice(
    source: VoiceSource, variant: Variant, *, voice_encoder: VoiceEncoder, s3_tokenizer: S3TokenizerV2,
    campplus: CAMPPlus, name: str | None = None, sample_rate: int | None = None,
) -> Voice:
    """Build the conditioning of one reference clip for ``variant`` (see the module docstring).

    Raises :class:`chorus.audio.AudioError` subclasses (all ``ValueError``) for unusable clips.
    """
    reference = prepare_voice_audio(source, variant, sample_rate=sample_rate)
    speaker = voice_encoder.embed_utterance(reference.wav_16k).float().cpu().reshape(1, -1)
    t3_tokens, t3_lengths = s3_tokenizer.tokenize(reference.t3_prompt_16k, max_len=variant.t3.speech_cond_prompt_len)
    prompt = s3gen_prompt(reference.s3gen_prompt_24k, s3_tokenizer, campplus)
    if name is None:
        name = os.path.splitext(os.path.basename(os.fspath(source)))[0] if isinstance(source, (str, os.PathLike)) else ""
    return Voice(
        speaker_embedding=speaker,
        t3_prompt_tokens=t3_tokens[:, : int(t3_lengths[0])].cpu().long(),
        s3gen_prompt_tokens=prompt.tokens,
        s3gen_prompt_mel=prompt.mel,
        xvector=prompt.xvector,
        name=name,
        variant=variant.name,
    )


class VoiceFrontEnd:
    """The three models that turn reference clips into voices, loaded once per checkpoint."""

    def __init__(self, variant: Variant, voice_encoder: VoiceEncoder, s3_tokenizer: S3TokenizerV2, campplus: CAMPPlus):
        self.variant = variant
        self.voice_encoder = voice_encoder
        self.s3_tokenizer = s3_tokenizer
        self.campplus = campplus

    @classmethod
    def from_checkpoint(cls, checkpoint, *, device: str | torch.device | None = "cpu",
                        s3gen=None) -> "VoiceFrontEnd":
        """Load from a :class:`chorus.models.loading.Checkpoint`: the VoiceEncoder file and the
        ``tokenizer.*`` / ``speaker_encoder.*`` parts of the S3Gen file. Pass an already loaded
        :class:`chorus.models.s3gen.s3gen.S3Gen` (built with its voice models) as ``s3gen`` to reuse
        its tokenizer and CAMPPlus instead of reading the S3Gen file again."""
        from chorus.models.loading import parse_device

        device = parse_device(device)
        variant = checkpoint.variant
        ve_path = str(checkpoint.path(variant.files.voice_encoder))
        voice_encoder = VoiceEncoder.from_state_dict(checkpoint.voice_encoder_state(), device=device, source=ve_path)
        if s3gen is not None and s3gen.tokenizer is not None and s3gen.speaker_encoder is not None:
            return cls(variant, voice_encoder, s3gen.tokenizer, s3gen.speaker_encoder)
        state = checkpoint.s3gen_state()
        source = str(checkpoint.path(variant.files.s3gen))
        tokenizer = S3TokenizerV2.from_state_dict(state, prefix="tokenizer.", device=device, source=source)
        campplus = CAMPPlus.from_state_dict(state, prefix="speaker_encoder.", device=device, source=source)
        return cls(variant, voice_encoder, tokenizer, campplus)

    def prepare(self, source: VoiceSource, *, sample_rate: int | None = None) -> ReferenceAudio:
        """Decode and validate a clip without running any model (cheap; fails fast on bad input)."""
        return prepare_voice_audio(source, self.variant, sample_rate=sample_rate)

    def build(self, source: VoiceSource, *, name: str | None = None, sample_rate: int | None = None) -> Voice:
        """A :class:`Voice` from a reference clip (see :func:`build_voice`)."""
        return build_voice(source, self.variant, voice_encoder=self.voice_encoder, s3_tokenizer=self.s3_tokenizer,
                           campplus=self.campplus, name=name, sample_rate=sample_rate)
