"""A Riva ``SynthesizeSpeechRequest`` as a speech body: which model and voice its ``voice_name``
names, its language, Chatterbox's knobs from ``custom_configuration`` (typed and range-checked by
the body's own schema), its deadline, its word timings (``enable_word_time_offsets``: the body's
``timestamps``), and its zero-shot clip as audio the voice front end reads.
Every refusal names the Riva field at fault. docs/grpc.md, "Field mapping"."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from chorus.server.errors import validation_error
from chorus.server.grpc.errors import invalid
from chorus.server.schemas import SpeechBody

# custom_configuration: key -> the type its text is read as (each is the speech body's field of that name)
KNOBS = {"exaggeration": float, "cfg_weight": float, "temperature": float, "top_p": float, "min_p": float,
         "top_k": int, "repetition_penalty": float, "seed": int, "speed": float, "priority": str,
         "flow_steps": int, "max_new_tokens": int, "deadline_s": float, "model": str}
LINEAR_PCM, FLAC, MULAW, OGGOPUS, ALAW = 1, 2, 3, 4, 20


@dataclass
class Parsed:
    body: SpeechBody
    clip: bytes | None  # the zero-shot reference clip (a file the front end decodes), or None


def parse(request, models: list[dict], deadline_s: float | None, max_deadline_s: float) -> Parsed:
    """``request`` against the models this server has (``Backend.model_cards``; the first is the
    default) and the client's remaining deadline (None: none)."""
    if request.custom_dictionary:
        raise invalid("custom_dictionary", "pronunciation dictionaries are not supported by Chatterbox models; "
                                           "leave it empty")
    if not request.text:
        raise invalid("text", "the text to speak is empty")
    knobs = _knobs(request.custom_configuration)
    ids = [card["id"] for card in models]
    model, voice = _model_and_voice(request.voice_name, ids, knobs.pop("model", None))
    if model not in ids:
        raise invalid("custom_configuration.model", f"model {model!r} is not served here; use one of: "
                                                    f"{', '.join(ids)}")
    card = next(c for c in models if c["id"] == model)
    fields = dict(model=model, input=request.text, voice=voice, response_format="pcm", stream=True,
                  language=_language(request.language_code, card),
                  timestamps="word" if request.enable_word_time_offsets else None, **knobs)
    if deadline_s is not None and "deadline_s" not in fields and deadline_s <= max_deadline_s:
        fields["deadline_s"] = max(deadline_s, 1e-3)
    try:
        body = SpeechBody(**fields)
    except ValidationError as exc:
        raise validation_error(exc) from None
    clip = None
    if request.HasField("zero_shot_data") and request.zero_shot_data.audio_prompt:
        if voice != "default":
            raise invalid("zero_shot_data", "give a voice_name or zero_shot_data, not both")
        clip = prompt_clip(request.zero_shot_data)
    return Parsed(body, clip)


def _knobs(config) -> dict:
    knobs = {}
    for key, text in config.items():
        kind = KNOBS.get(key)
        if kind is None:
            raise invalid(f"custom_configuration.{key}",
                          f"unknown key; the keys are {', '.join(sorted(KNOBS))} (docs/grpc.md)")
        try:
            knobs[key] = kind(text.strip())
        except ValueError:
            kind_name = "an integer" if kind is int else "a number"
            raise invalid(f"custom_configuration.{key}", f"{text!r} is not {kind_name}") from None
    return knobs


def _model_and_voice(voice_name: str, ids: list[str], model: str | None) -> tuple[str, str]:
    """``voice_name`` is ``VOICE`` or ``MODEL.VOICE`` (what GetRivaSynthesisConfig lists); VOICE
    is ``default`` (the built-in voice), a voice id or a voice's name; empty: the default voice."""
    voice = voice_name.strip()
    for candidate in ids:
        if voice.startswith(candidate + "."):
            if model is not None and model != candidate:
                raise invalid("voice_name", f"names model {candidate!r} but custom_configuration.model is {model!r}")
            model, voice = candidate, voice[len(candidate) + 1:]
            break
    return model or ids[0], voice or "default"


def _language(code: str, card: dict) -> str | None:
    """The body's language of Riva's ``language_code`` (``en-US`` -> ``en``) on a multilingual
    model; a model of one language takes English codes (or none) and ignores them."""
    language = code.strip().split("-")[0].split("_")[0].lower()
    if card.get("languages"):
        return language or None
    if language not in ("", "en"):
        raise invalid("language_code", f"model {card['id']!r} speaks English only; send en-US or use a "
                                       "multilingual model")
    return None


def prompt_clip(data) -> bytes:
    """The zero-shot clip as a file: as sent (WAV, FLAC, Ogg/Opus, MP3: read by content), or raw
    samples (LINEAR_PCM 16-bit, MULAW, ALAW without a header) wrapped in a WAV at
    ``sample_rate_hz`` (mu-law and A-law: 8000 unless given)."""
    from chorus.audio.pcm import from_alaw, from_mulaw
    from chorus.audio.streaming import wav_stream_header

    audio, encoding, rate = bytes(data.audio_prompt), data.encoding, data.sample_rate_hz
    if encoding not in (LINEAR_PCM, MULAW, ALAW) or audio[:4] == b"RIFF":
        return audio
    if encoding == LINEAR_PCM:
        if rate <= 0:
            raise invalid("zero_shot_data.sample_rate_hz", "raw LINEAR_PCM audio needs its sample rate (or send a "
                                                           "WAV file)")
        samples = np.frombuffer(audio[:len(audio) // 2 * 2], "<i2")
    else:
        decode = from_mulaw if encoding == MULAW else from_alaw
        samples, rate = decode(np.frombuffer(audio, np.uint8)), rate or 8000
    pcm = samples.astype("<i2").tobytes()
    return wav_stream_header(rate, len(pcm)) + pcm
