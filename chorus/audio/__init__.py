"""Audio input: decoding, resampling, loudness, and reference-clip preparation."""
from chorus.audio.errors import AudioDecodeError, AudioError, AudioTooLongError, ReferenceAudioError
from chorus.audio.io import DecodedAudio, decode_audio, load_audio
from chorus.audio.loudness import integrated_loudness, normalize_loudness
from chorus.audio.reference import ReferenceAudio, ReferencePolicy, check_reference, prepare_reference
from chorus.audio.resample import SincResampler, resample

__all__ = [
    "AudioDecodeError", "AudioError", "AudioTooLongError", "ReferenceAudioError", "DecodedAudio", "decode_audio", "load_audio",
    "integrated_loudness", "normalize_loudness", "ReferenceAudio", "ReferencePolicy", "check_reference",
    "prepare_reference", "SincResampler", "resample",
]
