"""Voices: reference clip -> conditioning for T3 and S3Gen."""
from chorus.voices.builder import S3GenPrompt, VoiceFrontEnd, build_voice, prepare_voice_audio, s3gen_prompt
from chorus.voices.voice import Voice, VoiceFormatError

__all__ = ["S3GenPrompt", "Voice", "VoiceFormatError", "VoiceFrontEnd", "build_voice", "prepare_voice_audio",
           "s3gen_prompt"]
