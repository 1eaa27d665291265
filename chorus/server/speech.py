"""An admitted speech request and its response, on the process that holds the pipeline.

A :class:`SpeechCall` holds one pipeline request's admission ticket and stream and does the
bookkeeping every caller does (the HTTP and gRPC responses, each piece of a WebSocket turn).
:func:`respond` waits for a call's first audio, so that a failure before it raises an
:class:`APIError`, and returns a :class:`SpeechResponse` whose ``chunks`` stream the encoded
audio; the bookkeeping at its end (metrics, the ticket, cancelling when the client leaves)
lives in ``_Session``. ``speak.py`` checks, admits and submits the requests these serve.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from chorus.models.s3gen.s3gen import SAMPLE_RATE
from chorus.pipeline.errors import PipelineError
from chorus.pipeline.stitch import pause_samples
from chorus.quality.checks import AudioCheck
from chorus.models.speech_tokens import TOKENS_PER_SECOND
from chorus.server.errors import APIError, StreamCut, pipeline_error
from chorus.server.schemas import ConversionFields, SpeechBody
from chorus.timestamps import ChunkTimings, shapes
from chorus.timestamps.chunks import at_speed

logger = logging.getLogger("chorus.server")

QUALITY_HEADER = "X-Chorus-Quality-Flags"  # a response sent whole: its audio checks' flags, or "none"


@dataclass
class ConversionForm:
    """``POST /v1/audio/voice-conversion`` as read from its multipart body: the text fields
    (validated), the source clip's bytes, and the target clip's bytes if one was sent."""

    fields: ConversionFields
    source: bytes
    voice_clip: bytes | None = None

    @property
    def streams(self) -> bool:
        """As for speech: ``stream`` if given, else true except for wav and flac."""
        if self.fields.stream is not None:
            return self.fields.stream
        return self.fields.response_format not in WHOLE_BY_DEFAULT


@dataclass
class SpeechResponse:
    """What the HTTP layer sends: a media type, headers, and the body as it is produced.
    ``on_stall`` (if any) is called when the client stopped reading for ``write_stall_s`` and
    is being dropped, before ``chunks`` is closed. ``on_close`` (if any) is called once the
    response is over, however it ended, after ``chunks`` was closed: it frees what a body that
    never started (a client gone before the first write) still holds."""

    media_type: str
    headers: dict[str, str]
    chunks: AsyncIterator[bytes]
    on_stall: Callable[[], None] | None = None
    on_close: Callable[[], None] | None = None


@dataclass
class TimedSpeechResponse(SpeechResponse):
    """A response for a door that places the timings itself (gRPC's ``meta.words``):
    ``chunks`` yields ``(bytes, timings)``, the timings (``ChunkTimings`` in seconds of the
    response) of the text chunk whose audio ended in those bytes, or None."""

    chunks: AsyncIterator[tuple[bytes, ChunkTimings | None]]


async def respond(call: "SpeechCall", response_format: str, *, streaming: bool, speed: float = 1.0,
                  sse: bool = False, timestamps: str | None = None, timed: bool = False
                  ) -> SpeechResponse | TimedSpeechResponse:
    """The response of an admitted, submitted call: its encoder, then its first audio awaited
    (a failure before it is still a JSON error), then the body that streams the rest.
    ``timestamps`` (``"word"``, ``"character"``): SSE events of each chunk's timings, or, not
    SSE, a JSON response with the whole audio in base64 and the timings (docs/timestamps.md);
    with ``timed``, neither: a ``TimedSpeechResponse``, the chunks with their timings."""
    from chorus.audio.streaming import StreamEncoder, media_type  # PyAV: imported when first needed

    try:
        encoder = StreamEncoder(response_format, SAMPLE_RATE, speed=speed, streaming=streaming)
    except ValueError as exc:
        call.end(None)
        raise APIError(400, str(exc), code="invalid_parameter", param="speed") from None
    except BaseException:
        call.end(None)
        raise
    try:
        first = await call.first()
        if not streaming:  # sent whole: read it all first, so that its headers carry its checks
            await call.read_all(first)
    except BaseException:
        encoder.abort()
        raise
    headers = {"X-Chorus-Degradation": str(call.applied.level), "X-Chorus-Degraded": call.applied.header(),
               "X-Chorus-Seed": str(call.stream.plan.seed), "Cache-Control": "no-store"}
    if not streaming:
        headers[QUALITY_HEADER] = ",".join(call.quality().flags) or "none"
    cheap = response_format in ("wav", "pcm") and speed == 1.0  # no codec: encode inline
    session = _Session(call, encoder, first, cheap, speed=speed, timestamps=timestamps, response_format=response_format)
    if timed:
        return TimedSpeechResponse(media_type(response_format), headers, session.timed(), session.stalled,
                                   session.abandon)
    if sse:
        return SpeechResponse("text/event-stream", headers, session.sse(), session.stalled, session.abandon)
    if timestamps is not None:
        return SpeechResponse("application/json", headers, session.timestamped(), session.stalled, session.abandon)
    return SpeechResponse(media_type(response_format), headers, session.bytes(), session.stalled, session.abandon)


class SpeechCall:
    """One admitted pipeline request: its admission ticket, its stream and the bookkeeping every
    caller does (the HTTP response, each piece of a WebSocket turn): the start time and cost
    it teaches admission's capacity model, the audio delivered, the metrics at its end."""

    def __init__(self, service, stream, ticket, applied, arrived: float):
        self.service, self.stream, self.ticket, self.applied, self.arrived = service, stream, ticket, applied, arrived
        self.samples = 0  # audio delivered, at SAMPLE_RATE
        self.ended = False
        self.check = AudioCheck()  # the per-request audio checks, fed every piece as it is read
        self._report = None
        self._ahead: list = []  # pieces read ahead (``read_all``), in order

    async def next(self):
        """The stream's next audio piece, checked (None: the end). Audio that is not finite
        (NaN, inf) is never sent: it fails the request (``PipelineError``, as a failed model step).
        A pause's silence (a break in the input) is not speech: the checks skip it."""
        if self._ahead:
            return self._ahead.pop(0)
        piece = await self.stream._anext()
        if piece is not None and not piece.pause and not self.check.add(piece.samples):
            self.service.metrics.audio_flagged.labels("nonfinite").inc()
            logger.error("audio flagged: nonfinite (NaN or inf in the audio; the request fails)",
                         extra={"request_id": self.stream.request_id})
            raise PipelineError(self.stream.request_id, "error",
                                "the model produced audio that is not finite (NaN or inf); none of it was sent")
        return piece

    async def first(self):
        """The first audio piece (None: the request ended without audio). A failure before it
        raises its ``APIError`` and ends the call; so does being cancelled (re-raised)."""
        first = await self._before_audio(self.next())
        if first is not None:
            self.service.admission.started(self.ticket, time.perf_counter() - self.arrived)
        return first

    async def read_all(self, first) -> None:
        """Read the rest of the stream ahead, after ``first`` (a response sent whole: its headers
        then carry the audio checks, and a failure is still a JSON error)."""
        pieces = [first]
        while pieces[-1] is not None:
            pieces.append(await self._before_audio(self.next()))
        self._ahead = pieces[1:]

    async def _before_audio(self, reading):
        """Await ``reading`` (the stream's next piece) while no audio has gone out: a failure
        raises its ``APIError`` and ends the call; so does being cancelled (re-raised)."""
        service = self.service
        try:
            return await reading
        except PipelineError as exc:
            if exc.reason == "deadline":  # a miss: the prediction was at least this wrong
                service.admission.started(self.ticket, time.perf_counter() - self.arrived, audio=False)
                service.metrics.deadline_misses.labels(exc.deadline).inc()
            error = pipeline_error(exc)
            self.end(error.code)
            raise error from None
        except BaseException:  # the caller went away while waiting
            self.end(None)
            raise

    def quality(self):
        """The request's audio checks (a ``QualityReport``) once its stream has ended; the first
        call counts them in the metrics and logs a flagged request with its id."""
        if self._report is None:
            from chorus.pipeline.planner import SpeechPlan

            stream, result, service = self.stream, self.stream._result, self.service
            speech = isinstance(stream.plan, SpeechPlan) and result is not None
            report = self.check.report(text_chars=self.ticket.chars if speech else None,
                                       tokens=[c.tokens for c in result.chunks] if speech else None,
                                       expected_seconds_per_char=service.config.tokens_per_char / TOKENS_PER_SECOND)
            service.metrics.observe_quality(report)
            if report.flags:
                logger.warning("audio flagged: %s", ", ".join(report.flags),
                               extra={"request_id": stream.request_id, **report.as_dict()})
            self._report = report
        return self._report

    def _sample_quality(self) -> None:
        """Offer an ended speech request's audio to DNSMOS if it is sampled (never blocks)."""
        from chorus.pipeline.planner import SpeechPlan

        sampler, result, plan = self.service.sampler, self.stream._result, self.stream.plan
        if sampler is None or result is None or not isinstance(plan, SpeechPlan) or not sampler.sampled():
            return
        from chorus.quality.dnsmos import Job

        sampler.offer(Job(result.wav, result.sample_rate, float(plan.chunks[0].params.cfg_weight),
                          float(plan.exaggeration), self.stream.request_id))

    def delivered(self, samples: int) -> None:
        """``samples`` of its audio went out."""
        self.samples += samples
        self.service.admission.delivered(self.ticket, samples, SAMPLE_RATE)

    def completed(self) -> None:
        """Its stream ended normally: learn its queue time and cost, count its audio checks."""
        service, result = self.service, self.stream._result
        if result is not None:
            self.quality()
            self._sample_quality()
            if "first_token_s" in result.timings:
                service.metrics.queue_time.observe(result.timings["first_token_s"])
            service.capacity.observe_cost(self.ticket.chars, sum(c.speech_tokens for c in result.chunks),
                                          capped=any(c.finish_reason == "length" for c in result.chunks))

    def end(self, status: str | None) -> None:
        """The call is over (idempotent): the request cancelled unless it finished, the ticket
        given back, and (``status`` given) counted with the audio it delivered."""
        if self.ended:
            return
        self.ended = True
        if not self.stream.finished:
            self.stream.cancel()
        self.service.admission.release(self.ticket)
        if status is not None:
            self.service.metrics.requests.labels(status).inc()
            self.service.metrics.audio_seconds.inc(self.samples / SAMPLE_RATE)


WHOLE_BY_DEFAULT = ("wav", "flac")  # formats whose headers carry the length: sent complete unless streamed


def streams(body: SpeechBody) -> bool:
    """Whether the response streams: the body's ``stream``, else true except for wav and flac
    (whose streamed headers must say "length unknown"; docs/audio-formats.md). SSE streams
    unless ``stream`` is false; a response with timestamps that is not SSE is JSON sent whole."""
    if body.stream is not None:
        return body.stream
    if body.timestamps is not None and body.stream_format == "audio":
        return False
    return body.stream_format == "sse" or body.response_format not in WHOLE_BY_DEFAULT


def check_timestamps(body: SpeechBody) -> None:
    """Streamed audio bytes cannot carry timings: timestamps need SSE or a response sent whole."""
    if body.timestamps is not None and body.stream_format == "audio" and body.stream:
        raise APIError(400, "timestamps come as events of stream_format 'sse', or in a JSON response sent whole "
                            "(stream false or unset); streamed audio bytes cannot carry them",
                       code="invalid_parameter", param="timestamps")


class _Session:
    """One speech response being streamed: pieces -> encoder -> bytes, and the bookkeeping at
    the end (metrics, the admission ticket, cancel when the client leaves)."""

    def __init__(self, call: SpeechCall, encoder, first, cheap: bool, *, speed: float = 1.0,
                 timestamps: str | None = None, response_format: str = "mp3"):
        self.call, self.service, self.stream, self.encoder = call, call.service, call.stream, encoder
        self.first, self.arrived, self.cheap = first, call.arrived, cheap
        self.speed, self.timestamps, self.response_format = speed, timestamps, response_format
        self.closed = False
        self.client_stalled = False

    def stalled(self) -> None:
        """The client stopped reading and is being dropped (the HTTP layer closes the body next)."""
        self.client_stalled = True

    def abandon(self) -> None:
        """The response is over: if its body never started (the client left before the first
        write), do the bookkeeping ``timed`` would have done."""
        if self.call.ended:
            return
        self.encoder.abort()
        self.call.end("client_disconnected")

    async def _encode(self, fn, *args) -> bytes:
        """Run an encoder call: a codec on a worker thread (the event loop must not spend its
        time in one), PCM and WAV inline."""
        started = time.perf_counter()
        data = fn(*args) if self.cheap else await asyncio.to_thread(fn, *args)
        self.service.metrics.observe_stage("encode", time.perf_counter() - started)
        return data

    def _timings(self, piece) -> ChunkTimings | None:
        """A piece's chunk timings in seconds of the response (its pauses keep their length
        while the speech plays ``speed`` times faster), or None."""
        if piece.timings is None:
            return None
        pauses = self.stream.plan.pauses_s[:piece.chunk_index + 1]
        return at_speed(piece.timings, sum(pause_samples(p) for p in pauses) / SAMPLE_RATE, self.speed)

    async def timed(self) -> AsyncIterator[tuple[bytes, ChunkTimings | None]]:
        """(encoded bytes, the timings of the chunk that piece ended, or None), for pieces that
        gave either: every other body reads this one."""
        metrics = self.service.metrics
        status, sent_any = "ok", False
        try:
            piece = self.first
            while piece is not None:
                self.call.delivered(piece.samples.size)
                data = await self._encode(functools.partial(self.encoder.write, pause=piece.pause), piece.samples)
                if data and not sent_any:
                    sent_any = True
                    metrics.ttfa.observe(time.perf_counter() - self.arrived)
                timings = self._timings(piece)
                if data or timings is not None:
                    yield data, timings
                piece = await self.call.next()
            tail = await self._encode(self.encoder.close)
            self.closed = True
            if tail:
                if not sent_any:
                    metrics.ttfa.observe(time.perf_counter() - self.arrived)
                yield tail, None
            self.call.completed()
            metrics.e2e.observe(time.perf_counter() - self.arrived)
        except PipelineError as exc:  # after the first byte: cut the stream (the HTTP layer logs it)
            status = pipeline_error(exc).code
            metrics.stream_cut(exc.reason, exc.deadline)
            raise StreamCut(exc.reason, exc.message) from None
        except (asyncio.CancelledError, GeneratorExit):
            status = "client_disconnected"
            if self.client_stalled:
                status = "slow_reader"
                metrics.stream_cut("slow_reader")
            raise
        except Exception as exc:
            status = "internal_error"
            metrics.stream_cuts.labels("internal_error").inc()
            logger.exception("stream failed: %s", exc)
            raise
        finally:
            if not self.closed:
                self.encoder.abort()
            self.call.end(status)

    async def bytes(self) -> AsyncIterator[bytes]:
        async with contextlib.aclosing(self.timed()) as chunks:  # closing this closes it at once
            async for data, _ in chunks:
                if data:
                    yield data

    def _shaped(self, chunks: list[ChunkTimings], first_index: int) -> dict:
        """Timings as the API sends them: ``method`` and ``words`` or ``alignment``."""
        if self.timestamps == "word":
            return {"method": shapes.method(chunks), "words": shapes.words(chunks)}
        texts = [c.text for c in self.stream.plan.chunks[first_index:first_index + len(chunks)]]
        return {"method": shapes.method(chunks),
                "alignment": shapes.characters(texts, chunks, leading_space=first_index > 0)}

    async def sse(self) -> AsyncIterator[bytes]:
        index = 0
        async with contextlib.aclosing(self.timed()) as chunks:
            async for data, timings in chunks:
                if data:
                    event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")}
                    yield f"data: {json.dumps(event)}\n\n".encode()
                if timings is not None:
                    event = {"type": "speech.timestamps", "chunk": index, **self._shaped([timings], index)}
                    index += 1
                    yield f"data: {json.dumps(event)}\n\n".encode()
        done = {"type": "speech.audio.done", "usage": usage([self.stream]), "quality": self.call.quality().as_dict()}
        yield f"data: {json.dumps(done)}\n\n".encode()

    async def timestamped(self) -> AsyncIterator[bytes]:
        """The JSON response of a request with timestamps, sent whole: the audio in base64 and
        every chunk's timings."""
        audio, timings = [], []
        async with contextlib.aclosing(self.timed()) as chunks:
            async for data, chunk_timings in chunks:
                audio.append(data)
                if chunk_timings is not None:
                    timings.append(chunk_timings)
        yield json.dumps({"audio_base64": base64.b64encode(b"".join(audio)).decode("ascii"),
                          "format": self.response_format, **self._shaped(timings, 0)}).encode()


def usage(streams) -> dict[str, int]:
    """OpenAI's usage of finished pipeline streams: text tokens in, speech tokens out."""
    text_tokens = sum(len(c.text_ids) for s in streams for c in s.plan.chunks)
    speech_tokens = sum(c.speech_tokens for s in streams if s._result is not None for c in s._result.chunks)
    return {"input_tokens": text_tokens, "output_tokens": speech_tokens, "total_tokens": text_tokens + speech_tokens}


def turn_quality(reports) -> dict:
    """The audio checks of a voice-agent turn's pieces: every flag any piece raised, and each
    piece's checks (docs/quality.md)."""
    return {"flags": sorted({flag for report in reports for flag in report.flags}),
            "pieces": [report.as_dict() for report in reports]}
