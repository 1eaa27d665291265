"""A checked request's admission and submission: its admission ticket taken first (before any
thread-pool or model work: the text is not even tokenized, its length predicts its cost, so a
refusal costs arithmetic only), then its voice, its pipeline request with the current
degradation, and its submission on a worker thread. ``SpeechService`` (one model version) calls
these with itself as ``service`` after its checks (``checks.py``); they read its parts
(admission, capacity, degradation, pipeline, voices, metrics) and never call back into it.
Every failure raises an :class:`APIError` carrying its status, code and field.
"""
from __future__ import annotations

import asyncio

from chorus.engine.request import Priority
from chorus.pipeline.request import SpeechRequest
from chorus.sampling.params import InvalidSamplingParams
from chorus.server.admission import Ticket
from chorus.models.speech_tokens import TOKENS_PER_SECOND
from chorus.server.degradation import Applied
from chorus.server.errors import APIError
from chorus.server.schemas import SpeechBody
from chorus.server.speech import ConversionForm, SpeechCall
from chorus.server.voice_calls import request_voice, voice_call
from chorus.text.errors import MissingLanguagePackageError, TextError, UnsupportedLanguageError

_LOOK_UP = object()  # open_call's voice: look the body's voice up in the store


async def open_call(service, body: SpeechBody, priority: Priority, request_id: str, arrived: float, *,
                    voice=_LOOK_UP, clip: bytes | None = None, continues: Ticket | None = None,
                    listener: str | None = None) -> SpeechCall:
    """Admit a checked ``body`` (``checks.check_body``) and submit it to the pipeline: the
    :class:`SpeechCall` holding its ticket and stream. ``voice``: the voice already looked up
    (a stream looks it up once). ``clip``: a reference clip to speak in instead, built for this
    request only (``VoiceStore.build_clip``: an upload's checks, nothing kept). ``continues``:
    the ticket of the call before it in the same stream (a voice-agent turn's earlier piece),
    admitted as its continuation (``Admission.admit``). ``listener``: the pipeline's (``SpeechRequest.listener``: the pieces
    of one turn are heard one after another). Raises ``APIError``; whatever it took is given
    back. Cancelled while the pipeline plans the request (on a worker thread), the request is
    cancelled as soon as it exists."""
    ticket = _admit(service, priority, body, continues)
    try:
        if clip is not None:
            voice = await asyncio.to_thread(voice_call, service.voices.build_clip, clip, param="voice_clip")
        elif voice is _LOOK_UP:
            voice = await asyncio.to_thread(request_voice, service.voices, body.voice)
        pipeline_request, applied = _speech_request(service, body, voice, priority, request_id, listener)
        stream = await _submitted(_submit, service.pipeline, pipeline_request)
    except BaseException:
        service.admission.release(ticket)
        raise
    return SpeechCall(service, stream, ticket, applied, arrived)


async def open_conversion(service, form: ConversionForm, priority: Priority, request_id: str,
                          arrived: float) -> SpeechCall:
    """Admit and submit ``form``'s conversion: the source decoded and checked first (no model
    runs), then admitted by its length (25 speech tokens per second, no T3 rows), then planned
    (S3 tokens, the target's conditioning) and submitted on a worker thread.
    docs/voice-conversion.md, "HTTP"."""
    from chorus.conversion import ConversionRequest

    fields = form.fields
    if fields.voice is not None and form.voice_clip is not None:
        raise APIError(400, "give the target as 'voice' (a voice id) or as 'voice_file' (a clip), not both",
                       code="invalid_parameter", param="voice")
    planner = _conversion_planner(service.pipeline)
    source = await asyncio.to_thread(_conversion_call, planner.prepare_source, ConversionRequest(form.source))
    ticket = service.admission.admit(priority, tokens=source.duration * TOKENS_PER_SECOND, chars=0, rows=0,
                                     **load(service))
    try:
        if form.voice_clip is not None:
            target = form.voice_clip
        elif fields.voice is None or fields.voice == "default":
            target = None
        else:
            target = await asyncio.to_thread(request_voice, service.voices, fields.voice)
        request = ConversionRequest(source, voice=target, seed=fields.seed, flow_steps=fields.flow_steps,
                                    priority=priority, deadline_s=fields.deadline_s,
                                    stream=form.streams, request_id=request_id)
        stream = await _submitted(_conversion_call, service.pipeline.convert, request)
    except BaseException:
        service.admission.release(ticket)
        raise
    return SpeechCall(service, stream, ticket, Applied(level=service.degradation.level), arrived)


def load(service) -> dict:
    """What admission weighs a request against: the start deadline, the queue's limit at the
    current degradation level, and the KV pool's use and waiters at the last snapshot."""
    return dict(start_deadline_s=service.start_deadline_s,
                queue_limit=service.degradation.queue_limit(service.config.max_queue),
                kv_usage=service.snapshot.kv_usage, waiting=service.snapshot.t3_waiting)


def _admit(service, priority: Priority, body: SpeechBody, continues: Ticket | None) -> Ticket:
    """Admit ``body`` or raise a 429/503 ``APIError``: arithmetic on the latest estimates.
    ``continues``: the ticket of the earlier piece of the same stream (``Admission.admit``)."""
    config = service.config
    chars = len(body.input)
    cap = body.max_new_tokens if body.max_new_tokens is not None else config.max_new_tokens
    chunks = -(-chars // config.max_chars)
    tokens = service.capacity.predict_tokens(chars, chunks=chunks, max_new_tokens=cap)
    variant = service.pipeline.models.variant
    cfg_weight = body.cfg_weight if body.cfg_weight is not None else variant.sampling.cfg_weight
    rows = chunks * (2 if variant.t3.supports_cfg and cfg_weight > 0 else 1)
    return service.admission.admit(priority, tokens=tokens, chars=chars, rows=rows, continues=continues,
                                   **load(service))


def _speech_request(service, body: SpeechBody, voice, priority: Priority, request_id: str,
                    listener: str | None) -> tuple[SpeechRequest, Applied]:
    """The pipeline request of a checked body, with the current degradation applied."""
    config = service.config
    max_new_tokens = body.max_new_tokens if body.max_new_tokens is not None else config.max_new_tokens
    deadline = body.deadline_s if body.deadline_s is not None else config.default_deadline_s
    request = SpeechRequest(
        body.input, voice=voice, language=body.language, exaggeration=body.exaggeration,
        cfg_weight=body.cfg_weight, temperature=body.temperature, top_p=body.top_p, min_p=body.min_p,
        top_k=body.top_k, repetition_penalty=body.repetition_penalty, seed=body.seed,
        max_new_tokens=max_new_tokens, flow_steps=body.flow_steps, priority=priority,
        deadline_s=deadline, start_deadline_s=service.start_deadline_s, stream=True, listener=listener,
        input_format=body.input_format, timestamps=body.timestamps, request_id=request_id)
    request, applied = service.degradation.apply(request, service.pipeline.models.variant)
    for change in applied.changes:
        service.metrics.degraded.labels(change.split("=")[0]).inc()
    return request, applied


def _submit(pipeline, request: SpeechRequest):
    """Plan and start a request (on a worker thread: planning tokenizes the text). Bad input
    becomes a 400 naming the parameter."""
    try:
        return pipeline.submit(request)
    except InvalidSamplingParams as exc:
        raise APIError(400, str(exc), code="invalid_parameter", param=exc.param) from None
    except UnsupportedLanguageError as exc:
        raise APIError(400, str(exc), code="unsupported_language", param="language") from None
    except MissingLanguagePackageError as exc:
        raise APIError(400, f"{exc}", code="language_unavailable", param="language") from None
    except TextError as exc:
        raise APIError(400, str(exc), code="invalid_input", param="input") from None
    except ValueError as exc:
        raise APIError(400, str(exc), code="invalid_parameter") from None


def _conversion_planner(pipeline):
    """The pipeline's conversion planner, or a 501 when the checkpoint was loaded without the
    voice models it needs."""
    try:
        return pipeline.conversion_planner
    except ValueError as exc:
        raise APIError(501, f"voice conversion is not available on this server: {exc}",
                       code="not_supported") from None


def _conversion_call(fn, *args):
    """Call a conversion planner or ``Pipeline.convert``, mapping its input errors to API errors:
    the source (``SourceAudioError``: 413 too long, else 400), the target clip and the target
    voice's kind (400)."""
    from chorus.audio import AudioError
    from chorus.conversion import SourceAudioError
    from chorus.voices.voice import VoiceFormatError

    try:
        return fn(*args)
    except SourceAudioError as exc:
        code = "source_too_long" if exc.status == 413 else "invalid_source"
        raise APIError(exc.status, f"file: {exc}", code=code, param="file") from None
    except VoiceFormatError as exc:
        raise APIError(400, str(exc), code="voice_not_convertible", param="voice") from None
    except AudioError as exc:
        raise APIError(400, f"voice_file: {exc}", code="invalid_voice_clip", param="voice_file") from None


async def _submitted(submit, *args):
    """``submit(*args)`` (it starts a pipeline request and returns its stream) on a worker
    thread. Cancelled meanwhile, the request it starts is cancelled as soon as it exists."""
    submitting = asyncio.ensure_future(asyncio.to_thread(submit, *args))
    try:
        return await asyncio.shield(submitting)
    except asyncio.CancelledError:
        submitting.add_done_callback(_cancel_submitted)
        raise


def _cancel_submitted(submitting: "asyncio.Future") -> None:
    """A submission whose caller went away: cancel the request it started, if it started one."""
    if not submitting.cancelled() and submitting.exception() is None:
        submitting.result().cancel()
