"""The caller's end of one request in the pipeline: audio pieces in order, then a result."""
from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Iterator

import numpy as np

from chorus.pipeline.planner import SpeechPlan
from chorus.pipeline.errors import PipelineError
from chorus.pipeline.request import SpeechResult


@dataclass(frozen=True)
class AudioPiece:
    """The next samples of a request's audio (24 kHz float32), in order. ``chunk_index`` is the
    text chunk they belong to; ``final`` marks the request's last piece."""

    samples: np.ndarray
    chunk_index: int
    final: bool


_END = object()


class SpeechStream:
    """Iterate it (or ``async for`` it) for :class:`AudioPiece` objects, or call :meth:`result`
    for the whole waveform. A streaming request yields pieces while T3 is still generating; a
    non-streaming one yields its whole audio as one piece. Failures raise :class:`PipelineError`.
    Stopping early does not cancel the request: call :meth:`cancel` (the server does so when a
    client disconnects)."""

    def __init__(self, plan: SpeechPlan, cancel: Callable[[str], None]):
        self.plan = plan
        self.request_id = plan.request_id
        self._events: queue.Queue = queue.Queue()
        self._cancel = cancel
        self._result: SpeechResult | None = None
        self._error: PipelineError | None = None
        self._pieces: list[np.ndarray] = []
        self._closed = False

    # -- producer side (the pipeline's vocoder thread) ----------------------------------------
    def _put_audio(self, piece: AudioPiece) -> None:
        self._events.put(piece)

    def _finish(self, result: SpeechResult) -> None:
        self._events.put(result)
        self._events.put(_END)

    def _fail(self, error: PipelineError) -> None:
        self._events.put(error)
        self._events.put(_END)

    # -- consumer side -------------------------------------------------------------------------
    def _next(self, timeout: float | None) -> AudioPiece | None:
        """The next piece, or None at the end; raises the request's failure."""
        while True:
            if self._closed:
                if self._error is not None:
                    raise self._error
                return None
            try:
                event = self._events.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {self.request_id}: no audio within {timeout} s") from None
            if event is _END:
                self._closed = True
            elif isinstance(event, PipelineError):
                self._error = event
            elif isinstance(event, SpeechResult):
                self._result = event
            else:
                self._pieces.append(event.samples)
                return event

    def __iter__(self) -> Iterator[AudioPiece]:
        while (piece := self._next(None)) is not None:
            yield piece

    async def __aiter__(self) -> AsyncIterator[AudioPiece]:
        while (piece := await asyncio.to_thread(self._next, None)) is not None:
            yield piece

    def result(self, timeout: float | None = None) -> SpeechResult:
        """Wait for the end and return the whole result (pieces not yet iterated included)."""
        while self._next(timeout) is not None:
            pass
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Abort the request: its T3 work and vocoder work are dropped at once."""
        self._cancel(self.request_id)
