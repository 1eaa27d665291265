"""The caller's end of one request in the pipeline: audio pieces in order, then a result."""
from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterator

import numpy as np

from typing import TYPE_CHECKING

from chorus.pipeline.planner import SpeechPlan

if TYPE_CHECKING:
    from chorus.conversion.planner import ConversionPlan
from chorus.pipeline.errors import PipelineError
from chorus.pipeline.request import SpeechResult
from chorus.timestamps import ChunkTimings


@dataclass(frozen=True)
class AudioPiece:
    """The next samples of a request's audio (24 kHz float32), in order. ``chunk_index`` is the
    text chunk they belong to; ``final`` marks the request's last piece. ``pause``: the samples
    are a pause's exact silence (a break in the input before chunk ``chunk_index``, or after it
    when it is the last), which an encoder that changes the tempo must pass through unchanged.
    ``timings``: with ``SpeechRequest.timestamps``, on the last piece of each chunk, that chunk's
    timings in seconds of the request's audio (equal to the result's ``timestamps[chunk_index]``)."""

    samples: np.ndarray
    chunk_index: int
    final: bool
    pause: bool = False
    timings: ChunkTimings | None = None


_END = object()


class SpeechStream:
    """Iterate it (or ``async for`` it) for :class:`AudioPiece` objects, or call :meth:`result`
    for the whole waveform. A streaming request yields pieces while T3 is still generating; a
    non-streaming one yields its whole audio as one piece. Failures raise :class:`PipelineError`.
    Stopping early does not cancel the request: call :meth:`cancel` (the server does so when a
    client disconnects)."""

    def __init__(self, plan: "SpeechPlan | ConversionPlan", cancel: Callable[[str], None], submitted_at: float):
        self.plan = plan
        self.request_id = plan.request_id
        self.submitted_at = submitted_at
        """``time.monotonic()`` when the pipeline took the request: the zero of its result's ``timings``."""
        self._events: queue.Queue = queue.Queue()
        self._cancel = cancel
        self._result: SpeechResult | None = None
        self._error: PipelineError | None = None
        self._pieces: list[np.ndarray] = []
        self._closed = False
        # an asyncio consumer waiting for the next event: (its loop, the event to set)
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        self._waiter_lock = threading.Lock()

    # -- producer side (the pipeline's vocoder thread) ----------------------------------------
    def _put(self, event) -> None:
        self._events.put(event)
        with self._waiter_lock:
            waiter = self._waiter
        if waiter is not None:
            loop, ready = waiter
            try:
                loop.call_soon_threadsafe(ready.set)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
                pass

    def _put_audio(self, piece: AudioPiece) -> None:
        self._put(piece)

    def _finish(self, result: SpeechResult) -> None:
        self._put(result)
        self._put(_END)

    def _fail(self, error: PipelineError) -> None:
        self._put(error)
        self._put(_END)

    # -- consumer side -------------------------------------------------------------------------
    def _take(self, event) -> AudioPiece | None:
        """Account for one event; the piece it carries, if any."""
        if event is _END:
            self._closed = True
        elif isinstance(event, PipelineError):
            self._error = event
        elif isinstance(event, SpeechResult):
            self._result = event
        else:
            self._pieces.append(event.samples)
            return event
        return None

    def _end_or_raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _next(self, timeout: float | None) -> AudioPiece | None:
        """The next piece, or None at the end; raises the request's failure."""
        while not self._closed:
            try:
                event = self._events.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {self.request_id}: no audio within {timeout} s") from None
            if (piece := self._take(event)) is not None:
                return piece
        self._end_or_raise()
        return None

    async def _anext(self) -> AudioPiece | None:
        """:meth:`_next` for asyncio: waits on the loop, not on a thread, so thousands of
        streams cost no threads."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                ready = asyncio.Event()
                with self._waiter_lock:
                    self._waiter = (loop, ready)
                try:
                    if self._events.empty():  # nothing arrived between the check and the wait
                        await ready.wait()
                finally:
                    with self._waiter_lock:
                        self._waiter = None
                continue
            if (piece := self._take(event)) is not None:
                return piece
        self._end_or_raise()
        return None

    def __iter__(self) -> Iterator[AudioPiece]:
        while (piece := self._next(None)) is not None:
            yield piece

    async def __aiter__(self) -> AsyncIterator[AudioPiece]:
        while (piece := await self._anext()) is not None:
            yield piece

    async def aresult(self) -> SpeechResult:
        """:meth:`result` for asyncio."""
        while await self._anext() is not None:
            pass
        assert self._result is not None
        return self._result

    @property
    def finished(self) -> bool:
        """True once the request ended (completed, failed or cancelled) and every event was read."""
        return self._closed

    def result(self, timeout: float | None = None) -> SpeechResult:
        """Wait for the end and return the whole result (pieces not yet iterated included)."""
        while self._next(timeout) is not None:
            pass
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Abort the request: its T3 work and vocoder work are dropped at once."""
        self._cancel(self.request_id)
