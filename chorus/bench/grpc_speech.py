"""``chorus bench online --protocol grpc``: the load test's requests over the Riva gRPC door
(``chorus serve --grpc-port``; docs/grpc.md) instead of ``POST /v1/audio/speech``. A request is
``SynthesizeOnline`` with one ``SynthesizeSpeechRequest`` (LINEAR_PCM at 24 kHz, so audio seconds
are counted as for ``pcm``), its pieces read as they come; time to first audio is to the first
piece. Refusals are data as over HTTP: ``RESOURCE_EXHAUSTED`` counts as 429, ``UNAVAILABLE`` as
503, ``DEADLINE_EXCEEDED`` as 504 (before any audio), with the server's ``retry-after`` and
error code from the trailing metadata. The server's ``/metrics`` is still read over HTTP."""
from __future__ import annotations

import itertools
import time

from chorus.bench.online_bench import SAMPLE_RATE, Outcome, Playback

_STATUSES = {"RESOURCE_EXHAUSTED": "429", "UNAVAILABLE": "503", "DEADLINE_EXCEEDED": "504"}
REFUSED = ("INVALID_ARGUMENT", "UNAUTHENTICATED", "NOT_FOUND", "UNIMPLEMENTED")  # the request itself is refused
# speech body fields sent as custom_configuration (the rest map onto Riva's own fields)
_KNOBS = ("exaggeration", "cfg_weight", "temperature", "top_p", "min_p", "top_k", "repetition_penalty", "seed",
          "speed", "priority", "flow_steps", "max_new_tokens", "deadline_s", "model")


def riva_request(body: dict):
    """The Riva request of a speech body (``online_bench.request_body``): ``input`` -> ``text``,
    ``voice`` -> ``voice_name``, ``language`` -> ``language_code``, Chatterbox's fields ->
    ``custom_configuration``; LINEAR_PCM at the model's rate."""
    from chorus.server.grpc.messages import SynthesizeSpeechRequest

    unknown = set(body) - {"input", "voice", "language", "response_format", "stream", *_KNOBS}
    if unknown:
        raise ValueError(f"--protocol grpc cannot send {', '.join(sorted(unknown))}")
    request = SynthesizeSpeechRequest(text=body["input"], encoding=1, sample_rate_hz=SAMPLE_RATE,
                                      voice_name="" if body.get("voice", "default") == "default" else body["voice"],
                                      language_code=body.get("language") or "")
    for key in _KNOBS:
        if body.get(key) is not None:
            request.custom_configuration[key] = str(body[key])
    return request


class GrpcSpeechClient:
    """``connections`` channels to ``target`` (each its own TCP connection, as the HTTP client
    keeps one per client), used in turn; ``async with`` closes them."""

    def __init__(self, target: str, api_key: str | None, connections: int, timeout_s: float, tls: bool = False):
        import grpc

        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", -1)]
        make = (lambda: grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(), options=options)) if tls \
            else (lambda: grpc.aio.insecure_channel(target, options=options))
        self._channels = [make() for _ in range(max(1, connections))]
        self._next = itertools.cycle(range(len(self._channels)))
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.timeout_s = timeout_s
        self._request = None

    async def __aenter__(self) -> "GrpcSpeechClient":
        return self

    async def __aexit__(self, *exc) -> None:
        for channel in self._channels:
            await channel.close()

    def _stream(self):
        from chorus.server.grpc.messages import SERVICE, SynthesizeSpeechRequest, SynthesizeSpeechResponse

        channel = self._channels[next(self._next)]
        return channel.stream_stream(f"/{SERVICE}/SynthesizeOnline",
                                     request_serializer=SynthesizeSpeechRequest.SerializeToString,
                                     response_deserializer=SynthesizeSpeechResponse.FromString)

    async def speak(self, body: dict, outcome: Outcome, playback: Playback, start: float) -> None:
        """One request, read to its end; fills ``outcome`` as ``online_bench._exchange`` does."""
        import grpc

        if self._request is None:
            self._request = riva_request(body)
        call = self._stream()(iter([self._request]), metadata=self.metadata, timeout=self.timeout_s)
        try:
            outcome.version = dict(await call.initial_metadata() or ()).get("x-chorus-model-version")
            async for reply in call:
                now = time.perf_counter()
                if not reply.audio:
                    continue
                if outcome.ttfa_s is None:
                    outcome.ttfa_s = now - start
                    outcome.status = "cut"  # until the stream ends cleanly
                outcome.bytes += len(reply.audio)
                playback.receive(now, len(reply.audio) / 2 / SAMPLE_RATE)
        except grpc.aio.AioRpcError as error:
            outcome.e2e_s = time.perf_counter() - start
            name = error.code().name
            outcome.grpc_status, outcome.message = name, error.details()
            trailing = dict(error.trailing_metadata() or ())
            outcome.code = trailing.get("chorus-error-code", name.lower())
            if outcome.ttfa_s is None and name == "UNAVAILABLE" and "chorus-error-code" not in trailing:
                outcome.status = "client_error"  # no answer from the server (refused, reset, unreachable)
            elif outcome.ttfa_s is None:
                outcome.status = _STATUSES.get(name, "other")
                retry = trailing.get("retry-after")
                outcome.retry_after_s = float(retry) if retry is not None else None
            return
        outcome.e2e_s = time.perf_counter() - start
        outcome.status = "ok"
