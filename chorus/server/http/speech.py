"""The speech routes: ``POST /v1/audio/speech`` and ``POST /v1/audio/voice-conversion``. Each
parses its request, makes one call on the service (``speech``, ``convert``), and streams the
response it returns; a client that leaves before the first audio cancels the request at once,
and one that stops reading is dropped after ``write_stall_s``."""
from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import Response, StreamingResponse

from chorus.server.errors import StreamCut
from chorus.server.http.errors import ERRORS, UPLOAD_ERRORS
from chorus.server.http.middleware import ClientGone
from chorus.server.http.uploads import read_conversion
from chorus.server.registry import affinity_key
from chorus.server.schemas import ConversionFields, ErrorBody, SpeechBody

CONVERSION_PATH = "/v1/audio/voice-conversion"
# (the header is read by affinity_key; the parameter puts it in the OpenAPI schema)
AFFINITY_HELP = ("a key that keeps related requests (a conversation) on the same version of a model "
                 "split between versions (A/B); default: the API key, else none")


def install_speech(app: FastAPI, service, authorize) -> None:
    """Add the speech routes over ``service`` (a ``Backend``), guarded by ``authorize``."""

    @app.post("/v1/audio/speech", responses={**ERRORS, 200: {"content": {
        "audio/mpeg": {}, "audio/ogg": {}, "audio/aac": {}, "audio/flac": {}, "audio/wav": {}, "audio/pcm": {},
        "text/event-stream": {}, "application/json": {}},
        "description": "the audio, streamed as it is generated; with timestamps and not SSE, JSON with the "
                       "audio in base64 and the timings (docs/timestamps.md)"}},
        response_class=Response, dependencies=[Depends(authorize)], tags=["audio"])
    async def speech(body: SpeechBody, request: Request,
                     x_chorus_priority: str | None = Header(None, description="high, normal or low"),
                     x_chorus_affinity: str | None = Header(None, description=AFFINITY_HELP)):
        """Speak ``input``: OpenAI-compatible, plus Chatterbox's and Chorus's fields."""
        opening = asyncio.ensure_future(service.speech(body, x_chorus_priority, request.state.request_id,
                                                       arrived=time.perf_counter(),
                                                       affinity=affinity_key(request.headers)))
        response = await _unless_client_leaves(opening, request)
        return _StallBoundedResponse(response, service.config.write_stall_s)

    @app.post(CONVERSION_PATH, responses={**UPLOAD_ERRORS, 501: {"model": ErrorBody}, 200: {"content": {
        "audio/mpeg": {}, "audio/ogg": {}, "audio/aac": {}, "audio/flac": {}, "audio/wav": {}, "audio/pcm": {}},
        "description": "the converted audio, streamed as it is generated"}},
        response_class=Response, dependencies=[Depends(authorize)], tags=["audio"],
        openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
            "type": "object", "required": ["file", "model"], "properties": {
                "file": {"type": "string", "format": "binary", "description": "the source speech"},
                "voice_file": {"type": "string", "format": "binary",
                               "description": "the target voice as a reference clip (instead of voice)"},
                **ConversionFields.model_json_schema()["properties"]}}}}}})
    async def voice_conversion(request: Request,
                               x_chorus_priority: str | None = Header(None, description="high, normal or low"),
                               x_chorus_affinity: str | None = Header(None, description=AFFINITY_HELP)):
        """Speak the words of the source clip (``file``) in another voice (``voice``, a voice id,
        or ``voice_file``, a clip); docs/voice-conversion.md."""
        service.require_serving()
        form = await read_conversion(request, service.config.max_upload_bytes)
        opening = asyncio.ensure_future(service.convert(form, x_chorus_priority, request.state.request_id,
                                                        arrived=time.perf_counter(),
                                                        affinity=affinity_key(request.headers)))
        response = await _unless_client_leaves(opening, request)
        return _StallBoundedResponse(response, service.config.write_stall_s)


async def _unless_client_leaves(opening: asyncio.Future, request: Request):
    """What ``opening`` (a speech request waiting for its first audio) returns, unless the client
    disconnects first: then the request is cancelled at once (its admission place, T3 rows, KV
    blocks and vocoder work freed) instead of when its first audio would have come, and
    :class:`ClientGone` ends the route. After the body, the only message a client can send is
    ``http.disconnect``, so a pending ``receive()`` is the disconnect's event."""
    while True:
        leaving = asyncio.ensure_future(request.receive())
        try:
            await asyncio.wait((opening, leaving), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this task was cancelled (the server stops): so is the request
            opening.cancel()
            leaving.cancel()
            raise
        gone = leaving.done() and not leaving.cancelled() and leaving.exception() is None \
            and leaving.result().get("type") == "http.disconnect"
        if not gone:
            if not leaving.done():
                leaving.cancel()
            if opening.done():
                return opening.result()  # the response, or the APIError of a failure before the first audio
            continue  # some other message (none is expected after the body): watch again
        if opening.done():
            if not opening.cancelled() and opening.exception() is None:
                response = opening.result()  # opened as the client left: free what it holds
                await response.chunks.aclose()
                if response.on_close is not None:
                    response.on_close()
        else:
            opening.cancel()
            with contextlib.suppress(BaseException):
                await opening
        raise ClientGone()


class _StallBoundedResponse(StreamingResponse):
    """A streamed speech response whose client must keep reading: a write that waits longer
    than ``stall_s`` for the client (uvicorn holds writes while its buffer is full) drops the
    client: the session is told, the body closed (its pipeline request aborted) and the stream
    cut. Server-side buffering per response is then bounded by the transport's buffer and the
    request's own audio."""

    def __init__(self, response, stall_s: float):
        super().__init__(response.chunks, media_type=response.media_type, headers=response.headers)
        self._stall_s, self._on_stall, self._on_close = stall_s, response.on_stall, response.on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # however it ended, the body is closed now (not when it is collected) and its work freed
            await self.body_iterator.aclose()
            if self._on_close is not None:
                self._on_close()

    async def stream_response(self, send) -> None:
        async def bounded_send(message) -> None:
            try:
                await asyncio.wait_for(send(message), self._stall_s)
            except asyncio.TimeoutError:
                if self._on_stall is not None:
                    self._on_stall()
                await self.body_iterator.aclose()
                raise StreamCut("slow_reader", f"the client read nothing for {self._stall_s:g} s") from None

        await super().stream_response(bounded_send)
