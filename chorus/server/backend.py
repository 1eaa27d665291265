"""What the front doors need from the process behind them: the seam between ``app.py`` (the HTTP
routes of ``http/`` and the WebSocket) and the models. :class:`chorus.server.registry.ModelRegistry`
implements it over the models of this process (one ``SpeechService`` per model version); a
deployment that forwards to engine replicas implements it too, so every deployment serves the
same API from the same routes."""
from __future__ import annotations

from typing import Protocol

from chorus.server.config import ServerConfig
from chorus.server.errors import APIError
from chorus.server.schemas import SpeechBody
from chorus.server.speech import ConversionForm, SpeechResponse, TimedSpeechResponse


class Backend(Protocol):
    config: ServerConfig
    state: str  # starting, loading, warming, ready or failed
    started_at: float  # wall clock (seconds since the epoch)

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    def readiness(self) -> tuple[bool, str | None]:
        """(ready, why not)."""

    def degraded(self) -> list[str]:
        """Why models are degraded (a canary that does not match its fingerprint), each naming
        its model; empty when none is."""

    @property
    def degradation_level(self) -> int: ...

    def require_serving(self) -> None:
        """Raise a 503 ``APIError`` unless requests can be served."""

    def model_ids(self) -> list[str]:
        """Every name a request may pass as ``model`` (ids and their aliases)."""

    def model_cards(self) -> list[dict]:
        """Per name: ``id``, ``variant``, ``languages``, ``versions`` (version, weight, state) and,
        for an alias, ``alias_of`` (``GET /v1/models``)."""

    def refusing(self) -> bool:
        """Whether some priority is being refused now whatever the text (cheap: no body needed);
        False when this backend cannot tell."""

    def certain_refusal(self, body: SpeechBody, priority_header: str | None) -> APIError | None:
        """The 429/503 every speech request of ``body``'s priority would get now, whatever its
        text, so the HTTP layer may answer it before routing; None when it depends on the request,
        the body would get another answer, or this backend cannot tell (the full path then runs)."""

    async def speech(self, body: SpeechBody, priority_header: str | None, request_id: str, *,
                     arrived: float, affinity: str | None = None) -> SpeechResponse:
        """Start a request; errors before its first audio raise ``APIError``. ``affinity``: the
        key that picks the version of a model split between versions (None: the request id)."""

    async def convert(self, form: ConversionForm, priority_header: str | None, request_id: str, *,
                      arrived: float, affinity: str | None = None) -> SpeechResponse:
        """Start a voice conversion; errors before its first audio raise ``APIError``."""

    async def add_voice(self, data: bytes, name: str | None): ...
    async def list_voices(self) -> list: ...
    async def voice_info(self, voice_id: str): ...
    async def delete_voice(self, voice_id: str) -> bool: ...

    async def metrics_text(self) -> bytes:
        """Prometheus text of everything this backend serves."""

    def record_error(self, code: str, rule: str | None = None) -> None:
        """Count an error answer the HTTP layer sent (``rule``: ``APIError.rule``)."""


class LocalBackend(Backend, Protocol):
    """A ``Backend`` whose models run in this process (``ModelRegistry``): what the gRPC door
    needs beyond HTTP's (it does not run in front of engine replicas; docs/grpc.md)."""

    async def speech(self, body: SpeechBody, priority_header: str | None, request_id: str, *,
                     arrived: float, affinity: str | None = None, voice_clip: bytes | None = None,
                     timed: bool = False) -> SpeechResponse | TimedSpeechResponse:
        """As ``Backend.speech``, and: ``voice_clip``, a reference clip to speak in for this
        request only (None: ``body.voice``); ``timed``, a ``TimedSpeechResponse`` whose chunks
        come with their timings (``SpeechService.speech``)."""
