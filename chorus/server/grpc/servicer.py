"""``RivaSpeechSynthesis`` over a backend: each RPC checks its API key, turns its request into a
speech body (``requests.py``), makes one ``speech`` call on the backend, and sends the audio as
the request asks (``audio.py``). ``SynthesizeOnline`` speaks each request of its stream in turn
and sends each piece of audio as it is made; a cancelled RPC closes its response at once, which
cancels the pipeline request (its KV blocks and vocoder work freed). With
``enable_word_time_offsets``, a response's ``meta.words`` holds the words of the text chunks whose
audio ended in it (``Synthesize``: every word), and the RPC's trailing metadata names the method
(``chorus-timestamps-method``). Errors: ``errors.py``."""
from __future__ import annotations

import contextlib
import time
import uuid
from typing import AsyncIterator

import grpc

from chorus.server.backend import LocalBackend
from chorus.server.errors import APIError, StreamCut
from chorus.server.grpc import messages
from chorus.server.grpc.audio import RivaAudio
from chorus.server.grpc.errors import cut_status, status_of
from chorus.server.grpc.requests import parse
from chorus.server.keys import Keys
from chorus.server.registry import VERSION_HEADER
from chorus.timestamps import ChunkTimings, shapes

ENGLISH = "en-US"  # the language code listed for English models (Riva's clients send it by default)
METHOD_KEY = "chorus-timestamps-method"  # trailing metadata: alignment | estimate, with word time offsets


class RivaSynthesis:
    def __init__(self, backend: LocalBackend, keys: Keys):
        self.backend, self.keys = backend, keys

    def handler(self) -> grpc.GenericRpcHandler:
        request, response = messages.SynthesizeSpeechRequest, messages.SynthesizeSpeechResponse
        return grpc.method_handlers_generic_handler(messages.SERVICE, {
            "Synthesize": grpc.unary_unary_rpc_method_handler(
                self.synthesize, request.FromString, response.SerializeToString),
            "SynthesizeOnline": grpc.stream_stream_rpc_method_handler(
                self.synthesize_online, request.FromString, response.SerializeToString),
            "GetRivaSynthesisConfig": grpc.unary_unary_rpc_method_handler(
                self.synthesis_config, messages.RivaSynthesisConfigRequest.FromString,
                messages.RivaSynthesisConfigResponse.SerializeToString)})

    # ------------------------------------------------------------------------------------ RPCs
    async def synthesize(self, request, context):
        """The whole audio in one response."""
        try:
            self._authorize(context)
            audio, timings = [], []
            async with contextlib.aclosing(self._speak(request, context, whole=True, first=True)) as pieces:
                async for data, chunks in pieces:
                    audio.append(data)
                    timings += chunks
            self._name_method(request.enable_word_time_offsets, context, timings)
            return self._response(request, b"".join(audio), timings)
        except APIError as error:
            await self._fail(context, error)
        except StreamCut as cut:
            await context.abort(*cut_status(cut))

    async def synthesize_online(self, requests, context) -> None:
        """Each request of the stream spoken in turn, its audio sent piece by piece."""
        try:
            self._authorize(context)
            first, timings, timed = True, [], False
            async for request in requests:
                async with contextlib.aclosing(self._speak(request, context, whole=False, first=first)) as pieces:
                    first = False
                    async for data, chunks in pieces:
                        timings += chunks
                        await context.write(self._response(request, data, chunks))
                timed = timed or request.enable_word_time_offsets
            self._name_method(timed, context, timings)
        except APIError as error:
            await self._fail(context, error)
        except StreamCut as cut:
            await context.abort(*cut_status(cut))

    async def synthesis_config(self, request, context):
        """Per model and language: the model's name, its language code and its voices (the
        built-in voice and the library's, by id), as Riva's ``subvoices``."""
        try:
            self._authorize(context)
            self.backend.require_serving()
            voices = [info.id for info in await self.backend.list_voices()]  # the built-in "default" first
        except APIError as error:
            return await self._fail(context, error)
        subvoices = ",".join(f"{voice}:{index}" for index, voice in enumerate(voices))
        configs = []
        for card in self.backend.model_cards():
            if card.get("alias_of") or (request.model_name and request.model_name != card["id"]):
                continue
            for language in card.get("languages") or ["en"]:
                configs.append(dict(model_name=card["id"], parameters={
                    "language_code": ENGLISH if language == "en" else language, "voice_name": card["id"],
                    "subvoices": subvoices, "variant": str(card.get("variant") or ""), "sample_rate": "24000"}))
        if request.model_name and not configs:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model_name: {request.model_name!r} is not served here; "
                                f"use one of: {', '.join(self.backend.model_ids())}")
        return messages.RivaSynthesisConfigResponse(model_config=configs)

    # ----------------------------------------------------------------------------------- steps
    async def _speak(self, request, context, *, whole: bool, first: bool
                     ) -> AsyncIterator[tuple[bytes, list[ChunkTimings]]]:
        """One request's audio, encoded as it asks, piece by piece (``APIError`` before the first),
        each with the timings of the text chunks whose audio ended in it (none without
        ``enable_word_time_offsets``; a chunk that ended in audio the encoder held back goes with
        the next piece, and the last ones with the last). ``first``: the RPC's first request,
        whose response headers (the model version that serves it, ``x-chorus-model-version``) go
        out as the RPC's initial metadata."""
        arrived = time.perf_counter()
        parsed = parse(request, self.backend.model_cards(), context.time_remaining(),
                       self.backend.config.max_deadline_s)
        audio = RivaAudio(request.encoding, request.sample_rate_hz, whole=whole)
        body = parsed.body
        if parsed.clip is None and body.voice != "default":
            body = body.model_copy(update={"voice": await self._voice_id(body.voice)})
        try:
            response = await self.backend.speech(body, None, f"grpc-{uuid.uuid4().hex[:16]}", arrived=arrived,
                                                 voice_clip=parsed.clip, timed=True)
        except BaseException:
            audio.abort()
            raise
        try:
            if first and VERSION_HEADER in response.headers:
                await context.send_initial_metadata(((VERSION_HEADER.lower(), response.headers[VERSION_HEADER]),))
            timings: list[ChunkTimings] = []
            async for pcm, chunk in response.chunks:
                if chunk is not None:
                    timings.append(chunk)
                data = await audio.write(pcm) if pcm else b""
                if data:
                    yield data, timings
                    timings = []
            tail = await audio.close()
            if tail or timings:
                yield tail, timings
        finally:
            audio.abort()
            await response.chunks.aclose()
            if response.on_close is not None:
                response.on_close()

    async def _voice_id(self, voice: str) -> str:
        """A voice named by its id or, failing that, by the name it was uploaded with (when one
        voice has it)."""
        voices = await self.backend.list_voices()
        if any(info.id == voice for info in voices):
            return voice
        named = [info.id for info in voices if info.name == voice]
        return named[0] if len(named) == 1 else voice

    def _authorize(self, context) -> None:
        if not self.keys.keys:
            return
        metadata = {key.lower(): value for key, value in context.invocation_metadata() or ()}
        if not self.keys.bearer_matches(metadata.get("authorization")):
            raise APIError(401, "missing or invalid API key: send the metadata 'authorization: Bearer <key>'",
                           code="invalid_api_key", param="authorization")

    async def _fail(self, context, error: APIError) -> None:
        self.backend.record_error(error.code, error.rule)
        code, details, trailing = status_of(error)
        await context.abort(code, details, trailing)

    @staticmethod
    def _name_method(timed: bool, context, timings: list[ChunkTimings]) -> None:
        """With word time offsets (``timed``): the method that timed the words, as trailing
        metadata (Riva's response has no field for it)."""
        if timed:
            context.set_trailing_metadata(((METHOD_KEY, shapes.method(timings)),))

    @staticmethod
    def _response(request, audio: bytes, timings: list[ChunkTimings] = ()):
        response = messages.SynthesizeSpeechResponse(audio=audio)
        for word, start, end in shapes.words_ms(timings):
            response.meta.words.add(word=word, start_time=start, end_time=end)
        if request.HasField("id"):
            response.id.value = request.id.value
        return response
