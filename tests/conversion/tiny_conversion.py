"""Tiny random-weight models for voice-conversion tests: the tiny pipeline's models with an S3
tokenizer and a CAMPPlus of one layer each added to their S3Gen (real code, random weights)."""
from __future__ import annotations

import functools
import os

import numpy as np
import torch

from chorus.audio import load_audio
from chorus.models.s3gen.s3gen import S3Gen
from chorus.pipeline.models import SpeechModels
from tests.conftest import DATA_DIR
from tests.pipeline.tiny_pipeline import tiny_models
from tests.voices.front_ends import tiny_front_end


@functools.cache
def _s3gen_with_voice_models(name: str) -> S3Gen:
    base = tiny_models(name).s3gen
    front = tiny_front_end()
    return S3Gen(base.variant, base.flow, base.mel2wav, tokenizer=front.s3_tokenizer,
                 speaker_encoder=front.campplus).eval()


def tiny_conversion_models(name: str) -> SpeechModels:
    """:func:`tests.pipeline.tiny_pipeline.tiny_models` whose S3Gen carries voice models."""
    models = tiny_models(name)
    models.s3gen = _s3gen_with_voice_models(name)
    return models


@functools.cache
def _speech_16k() -> np.ndarray:
    return load_audio(os.path.join(DATA_DIR, "sample-01.mp3"), 16000).samples


def speech(seconds: float, rate: int = 16000) -> np.ndarray:
    """The first ``seconds`` of a real speech clip, at ``rate``."""
    wav = _speech_16k()[: int(seconds * 16000)]
    if rate != 16000:
        from chorus.audio import resample

        wav = resample(wav, 16000, rate)
    return np.ascontiguousarray(wav, dtype=np.float32)


def torch_speech(seconds: float) -> torch.Tensor:
    return torch.from_numpy(speech(seconds))
