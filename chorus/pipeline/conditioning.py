"""Voice -> T3 conditioning prefix, memoised per (voice, exaggeration).

The T3 engine takes a ready :class:`chorus.engine.engine.Conditioning` (cache key + embeddings);
building one runs the model's conditioning encoder (speaker projection, prompt embedding,
perceiver), so the pipeline keeps the recent ones here instead of recomputing them per chunk
or per request.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from chorus.engine.engine import Conditioning
from chorus.engine.request import conditioning_key
from chorus.models.t3.model import T3Model
from chorus.models.variants import Variant
from chorus.voices.voice import Voice


class ConditioningCache:
    """A bounded LRU of conditioning prefixes of one T3 model. Thread-safe."""

    def __init__(self, model: T3Model, variant: Variant, capacity: int = 256):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.model, self.variant, self.capacity = model, variant, capacity
        self._entries: OrderedDict[bytes, Conditioning] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, voice: Voice, exaggeration: float) -> Conditioning:
        """The conditioning of ``voice`` at ``exaggeration`` (ignored by variants without the
        emotion input, so all exaggerations share one entry there)."""
        exaggeration = float(exaggeration) if self.variant.t3.emotion_adv else 0.0
        key = conditioning_key(self.variant.name, voice.content_hash, exaggeration)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit
        with torch.inference_mode():
            embeds = self.model.encode_conditioning(voice.speaker_embedding, voice.t3_prompt_tokens, exaggeration,
                                                    prompt_embeds=voice.t3_prompt_embeds)
        entry = Conditioning(key, embeds)
        with self._lock:
            self._entries[key] = entry
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return entry

    def __len__(self) -> int:
        return len(self._entries)
