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
from chorus.voices import Voice


@dataclass(frozen=True)
class VoicePrompt:
    """A voice's S3Gen conditioning, ready for a pass on the flow's device."""

    tokens: torch.Tensor  # [Tp] long
    host_tokens: list[int]  # the same tokens on the host, to lay out a pass's inputs there
    mel: torch.Tensor  # [Tm, 80] float32
    cond: torch.Tensor  # [80, Tm] in the flow's dtype: the solver's condition over the prompt's frames
    xvector: torch.Tensor  # [192] float32
    speaker: torch.Tensor  # [80] in the flow's dtype: the projected, normalised x-vector

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[0]

    @property
    def mel_frames(self) -> int:
        return self.mel.shape[0]


class VoiceCache:
    """Bounded LRU of :class:`VoicePrompt` keyed by ``Voice.content_hash``."""

    def __init__(self, flow: FlowDecoder, capacity: int):
        assert capacity >= 1
        self.flow, self.capacity = flow, capacity
        self._entries: OrderedDict[str, VoicePrompt] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, voice: Voice) -> bool:
        return voice.content_hash in self._entries

    @torch.inference_mode()
    def get(self, voice: Voice) -> VoicePrompt:
        key = voice.content_hash
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return entry
        self.misses += 1
        device = self.flow.encoder_proj.weight.device
        xvector = voice.xvector.to(device=device, dtype=torch.float32)
        mel = voice.s3gen_prompt_mel[0].to(device=device, dtype=torch.float32)
        entry = VoicePrompt(
            tokens=voice.s3gen_prompt_tokens[0].to(device=device, dtype=torch.long),
            host_tokens=[int(t) for t in voice.s3gen_prompt_tokens[0].tolist()],
            mel=mel, cond=mel.transpose(0, 1).to(self.flow.dtype).contiguous(),
            xvector=xvector[0],
            speaker=self.flow.speaker_projection(xvector)[0],
        )
        self._entries[key] = entry
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return entry
