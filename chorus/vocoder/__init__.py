"""The vocoder stage: batched, streaming S3Gen (speech tokens -> 24 kHz audio) beside the T3 engine.

See docs/vocoder.md.
"""
from chorus.vocoder.config import AudioOut, VocoderConfig, VocoderStats
from chorus.vocoder.stage import VocoderStage
from chorus.vocoder.voice_cache import VoiceCache, VoicePrompt

__all__ = ["AudioOut", "VocoderConfig", "VocoderStage", "VocoderStats", "VoiceCache", "VoicePrompt"]
