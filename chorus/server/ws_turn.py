"""One turn of the voice-agent WebSocket: its text threshold, its pieces in the pipeline, its audio.

Text deltas go into the turn's :class:`~chorus.server.text_pieces.TextPieces`; every piece it cuts
is queued for the *starter* task, which admits and submits pieces (``SpeechService.open_call``:
the same checks, admission, degradation and deadlines as ``POST /v1/audio/speech``) and waits for
each one's first audio, at most ``PIPELINE_DEPTH`` pieces ahead of the one being sent. The
*sender* task streams the started pieces' audio in order through the turn's one encoder, as
binary frames, each piece's ``timestamps`` event after its audio when the connection asked for
them, then sends ``done``. An error ends the turn where the sender meets it (the audio
of the pieces before it is sent first); :meth:`Turn.cancel` ends it at once.
"""
from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from collections.abc import Awaitable, Callable

from chorus.models.s3gen.s3gen import SAMPLE_RATE
from chorus.pipeline.errors import PipelineError
from chorus.server.errors import APIError, pipeline_error
from chorus.server.speech import SpeechCall, turn_quality, usage
from chorus.server.text_pieces import Piece, TextPieces
from chorus.timestamps import shapes
from chorus.timestamps.chunks import shifted

logger = logging.getLogger("chorus.server")

# Pieces of one turn in the pipeline at once: the one being sent and the next, whose first audio
# is then ready when the first ends (generation runs faster than real time). More would hold more
# admission tickets and KV blocks for text that a barge-in usually throws away.
PIPELINE_DEPTH = 2
RAW_FORMATS = ("pcm", "pcm_24000", "pcm_16000", "pcm_8000", "mulaw_8000")  # encoded inline (no codec)
_END = object()


def audio_frame(turn_id: str, seq: int, data: bytes) -> bytes:
    """A binary frame: a big-endian u16 header length, the JSON header, the audio bytes."""
    header = json.dumps({"turn_id": turn_id, "seq": seq}, separators=(",", ":")).encode()
    return struct.pack(">H", len(header)) + header + data


class Turn:
    """One turn of ``connection`` (a ``ws_agent.Connection``: its settings, its backend, its
    sending and ``turn_ended``, which the turn calls once when it ends)."""

    def __init__(self, connection, turn_id: str, index: int, now: float):
        self.connection, self.id, self.index = connection, turn_id, index
        self.settings = connection.settings
        # the version this turn runs on: routed by the connection's key, anew for each turn (a
        # swap moves the next turn, never one under way)
        self.service = connection.backend.serving(self.settings.body.model, connection.affinity)
        self.text = TextPieces(self.settings.chunking, self.settings.language)
        self.flushed = False
        self.stopping = False  # cancelled or failed: nothing more of it is sent
        self.ended = False
        self.queued_chars = 0  # characters of pieces cut and not yet submitted
        self._pieces: asyncio.Queue = asyncio.Queue()  # cut pieces, then None after the flush
        self._ready: asyncio.Queue = asyncio.Queue()  # (call, first audio) in order, an APIError, or _END
        self._depth = asyncio.Semaphore(PIPELINE_DEPTH)
        self.calls: list[SpeechCall] = []
        self.piece_count = 0
        self.encoder = None
        self._encoding: asyncio.Future | None = None  # an encoder call running on a worker thread
        self.seq = 0
        self.samples = 0
        self.pieces_sent = 0  # pieces whose audio went out
        self.first_text_at = now
        self.flushed_at: float | None = None
        self.first_audio_at: float | None = None
        self.last_audio_at: float | None = None
        self.threshold_wait_s: float | None = None
        self.first_piece_cut_at: float | None = None  # time.monotonic(), the clock of the pipeline's timings
        self._timer: asyncio.TimerHandle | None = None
        # the methods, not their coroutines: a turn cancelled before its tasks first ran would
        # leave coroutines never awaited
        self._tasks = [asyncio.create_task(self._guarded(self._start_pieces)),
                       asyncio.create_task(self._guarded(self._send_audio))]

    # -- text (called by the connection's reader) --------------------------------------------
    @property
    def buffered_chars(self) -> int:
        """Characters received and not yet sent to synthesis."""
        return self.text.buffered + self.queued_chars

    def add_text(self, text: str, now: float) -> None:
        self._queue(self.text.push(text, now))
        self._arm_timer(now)

    def flush(self, now: float) -> None:
        self.flushed, self.flushed_at = True, now
        if self._timer is not None:
            self._timer.cancel()
        self._queue(self.text.flush(now))
        self._pieces.put_nowait(None)

    def _queue(self, pieces: list[Piece]) -> None:
        if pieces and self.first_piece_cut_at is None:
            self.first_piece_cut_at = time.monotonic()
        for piece in pieces:
            self.queued_chars += piece.end - piece.start
            self._pieces.put_nowait(piece)

    def _arm_timer(self, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.text.deadline()
        if deadline is not None and deadline > now and not self.flushed:
            self._timer = asyncio.get_running_loop().call_later(deadline - now, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.ended or self.flushed:
            return
        now = time.perf_counter()
        self._queue(self.text.poll(now))
        # the rest has its own oldest character; a timer that fired a hair early (the loop's
        # clock resolution) finds its deadline still ahead and is armed again; a deadline that
        # passed without a cut (a single word) waits for the next delta or the flush
        self._arm_timer(now)

    # -- the pipeline -------------------------------------------------------------------------
    async def _guarded(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run one of the turn's tasks: a lost connection ends it quietly (the connection cancels
        the turn), a bug ends the turn with ``internal_error``."""
        try:
            await work()
        except ConnectionAbortedError:
            pass
        except Exception:  # noqa: BLE001 - logged; the connection and the server go on
            logger.exception("voice-agent turn %s of %s failed", self.id, self.connection.id)
            if asyncio.current_task() is self._tasks[0]:
                await self._ready.put(APIError(500, "internal server error", code="internal_error"))
            else:
                await self._fail(APIError(500, "internal server error", code="internal_error"))

    async def _start_pieces(self) -> None:
        connection, service, settings = self.connection, self.service, self.settings
        while True:
            piece = await self._pieces.get()
            if piece is None:
                await self._ready.put(_END)
                return
            await self._depth.acquire()
            self.queued_chars -= piece.end - piece.start
            index = self.piece_count
            self.piece_count += 1
            if index == 0:
                self.threshold_wait_s = piece.waited_s
            try:
                if not connection.hub.draining:  # open turns finish while the server drains
                    service.require_serving()
                body = settings.body.model_copy(update={"input": piece.text})
                # a later piece continues the turn's stream: admitted with it, never refused
                continues = self.calls[-1].ticket if self.calls else None
                turn_key = f"{connection.id}.t{self.index}"
                call = await service.open_call(body, settings.priority, f"{turn_key}.p{index}", time.perf_counter(),
                                               voice=settings.voice, continues=continues, listener=turn_key)
            except APIError as error:
                await self._ready.put(error)
                return
            self.calls.append(call)
            await connection.send_event({"type": "piece", "turn_id": self.id, "piece": index, "text": piece.text,
                                         "char_start": piece.start, "char_end": piece.end})
            try:
                first = await call.first()
            except APIError as error:
                await self._ready.put(error)
                return
            await self._ready.put((call, first))

    async def _send_audio(self) -> None:
        while True:
            item = await self._ready.get()
            if item is _END:
                break
            if isinstance(item, APIError):
                await self._fail(item)
                return
            call, piece = item
            starts_at = self.samples / SAMPLE_RATE  # where the piece's audio starts in the turn's
            timed = []  # (chunk index, timings) of the piece's chunks, as each one's audio ends
            try:
                while piece is not None:
                    call.delivered(piece.samples.size)
                    self.samples += piece.samples.size
                    await self._send(await self._encode("write", piece.samples))
                    if piece.timings is not None:
                        timed.append((piece.chunk_index, shifted(piece.timings, starts_at)))
                    piece = await call.next()
            except PipelineError as exc:  # after its first audio: the turn ends with the error
                error = pipeline_error(exc)
                self.service.metrics.stream_cut(exc.reason, exc.deadline)
                call.end(error.code)
                await self._fail(error)
                return
            if timed:
                await self._send_timestamps(call, timed)
            self.pieces_sent += 1
            call.completed()
            call.end("ok")
            self._depth.release()
        if self.encoder is not None:
            await self._send(await self._encode("close"))
        await self.connection.send_event({
            "type": "done", "turn_id": self.id, "audio_seconds": round(self.samples / SAMPLE_RATE, 6),
            "usage": usage([c.stream for c in self.calls]),
            "quality": turn_quality([c.quality() for c in self.calls]),
            "timings": {"first_text_to_first_audio_s": _span(self.first_text_at, self.first_audio_at),
                        "flush_to_last_audio_s": _span(self.flushed_at, self.last_audio_at),
                        "threshold_wait_s": _round(self.threshold_wait_s),
                        "first_piece": self._first_piece_timings()}})
        self._end("done")

    async def _send_timestamps(self, call: SpeechCall, timed: list) -> None:
        """The ``timestamps`` event of a piece whose audio was all sent: its words (or characters)
        in seconds from the start of the turn's audio, as Cartesia's parallel lists."""
        if self.stopping:
            raise asyncio.CancelledError  # the turn is being cancelled: this task is about to be
        chunks = [timings for _, timings in timed]
        event = {"type": "timestamps", "turn_id": self.id, "piece": self.pieces_sent,
                 "method": shapes.method(chunks)}
        if self.settings.body.timestamps == "word":
            event["word_timestamps"] = shapes.word_lists(chunks)
        else:
            texts = [call.stream.plan.chunks[index].text for index, _ in timed]
            event["character_timestamps"] = shapes.character_lists(texts, chunks, leading_space=self.pieces_sent > 0)
        await self.connection.send_event(event)

    def _first_piece_timings(self) -> dict[str, float] | None:
        """Where the first piece's time went, in seconds from its cut (the end of the threshold's
        wait): ``submitted_s`` its pipeline request was submitted (admission, the voice, the plan),
        then the pipeline's ``first_token_s``, ``first_window_s``, ``first_pass_s`` and ``first_audio_s``
        (``SpeechResult.timings``). The turn's first frame left at ``first_text_to_first_audio_s``
        - ``threshold_wait_s`` on the same scale. None before the turn is done."""
        if not self.calls or self.first_piece_cut_at is None:
            return None
        stream = self.calls[0].stream
        result = stream.result(timeout=0)  # read to its end: the turn is done
        submitted = stream.submitted_at - self.first_piece_cut_at
        return {"submitted_s": _round(submitted),
                **{key: _round(submitted + seconds) for key, seconds in result.timings.items() if key != "total_s"}}

    async def _encode(self, method: str, *args) -> bytes:
        """Run an encoder call: raw formats inline, codecs on a worker thread (whose call a
        cancellation waits for before the encoder is freed)."""
        from chorus.audio.streaming import StreamEncoder

        fmt = self.settings.response_format
        started = time.perf_counter()
        if fmt in RAW_FORMATS:
            if self.encoder is None:
                self.encoder = StreamEncoder(fmt, SAMPLE_RATE)
            data = getattr(self.encoder, method)(*args)
        else:
            if self.encoder is None:
                self.encoder = await asyncio.to_thread(StreamEncoder, fmt, SAMPLE_RATE)
            self._encoding = asyncio.ensure_future(asyncio.to_thread(getattr(self.encoder, method), *args))
            data = await asyncio.shield(self._encoding)
        self.service.metrics.observe_stage("encode", time.perf_counter() - started)
        return data

    async def _send(self, data: bytes) -> None:
        if not data:
            return
        if self.stopping:
            raise asyncio.CancelledError  # the turn is being cancelled: this task is about to be
        await self.connection.send_bytes(audio_frame(self.id, self.seq, data))
        self.seq += 1
        now = time.perf_counter()
        if self.first_audio_at is None:
            self.first_audio_at = now
            self.service.metrics.ws_ttfa.observe(now - self.first_text_at)
        self.last_audio_at = now

    # -- endings ------------------------------------------------------------------------------
    async def _fail(self, error: APIError) -> None:
        """End the turn with ``error`` (from the sender task)."""
        self.stopping = True
        self._tasks[0].cancel()
        await asyncio.gather(self._tasks[0], return_exceptions=True)
        self._release("cancelled")
        await self.connection.send_error(error, self.id)
        self._end("error")

    async def cancel(self, status: str = "cancelled", outcome: str = "cancelled") -> None:
        """Stop the turn now: its text dropped, its pipeline requests cancelled, nothing more
        sent. Returns once no frame of it can follow (the caller then says ``cancelled``)."""
        self.stopping = True
        if self._timer is not None:
            self._timer.cancel()
        for call in self.calls:  # the pipeline drops their T3 rows and vocoder jobs now
            call.end(status)
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._release(status)
        self._end(outcome)

    def _release(self, status: str) -> None:
        """Give back everything the turn holds (idempotent)."""
        for call in self.calls:
            call.end(status)
        while not self._ready.empty():  # a piece started and not yet taken by the sender
            item = self._ready.get_nowait()
            if isinstance(item, tuple):
                item[0].end(status)
        if self.encoder is not None:
            encoder, encoding = self.encoder, self._encoding
            self.encoder = None
            if encoding is not None and not encoding.done():  # a codec call is running: free after it
                encoding.add_done_callback(lambda _: encoder.abort())
            else:
                encoder.abort()

    def _end(self, outcome: str) -> None:
        if self.ended:
            return
        self.ended = True
        if self._timer is not None:
            self._timer.cancel()
        self.connection.turn_ended(self, outcome)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(max(0.0, end - start), 6)
