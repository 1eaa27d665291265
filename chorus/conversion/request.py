"""What a caller asks of voice conversion (the CLI, the Python API, later the HTTP server)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chorus.engine.request import Priority

if TYPE_CHECKING:
    from chorus.conversion.source import SourceInput
    from chorus.voices.voice import S3GenPrompt, Voice


@dataclass
class ConversionRequest:
    """Convert the speech of ``source`` to the voice ``voice``.

    source: the speech to convert: a path, bytes, a binary file, ``DecodedAudio``, or a mono float
    array with ``sample_rate``.
    voice: the target: None (the checkpoint's built-in voice), a :class:`Voice` (e.g. from the
    voice store), an :class:`S3GenPrompt`, a ``.safetensors`` voice file, or a reference clip
    (path, bytes, file object) whose first 10 s become the target, as the reference's
    ``set_target_voice`` does.
    seed: fixes S3Gen's noise (None draws one). flow_steps: S3Gen solver steps (default: the
    variant's, 10 or meanflow's 2). stream, watermark, priority, deadline_s, start_deadline_s,
    request_id: as for :class:`chorus.pipeline.SpeechRequest`.
    """

    source: "SourceInput"
    voice: "Voice | S3GenPrompt | object | None" = None
    sample_rate: int | None = None
    seed: int | None = None
    flow_steps: int | None = None
    watermark: str | None = None
    priority: int = Priority.NORMAL
    deadline_s: float | None = None
    start_deadline_s: float | None = None
    stream: bool = False
    request_id: str | None = None
