"""Pipecat + Chorus: an LLM-like reply, streamed token by token through a Pipecat pipeline whose
TTS is a Chorus server, written to a WAV file.

    pip install 'chorus-tts[pipecat]'
    chorus serve --variant turbo --checkpoint ckpt/turbo --port 8000      # in another shell
    python examples/pipecat_tts.py --url http://localhost:8000 --out reply.wav

In a bot, the service goes between the LLM and the transport's output, e.g.
``Pipeline([transport.input(), stt, user_aggregator, llm, tts, transport.output(), assistant_aggregator])``;
when the user starts speaking, Pipecat's interruption cancels the turn on the server.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import wave

from pipecat.frames.frames import (
    EndFrame, LLMFullResponseEndFrame, LLMFullResponseStartFrame, LLMTextFrame, TTSAudioRawFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from chorus.integrations.pipecat import ChorusTTSService
from chorus.integrations.ws_client import StreamConfig

REPLY = "Sure! I can help with that. Your order shipped this morning, and it should arrive on Thursday."


class WavWriter(FrameProcessor):
    """The pipeline's end: TTS audio frames into a WAV file (a transport would play them)."""

    def __init__(self, path: str, sample_rate: int):
        super().__init__()
        self.wav = wave.open(path, "wb")
        self.wav.setnchannels(1)
        self.wav.setsampwidth(2)
        self.wav.setframerate(sample_rate)
        self.seconds = 0.0

    async def process_frame(self, frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.wav.writeframes(frame.audio)
            self.seconds += len(frame.audio) / 2 / frame.sample_rate
        await self.push_frame(frame, direction)


async def speak(args) -> float:
    tts = ChorusTTSService(base_url=args.url, api_key=args.api_key,
                           config=StreamConfig(model=args.model, voice=args.voice, seed=args.seed))
    writer = WavWriter(args.out, args.sample_rate)
    worker = PipelineWorker(Pipeline([tts, writer]), params=PipelineParams(audio_out_sample_rate=args.sample_rate),
                            enable_rtvi=False)

    @worker.event_handler("on_pipeline_started")
    async def on_started(worker, frame):
        # What an LLM service pushes: the reply's start, its tokens as they come, its end.
        tokens = [word + " " for word in args.text.split()]
        await worker.queue_frames([LLMFullResponseStartFrame(), *map(LLMTextFrame, tokens),
                                   LLMFullResponseEndFrame(), EndFrame()])

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()
    writer.wav.close()
    return writer.seconds


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://localhost:8000", help="the chorus server")
    parser.add_argument("--api-key", default=os.environ.get("CHORUS_API_KEY"), help="default: $CHORUS_API_KEY")
    parser.add_argument("--model", default="chatterbox-turbo")
    parser.add_argument("--voice", default="default")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--sample-rate", type=int, default=24_000, help="the pipeline's output rate")
    parser.add_argument("--text", default=REPLY)
    parser.add_argument("--out", default="reply.wav")
    args = parser.parse_args(argv)
    seconds = asyncio.run(speak(args))
    print(f"{seconds:.2f} s of speech -> {args.out}")
    return seconds


if __name__ == "__main__":
    main()
