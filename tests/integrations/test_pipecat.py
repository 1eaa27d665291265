"""The Pipecat service in Pipecat's own pipeline (PipelineWorker run by a WorkerRunner), against a
real server on loopback: LLM tokens in, TTSAudioRawFrames out, and an interruption stops the
interrupted turn's audio."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.integrations.conftest import INTERRUPTED_REPLY, KEY, LONG, REPLY, SHORT, import_framework, ws_turns

import_framework("pipecat.pipeline.worker", "pipecat.workers.runner")

from pipecat.frames.frames import (  # noqa: E402
    EndFrame, Frame, InterruptionFrame, LLMFullResponseEndFrame, LLMFullResponseStartFrame, LLMTextFrame,
    TTSAudioRawFrame, TTSStoppedFrame, TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.utils.text.base_text_aggregator import TextType  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from chorus.integrations.pipecat import ChorusTTSService  # noqa: E402

WAIT_S = 20.0


class FrameLog(FrameProcessor):
    """The pipeline's sink: every downstream frame, in order; ``wait_for`` wakes on each one."""

    def __init__(self):
        super().__init__()
        self.frames: list[Frame] = []
        self._arrived = asyncio.Condition()

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            async with self._arrived:
                self.frames.append(frame)
                self._arrived.notify_all()
        await self.push_frame(frame, direction)

    async def wait_for(self, predicate: Callable[[Frame], bool]) -> Frame:
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: any(map(predicate, self.frames))), WAIT_S)
        return next(f for f in self.frames if predicate(f))


def llm_reply(tokens: list[str], *, end: bool = True) -> list[Frame]:
    """What an LLM service pushes for one reply."""
    return [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in tokens),
            *([LLMFullResponseEndFrame()] if end else [])]


async def run_pipeline(server, script, *, config=SHORT, sample_rate: int = 24_000, word_timestamps: bool = True):
    """Run [ChorusTTSService, FrameLog] while ``script(worker, log, tts)`` queues frames, then end it;
    the log, what the script returned and how often the service connected."""
    tts = ChorusTTSService(base_url=server.url, api_key=KEY, config=config, word_timestamps=word_timestamps)
    connections = []

    @tts.event_handler("on_connected")
    async def _connected(tts):
        connections.append(tts)

    log = FrameLog()
    worker = PipelineWorker(Pipeline([tts, log]), params=PipelineParams(audio_out_sample_rate=sample_rate),
                            cancel_on_idle_timeout=False, enable_rtvi=False)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        started.set()

    async def drive():
        await asyncio.wait_for(started.wait(), WAIT_S)
        try:
            return await script(worker, log, tts)
        finally:
            await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    _, result = await asyncio.wait_for(asyncio.gather(runner.run(), drive()), 2 * WAIT_S)
    return log, result, len(connections)


def audio_of(log: FrameLog, turn: str) -> list[TTSAudioRawFrame]:
    return [f for f in log.frames if isinstance(f, TTSAudioRawFrame) and f.context_id == turn]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sample_rate", [24_000, 16_000])
def test_llm_tokens_become_audio_frames_at_the_pipeline_rate(server, sample_rate):
    async def script(worker, log, tts):
        await worker.queue_frames(llm_reply(REPLY))
        await log.wait_for(lambda f: isinstance(f, TTSStoppedFrame))

    log, _, _ = asyncio.run(run_pipeline(server, script, sample_rate=sample_rate))
    first = next(f for f in log.frames if isinstance(f, TTSAudioRawFrame))
    frames = audio_of(log, first.context_id)
    assert all(f.sample_rate == sample_rate and f.num_channels == 1 and len(f.audio) % 2 == 0 for f in frames)
    assert sum(len(f.audio) for f in frames) / 2 / sample_rate > 0.2  # several pieces of speech
    stopped = [f for f in log.frames if isinstance(f, TTSStoppedFrame)]
    assert [f.context_id for f in stopped] == [first.context_id]
    assert log.frames.index(stopped[0]) > log.frames.index(frames[-1])


@pytest.mark.timeout(60)
def test_an_interruption_cancels_the_turn_and_stops_its_audio(server):
    cancelled_before = ws_turns(server, "cancelled")

    async def script(worker, log, tts):
        await worker.queue_frames(llm_reply(INTERRUPTED_REPLY, end=False))  # the LLM is still talking
        first = await log.wait_for(lambda f: isinstance(f, TTSAudioRawFrame))
        assert server.pipeline.active_requests > 0, "the turn had no audio left to stop; make it longer"
        await worker.queue_frame(InterruptionFrame())  # what a user starting to speak sends
        interruption = await log.wait_for(lambda f: isinstance(f, InterruptionFrame))
        await worker.queue_frames(llm_reply(REPLY))  # the next reply, on the same connection
        await log.wait_for(lambda f: isinstance(f, TTSStoppedFrame) and f.context_id != first.context_id)
        # the server was told, not just the sink (its turns are handled in order: the cancel came
        # before the next reply's text), and not merely when the pipeline ends and the socket closes
        return first.context_id, log.frames.index(interruption), ws_turns(server, "cancelled")

    log, (interrupted, at, cancelled), connections = asyncio.run(run_pipeline(server, script, config=LONG))
    after = log.frames[at:]
    assert not [f for f in after if isinstance(f, TTSAudioRawFrame) and f.context_id == interrupted]
    assert [f for f in after if isinstance(f, TTSAudioRawFrame)], "the next reply is spoken"
    assert cancelled == cancelled_before + 1
    assert connections == 1  # no audio broke the protocol (the client checks each frame), no reconnect
    server.wait_idle()  # and its requests are gone: no KV block held


@pytest.mark.timeout(60)
def test_the_next_reply_reconnects_after_the_server_closed_an_idle_connection(idle_server):
    async def script(worker, log, tts):
        closed = asyncio.Event()

        @tts.event_handler("on_disconnected")
        async def _closed(tts):
            closed.set()

        await worker.queue_frames(llm_reply(REPLY))
        first = await log.wait_for(lambda f: isinstance(f, TTSStoppedFrame))
        await asyncio.wait_for(closed.wait(), WAIT_S)  # idle: the server closed it
        await worker.queue_frames(llm_reply(REPLY))
        await log.wait_for(lambda f: isinstance(f, TTSStoppedFrame) and f.context_id != first.context_id)

    log, _, connections = asyncio.run(run_pipeline(idle_server, script))
    turns = {f.context_id for f in log.frames if isinstance(f, TTSAudioRawFrame)}
    assert len(turns) == 2 and connections == 2


def speak_reply(server, **options) -> tuple[FrameLog, str]:
    """One reply through the pipeline, until its TTSStoppedFrame: the log and the turn's id."""
    async def script(worker, log, tts):
        await worker.queue_frames(llm_reply(REPLY))
        return (await log.wait_for(lambda f: isinstance(f, TTSStoppedFrame))).context_id

    log, turn, _ = asyncio.run(run_pipeline(server, script, **options))
    return log, turn


@pytest.mark.timeout(60)
def test_each_word_is_a_text_frame_at_its_presentation_time_inside_the_turns_audio(server):
    log, turn = speak_reply(server)
    words = [f for f in log.frames if isinstance(f, TTSTextFrame) and f.context_id == turn]
    assert [f.text for f in words] == "".join(REPLY).split()
    assert all(f.text_type == TextType.WORD and f.pts is not None for f in words)
    # the first word starts with the turn's first audio (its pts is that clock time); each later
    # one at its start after it, in order and inside the turn's audio
    seconds = sum(len(f.audio) for f in audio_of(log, turn)) / 2 / 24_000
    offsets = [(f.pts - words[0].pts) / 1e9 for f in words]
    assert offsets == sorted(offsets) and 0 < offsets[-1] < seconds


@pytest.mark.timeout(60)
def test_without_word_timestamps_the_text_comes_whole_after_its_audio(server):
    log, turn = speak_reply(server, word_timestamps=False)
    texts = [f for f in log.frames if isinstance(f, TTSTextFrame) and f.context_id == turn]
    assert texts and not [f for f in texts if f.text_type == TextType.WORD]
    assert " ".join(f.text.strip() for f in texts).split() == "".join(REPLY).split()
