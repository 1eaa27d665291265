"""Per-voice work the vocoder stage does once: prompt tensors on the device, the speaker vector.

What cannot be cached: the flow's conformer encoder and the flow-matching estimator attend over
the prompt and the new tokens jointly (full attention), so the prompt's hidden states change with
every new token; only the inputs that do not depend on the new tokens are kept.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from chorus.models.s3gen.flow import FlowDecoder
from chorus.voices import S3GenPrompt, Voice


@dataclass(frozen=True)
class VoicePrompt:
    """A voice's S3Gen conditioning, ready for a pass on the flow's device."""

    tokens: torch.Tensor  # [Tp] long
    host_tokens: list[int]  # the same tokens on the host, to lay out a pass's inputs there
    mel: torch.Tensor  # [Tm, 80] float32
    cond: torch.Tensor  # [80, Tm] in the flow's dtype: the solver's condition over the prompt's frames
    xvector: torch.Tensor  # [192] float32
    speaker: torch.Tensor  # [80] in the flow's dtype: the projected, normalised x-vector
    dropped_tokens: int = 0
    """Tokens cut from the start of the voice's prompt (``VocoderConfig.prompt_tokens``): a
    stream's noise tape keeps the full prompt's columns, so its new frames get the same noise
    with or without the cap."""

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[0]

    @property
    def mel_frames(self) -> int:
        return self.mel.shape[0]


def last_prompt_tokens(tokens: torch.Tensor, mel: torch.Tensor, keep: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The last ``keep`` prompt tokens ``[Tp]`` and their mel frames ``[Tm, 80]`` (None: all).

    Dropping ``d = Tp - keep`` tokens from the start drops the mel's first ``2 d`` frames (two
    frames per token), so the kept mel stays aligned with the kept tokens and keeps the prompt's
    parity: ``Tm - 2 Tp`` is unchanged (an odd last frame stays at the end). A mel shorter than
    ``2 d`` frames (not a well-formed prompt) loses all its frames.
    """
    drop = 0 if keep is None else max(0, tokens.shape[0] - keep)
    if not drop:
        return tokens, mel
    return tokens[drop:], mel[min(2 * drop, mel.shape[0]):]


def s3gen_part(voice: Voice | S3GenPrompt) -> S3GenPrompt:
    """The S3Gen conditioning of a voice (a :class:`S3GenPrompt` is its own)."""
    return voice.s3gen_prompt if isinstance(voice, Voice) else voice


class VoiceCache:
    """Bounded LRU of :class:`VoicePrompt` keyed by the S3Gen conditioning's content hash
    (``S3GenPrompt.content_hash``: voices that share it share an entry) and the prompt cap.

    ``prompt_tokens`` (``VocoderConfig.prompt_tokens``) keeps only the last that many prompt
    tokens and their mel frames (:func:`last_prompt_tokens`); None keeps the whole prompt. A
    call of :meth:`get` may cap the prompt further (``keep``); each cap is its own entry.
    """

    def __init__(self, flow: FlowDecoder, capacity: int, prompt_tokens: int | None = None):
        assert capacity >= 1 and (prompt_tokens is None or prompt_tokens >= 1)
        self.flow, self.capacity, self.prompt_tokens = flow, capacity, prompt_tokens
        self._entries: OrderedDict[tuple[str, int | None], VoicePrompt] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, voice: Voice | S3GenPrompt) -> bool:
        return self._key(s3gen_part(voice), None) in self._entries

    def _key(self, prompt: S3GenPrompt, keep: int | None) -> tuple[str, int | None]:
        caps = [cap for cap in (self.prompt_tokens, keep) if cap is not None]
        return prompt.content_hash, min(caps, default=None)

    @torch.inference_mode()
    def get(self, voice: Voice | S3GenPrompt, keep: int | None = None) -> VoicePrompt:
        """The voice's prompt on the device, cut to the last ``keep`` tokens when that is fewer
        than ``prompt_tokens`` leaves (None: as ``prompt_tokens`` leaves it)."""
        assert keep is None or keep >= 1, keep
        prompt = s3gen_part(voice)
        key = self._key(prompt, keep)
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return entry
        self.misses += 1
        device = self.flow.encoder_proj.weight.device
        xvector = prompt.xvector.to(device=device, dtype=torch.float32)
        tokens, mel = last_prompt_tokens(prompt.tokens[0], prompt.mel[0], key[1])
        mel = mel.to(device=device, dtype=torch.float32)
        entry = VoicePrompt(
            tokens=tokens.to(device=device, dtype=torch.long),
            host_tokens=[int(t) for t in tokens.tolist()],
            mel=mel, cond=mel.transpose(0, 1).to(self.flow.dtype).contiguous(),
            xvector=xvector[0],
            speaker=self.flow.speaker_projection(xvector)[0],
            dropped_tokens=prompt.tokens.shape[1] - tokens.shape[0],
        )
        self._entries[key] = entry
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return entry
