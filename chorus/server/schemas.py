"""Request and response bodies of the HTTP API (they make the OpenAPI schema at /openapi.json).

Ranges here are the API's limits; the pipeline's planner checks the rest against the loaded
variant (e.g. which sampling parameters it uses) and its errors become 400s too.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from chorus.sampling.params import MAX_SEED

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
PriorityName = Literal["high", "normal", "low"]


class SpeechBody(BaseModel):
    """``POST /v1/audio/speech``: OpenAI's fields, then Chatterbox's, then Chorus's.
    Unknown fields are an error (a misspelt parameter must not be silently ignored), and so
    are values of the wrong JSON type (``true`` or ``"5"`` for a number), as the schema says."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(description="a model id from GET /v1/models")
    input: str = Field(min_length=1, description="the text to speak (at most the server's max_input_chars)")
    voice: str = Field("default", min_length=1, max_length=64,
                       description="a voice id from GET /v1/voices; 'default' is the model's built-in voice")
    response_format: ResponseFormat = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0, description="playback speed; pitch is kept (FFmpeg atempo)")
    stream_format: Literal["audio", "sse"] = Field(
        "audio", description="'audio': the encoded audio as chunked bytes; 'sse': server-sent events "
                             "speech.audio.delta (base64 audio) then speech.audio.done")
    instructions: str | None = Field(None, description="not supported by Chatterbox; must be empty")
    stream: bool | None = Field(None, description="send the audio while it is generated (true) or as one "
                                                  "complete file once it is done (false); default: false for "
                                                  "wav and flac (complete headers), true otherwise")
    # Chatterbox
    exaggeration: float | None = Field(None, ge=0.0, le=2.0, description="emotion intensity (original and multilingual)")
    cfg_weight: float | None = Field(None, ge=0.0, le=5.0, description="classifier-free guidance weight; 0 turns it off")
    temperature: float | None = Field(None, ge=0.0, le=5.0, description="0 is greedy")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=100_000, description="0 turns top-k off")
    repetition_penalty: float | None = Field(None, ge=0.001, le=10.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="the same seed and input give the same audio")
    language: str | None = Field(None, min_length=2, max_length=8, description="ISO 639-1 code (multilingual)")
    # Chorus
    input_format: Literal["text", "ssml"] = Field(
        "text", description="'text': plain text, where <break time=\"500ms\"/> inserts a pause; 'ssml': the "
                            "SSML subset speak, p, s, break, prosody rate (docs/pauses.md)")
    priority: PriorityName | None = Field(None, description="overrides the X-Chorus-Priority header; default normal")
    deadline_s: float | None = Field(None, gt=0.0, description="total deadline: seconds until the request is "
                                                               "aborted, even while its audio flows (default: "
                                                               "the server's, none unless set; at most its max)")
    flow_steps: int | None = Field(None, ge=1, le=50, description="S3Gen solver steps (default: the variant's)")
    max_new_tokens: int | None = Field(None, ge=1, le=4096, description="speech tokens per text chunk "
                                                                        "(25 per second of audio)")
    timestamps: Literal["word", "character"] | None = Field(
        None, description="time the speech's words or characters (docs/timestamps.md): speech.timestamps events "
                          "with stream_format 'sse', else a JSON response {audio_base64, format, method, "
                          "words | alignment} sent whole")


class ConversionFields(BaseModel):
    """``POST /v1/audio/voice-conversion``'s text fields (multipart form fields, so values come
    as text and are converted: ``"7"`` is the integer 7, ``"true"`` is true). Its files are
    ``file`` (the source speech) and, optionally, ``voice_file`` (the target as a clip)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="a model id from GET /v1/models")
    voice: str | None = Field(None, min_length=1, max_length=64,
                              description="the target: a voice id from GET /v1/voices ('default': the model's "
                                          "built-in voice, also when neither voice nor voice_file is given)")
    response_format: ResponseFormat = "mp3"
    stream: bool | None = Field(None, description="as for speech: default false for wav and flac, true otherwise")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="the same seed and source give the same audio")
    flow_steps: int | None = Field(None, ge=1, le=50, description="S3Gen solver steps (default: the variant's)")
    priority: PriorityName | None = Field(None, description="overrides the X-Chorus-Priority header; default normal")
    deadline_s: float | None = Field(None, gt=0.0, description="total deadline, as for speech")


class ModelVersionCard(BaseModel):
    version: str = Field(description="the version label (X-Chorus-Model-Version of the responses it serves)")
    weight: int = Field(description="its share of the model's traffic, relative to the other versions")
    state: str = Field(description="starting, loading, warming, ready, failed or draining")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "chorus"
    variant: str | None = Field(None, description="the Chatterbox variant (original, multilingual, turbo, ...)")
    languages: list[str] = Field(default_factory=list, description="language codes (multilingual variants)")
    versions: list[ModelVersionCard] = Field(default_factory=list, description="the versions serving it")
    alias_of: str | None = Field(None, description="the model id this name is another name of")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class VoiceCard(BaseModel):
    id: str
    object: Literal["voice"] = "voice"
    name: str | None
    created_at: int
    duration_s: float | None
    variant: str | None


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceCard]


class VoiceDeleted(BaseModel):
    id: str
    object: Literal["voice"] = "voice"
    deleted: bool


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    ready: bool
    state: str
    reason: str | None = None
    degradation_level: int = 0
    degraded: list[str] = []  # why a model is degraded (its canary does not match its fingerprint)
