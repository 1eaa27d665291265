"""A voice front end of shrunken real models (random weights, one layer each): a voice build
takes milliseconds, while clip decoding and validation are the real ones."""
from __future__ import annotations

import threading

import torch

from chorus.models.campplus import CAMPPlus, CAMPPlusConfig
from chorus.models.s3tokenizer import S3TokenizerConfig, S3TokenizerV2
from chorus.models.variants import get_variant
from chorus.models.voice_encoder import VoiceEncoder, VoiceEncoderConfig
from chorus.voices import VoiceFrontEnd

ORIGINAL = get_variant("original")


def tiny_front_end(variant=ORIGINAL) -> VoiceFrontEnd:
    torch.manual_seed(0)
    return VoiceFrontEnd(
        variant,
        VoiceEncoder(VoiceEncoderConfig(hidden_size=32, num_layers=1)).eval(),
        S3TokenizerV2(S3TokenizerConfig(width=64, heads=4, layers=1)).eval(),
        CAMPPlus(CAMPPlusConfig(blocks=((1, 1), (1, 2), (1, 2)))).eval(),
    )


class CountingFrontEnd(VoiceFrontEnd):
    """A real front end (the models of ``inner``) that counts the clips it prepares and the voices
    it builds; with ``barrier``, every build first waits there, so that builds in several threads
    are sure to overlap."""

    def __init__(self, inner: VoiceFrontEnd, *, barrier: threading.Barrier | None = None):
        super().__init__(inner.variant, inner.voice_encoder, inner.s3_tokenizer, inner.campplus)
        self.prepares = 0
        self.builds = 0
        self._barrier = barrier
        self._lock = threading.Lock()

    def prepare(self, source, **kwargs):
        with self._lock:
            self.prepares += 1
        return super().prepare(source, **kwargs)

    def build(self, source, **kwargs):
        with self._lock:
            self.builds += 1
        if self._barrier is not None:
            self._barrier.wait(timeout=60)
        return super().build(source, **kwargs)
